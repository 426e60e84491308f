"""The node's processes as /proc shows them, and the few files the agent reads there.

Runs ON THE NODE (standard library, Python 3.8). The bottom of the agent's probe: the node's
document (:mod:`node`) and the GPUs' processes (:mod:`gpus`) both read processes through it.
"""

from __future__ import annotations

import os
import pwd

PID_NS_INIT = 0xEFFFFFFC  # inode of the initial pid namespace (PROC_PID_INIT_INO)


def read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def processes():
    """pid -> (name, uid) for every process this agent can see (see ``process``)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = process(int(entry))
            if found is not None:
                out[int(entry)] = found
    return out


def process(pid):
    """(name, uid) of one process, or None when it is gone or hidden.

    The kernel cuts ``comm`` to 15 characters, so nvidia-cuda-mps-control and
    nvidia-cuda-mps-server both read "nvidia-cuda-mps" (seen on an H200 test
    machine); for names that are cut, argv[0] from cmdline tells them apart.
    """
    comm = (read("/proc/%d/comm" % pid) or "").strip()
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None
    if len(comm) == 15:
        argv0 = (read("/proc/%d/cmdline" % pid) or "").split("\0")[0]
        if os.path.basename(argv0).startswith(comm):
            comm = os.path.basename(argv0)
    return comm, uid


def lineage(pid):
    """(parent pid, session id, start time in ticks) of one process, or None when it is gone."""
    text = read("/proc/%d/stat" % pid)
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return int(fields[1]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def host_pid_namespace():
    """NVML reports host pids: they only mean something in the host's namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == PID_NS_INIT
    except OSError:
        return None


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


def capabilities():
    status = read("/proc/self/status", "")
    m = re.search(r"^CapEff:\s*([0-9a-f]+)", status, re.M)
    eff = int(m.group(1), 16) if m else 0
    return {"effective": "%016x" % eff, "sys_admin": bool(eff >> CAP_SYS_ADMIN & 1),
            "perfmon": bool(eff >> CAP_PERFMON & 1)}


def nvidia_params():
    text = read("/proc/driver/nvidia/params")
    if text is None:
        return {"driver_loaded": os.path.exists("/proc/driver/nvidia"), "profiling_admin_only": None}
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
