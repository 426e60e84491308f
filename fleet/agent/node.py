"""fleet's node agent: everything fleet needs to know about one node, as JSON (the document
``policy.nodestate.NodeState.read`` reads).

This file runs ON THE NODE, sent over the transport with the NVML binding
(``pynvml`` from nvidia-ml-py) and run by the node's own ``python3``:
nothing is installed there. So: standard library only (plus pynvml, loaded
only when the NVIDIA library is present), Python 3.8 syntax, and no section may
crash the whole probe: each failure becomes a value in the document.
"""

from __future__ import annotations

import glob
import os
import platform
import re
import shutil
import socket
import stat
import subprocess
import sys
import time
from dataclasses import dataclass

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_gpus as nvml_gpus
    import fleet_agent_toolversions as toolversions
    from fleet_agent_procs import host_pid_namespace, processes, read, user_name
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files, toolversions
    from . import gpus as nvml_gpus
    from .procs import host_pid_namespace, processes, read, user_name

AGENT_VERSION = 1
CAP_SYS_ADMIN, CAP_PERFMON = 21, 38
DCGM_PORTS = {5555: "nv-hostengine", 9400: "dcgm-exporter"}
MPS_NAMES = ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server")
DCGM_NAMES = ("nv-hostengine", "dcgm-exporter")
TOOL_TIMEOUT = 20.0
PROFILERS = ("nsys", "ncu")
MEMORY_FS = ("tmpfs", "ramfs")  # file systems whose files are held in memory


def section(fn, *args):
    """Run one collector; a failure becomes ``{"error": ...}`` instead of a crash."""
    try:
        return fn(*args)
    except Exception as e:  # the probe must always return a document
        return {"error": "%s: %s" % (type(e).__name__, e)}


# --- the machine ---

def container():
    if os.path.exists("/.dockerenv"):
        return "docker"
    if os.path.exists("/run/.containerenv"):
        return "podman"
    if os.environ.get("container"):
        return os.environ["container"]
    cgroup = read("/proc/1/cgroup", "")
    for word in ("kubepods", "docker", "containerd", "lxc", "libpod"):
        if word in cgroup:
            return word
    if os.environ.get("SINGULARITY_CONTAINER") or os.environ.get("APPTAINER_CONTAINER"):
        return "apptainer"
    return None


def capabilities() -> dict:
    status = read("/proc/self/status", "")
    m = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    eff = int(m.group(1), 16) if m else 0
    return {"effective": "%016x" % eff, "sys_admin": bool(eff >> CAP_SYS_ADMIN & 1),
            "perfmon": bool(eff >> CAP_PERFMON & 1)}


def nvidia_params() -> dict:
    text = read("/proc/driver/nvidia/params")
    if text is None:
        return {"driver_loaded": os.path.exists("/proc/driver/nvidia"),
                "profiling_admin_only": None}
    m = re.search(r"^RmProfilingAdminOnly:\s*(\d+)", text, re.M)
    return {"driver_loaded": True, "profiling_admin_only": int(m.group(1)) if m else None}


def listeners(ports):
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in (read(table, "") or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A":  # LISTEN
                port = int(fields[1].rsplit(":", 1)[1], 16)
                if port in ports:
                    found.add(port)
    return sorted(found)


def daemons(procs) -> tuple[dict, dict]:
    named = lambda names: sorted(pid for pid, (comm, _) in procs.items() if comm in names)
    mps = named(MPS_NAMES)
    return ({"control_daemon": [p for p in mps if procs[p][0] == MPS_NAMES[0]],
             "servers": [p for p in mps if procs[p][0] == MPS_NAMES[1]],
             "pipe_directory": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")},
            {"hostengine": [p for p in named(DCGM_NAMES) if procs[p][0] == DCGM_NAMES[0]],
             "exporter": [p for p in named(DCGM_NAMES) if procs[p][0] == DCGM_NAMES[1]],
             "listening": [{"port": p, "usual_owner": DCGM_PORTS[p]}
                           for p in listeners(set(DCGM_PORTS))]})


# --- profilers ---

def candidates(tool, override):
    if override:
        yield override, "inventory"
    path = shutil.which(tool)
    if path:
        yield path, "PATH"
    patterns = {"nsys": ["/opt/nvidia/nsight-systems/*/bin/nsys", "/usr/local/cuda/bin/nsys",
                         "/usr/local/cuda-*/bin/nsys",
                         "/opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys"],
                "ncu": ["/usr/local/cuda/bin/ncu", "/usr/local/cuda-*/bin/ncu",
                        "/opt/nvidia/nsight-compute/*/ncu"]}
    for pattern in patterns[tool]:
        for path in sorted(glob.glob(pattern), key=version_key, reverse=True):
            yield path, pattern


def version_key(path):
    return [int(x) for x in re.findall(r"\d+", path)]


def find_tool(tool, override) -> dict | None:
    for path, source in candidates(tool, override):
        if os.path.isfile(path) and os.access(path, os.X_OK):
            found: dict = {"path": os.path.realpath(path), "found_by": source}
            changeable = changeable_by_others(found["path"])
            if changeable:
                found["writable_by_others"] = changeable
            return found
    return None


def changeable_by_others(path):
    """Why an account other than root and this one could change the program at ``path`` (it, or a
    folder above it, is theirs or writable by them), or None. As root, such a program is code
    another user chose."""
    me = os.geteuid()
    while True:
        try:
            st = os.stat(path)
        except OSError:
            return None
        sticky = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        if st.st_uid not in (0, me):
            return "%s belongs to uid %d" % (path, st.st_uid)
        if st.st_mode & 0o002 and not sticky:
            return "%s is writable by every account" % path
        if st.st_mode & 0o020 and st.st_gid != 0 and not sticky:
            return "%s is writable by group %d" % (path, st.st_gid)
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


class ToolQuestions:
    """The profilers found, their ``--version`` (and ``nsys status -e``) asked at once and
    answered later: the probe asks them first, and NVML is read while they run."""

    def __init__(self, overrides, environment_check=True, versions=PROFILERS):
        self.found = {t: find_tool(t, overrides.get(t)) for t in PROFILERS}
        self.runs = {}
        # as root, a program another account can change is not run, not even for --version
        if os.geteuid() == 0:
            unsafe = {t for t, info in self.found.items()
                      if info and info.get("writable_by_others")}
        else:
            unsafe = set()
        # ask every binary at once: nsys status -e takes a while; a profiler whose version nobody
        # reads (a run of the other one, the live look) is found, not started, and one whose
        # answer is kept for this very program file is not asked again
        self._ask_versions([t for t, info in self.found.items()
                            if info and t not in unsafe and t in versions], fresh=environment_check)
        if self.found["nsys"] and environment_check and "nsys" not in unsafe:
            self.runs[("nsys", "status")] = _start([self.found["nsys"]["path"], "status", "-e"])

    def _ask_versions(self, tools, fresh):
        """Start each of ``tools`` for its --version, but those whose answer is kept for this very
        program file (``fresh``, doctor: none; a program others could change: never kept)."""
        self.kept, self.keys = toolversions.Kept(), {}
        for t in tools:
            info = self.found[t]
            path = info["path"]
            changeable = info.get("writable_by_others")
            self.keys[t] = None if changeable else toolversions.program_key(path)
            text = None if fresh else self.kept.answer(t, self.keys[t])
            if text is not None:
                _say_version(info, text)
            else:
                self.runs[(t, "version")] = _start([path, "--version"])

    def answers(self) -> dict:
        found = self.found
        for (t, what), proc in self.runs.items():
            out = _finish(proc)
            if what == "status":
                found[t]["status"] = parse_status(out)
            elif (_say_version(found[t], out) and getattr(proc, "returncode", None) == 0
                  and toolversions.program_key(found[t]["path"]) == self.keys[t]):
                # only a whole answer that names a version, of the program still there as it was
                self.kept.keep(t, self.keys[t], out)
        self.kept.close()
        return found


def _say_version(info, text):
    """A profiler's answer to --version in what the probe says of it; whether it named a version
    (absent where it was not asked: read as unknown)."""
    m = re.search(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)", text)
    info["version"] = m.group(1) if m else None
    info["version_text"] = text.strip()[-200:]
    return m is not None


def _start(argv):
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    except OSError as e:
        return e


def _finish(proc):
    if isinstance(proc, OSError):
        return "cannot run: %s" % proc
    try:
        out, _ = proc.communicate(timeout=TOOL_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out.decode("utf-8", "replace")


def parse_status(text):
    """``nsys status -e``: 'Key: OK/Fail' and 'Key = value' lines, as a mapping."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^\s*([^:=]+?)\s*(?::|=)\s*(.+?)\s*$", line)
        if m:
            out[m.group(1)] = m.group(2)
    return out


# --- where reports go ---

def report_dir(path) -> dict:
    path = os.path.expanduser(path or "/var/tmp/fleet-%s" % user_name(os.getuid()))
    probe = path
    while not os.path.exists(probe) and probe != os.path.dirname(probe):
        probe = os.path.dirname(probe)
    st = os.statvfs(probe)
    fstype = mount_type(os.path.realpath(probe))
    return {"path": path, "exists": os.path.isdir(path),
            "writable": os.access(probe, os.W_OK | os.X_OK),
            "free_bytes": st.f_bavail * st.f_frsize, "fstype": fstype,
            "memory_backed": fstype in MEMORY_FS, "unsafe": files.problem(path)}


def mount_type(path):
    best, fstype = "", None
    for line in (read("/proc/self/mountinfo", "") or "").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 4:
            mnt = fields[4].replace("\\040", " ")
            if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, fstype = mnt, right.split()[0] if right else None
    return fstype


# --- the document ---

@dataclass(frozen=True)
class ProbeArgs:
    """A probe call's arguments, read once (the controller's, a Slurm task's, the live look's):
    whose processes are the user's own (``owner_uid``: the agent's uid unless said), the profilers'
    paths the inventory gives, whether nsys checks its environment (nsys status -e), the report
    folder to look at, and the profilers whose ``--version`` to ask (``versions``: both unless
    said). A value not of its kind reads as absent: the default."""
    owner_uid: int
    tools: dict
    environment_check: bool = True
    report_dir: str | None = None
    versions: tuple = PROFILERS

    @classmethod
    def read(cls, args):
        uid, tools, check = args.get("owner_uid"), args.get("tools"), args.get("environment_check")
        tools = tools if isinstance(tools, dict) else {}
        report_dir, versions = args.get("report_dir"), args.get("versions")
        return cls(uid if isinstance(uid, int) and not isinstance(uid, bool) else os.getuid(),
                   {t: path for t, path in tools.items() if isinstance(path, str)},
                   check if isinstance(check, bool) else True,
                   report_dir if isinstance(report_dir, str) else None,
                   tuple(t for t in PROFILERS if t in versions)
                   if isinstance(versions, (list, tuple)) else PROFILERS)


def probe(args) -> dict:
    started = time.monotonic()
    args = ProbeArgs.read(args)
    owner_uid = args.owner_uid
    # The profilers answer --version while NVML is read: each takes tens of milliseconds.
    asked = section(ToolQuestions, args.tools, args.environment_check, args.versions)
    procs = processes()
    try:
        nvml, gpu_list = nvml_gpus.gpus(procs, owner_uid)
    except Exception as e:  # an NVML call that fails mid-way is a state, not a crash
        nvml, gpu_list = {"available": False, "error": "%s: %s" % (type(e).__name__, e)}, []
    mps, dcgm = daemons(procs)
    perf = read("/proc/sys/kernel/perf_event_paranoid")
    return {
        "agent": AGENT_VERSION,
        "host": socket.gethostname(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "uid": os.getuid(), "gid": os.getgid(), "euid": os.geteuid(),
        "user": user_name(os.getuid()), "owner_uid": owner_uid,
        "container": section(container),
        "host_pid_namespace": host_pid_namespace(),
        "slurm_job": os.environ.get("SLURM_JOB_ID"),
        "capabilities": section(capabilities),
        "perf_event_paranoid": int(perf) if perf and perf.strip().lstrip("-").isdigit() else None,
        "nvidia": section(nvidia_params),
        "nvml": nvml, "gpus": gpu_list, "mps": mps, "dcgm": dcgm,
        "tools": section(asked.answers) if isinstance(asked, ToolQuestions) else asked,
        "report_dir": section(report_dir, args.report_dir),
        "elapsed_ms": round((time.monotonic() - started) * 1000, 1),
    }


def main(args):
    try:  # shipped under a flat name
        import fleet_agent_wire as wire
    except ImportError:  # as part of the installed package
        from . import wire
    sys.stdout.write(wire.frame("probe", probe(args)))
    return 0
