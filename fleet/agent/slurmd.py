"""Slurm's Prolog, Epilog and TaskProlog: fleet's part on a compute node, run by slurmd as root.

Runs ON THE NODE (standard library plus the NVML binding, Python 3.8), from
the agent file ``fleet slurm install`` puts beside a root-owned config. No
Slurm command, no network, no PATH: everything comes from the environment
slurmd gives (job id, user, GPUs, working directory) and from the config.

A job opts in by having ``fleet-request.json`` in its working directory, as
``fleet profile --partition`` submits it (Slurm 22.05 gives the prolog no job
comment or name; the working directory it does give). Everything in that file
is written by the job's user and read by root, so:

* it is opened by a child process that has become the job's user, with
  O_NOFOLLOW, must be a regular file of that user, at most 64 KiB of JSON, and
  only known keys of known types are kept: root never reads what the user
  could not, and a planted symlink is not followed;
* it can only ask *whether*: which of the node's owned sysctls to hold (the
  values come from the config alone; a name the config does not own is
  ignored), and whether to pause DCGM where the config allows it;
* nothing it names is run as root: leftover ``.qdstrm`` files are finished by
  a child that has become the job's user;
* fleet's own files live in root-owned directories from the config.

Failure policy: a fleet error is logged (syslog and the config's log file)
and the script exits 0, because a non-zero Prolog or Epilog drains the node
and fleet's own fault must not take a node from everyone. With
``fail_closed: true`` a real node fault (an owned sysctl or DCGM that cannot be
put back, or one off the config's ``baseline_sysctls`` with its state record
lost) exits 1, so Slurm drains the node instead of running the next job on
a changed node.
"""

from __future__ import annotations

import glob
import json
import os
import select
import signal
import stat
import syslog
import time
from dataclasses import dataclass
from typing import Optional, Tuple

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
    import fleet_agent_gpus as nvml_gpus
    import fleet_agent_holders as holders
    import fleet_agent_node as node
    import fleet_agent_nodeconfig as nodeconfig
    import fleet_agent_owned as owned
    import fleet_agent_qdstrm as qdstrm
    import fleet_rundir as rundir
    import fleet_policy as policy
except ImportError:  # as part of the installed package
    from . import files, holders, node, nodeconfig, owned, qdstrm
    from . import gpus as nvml_gpus
    from .. import policy, rundir

REQUEST_NAME = rundir.RunDir.REQUEST  # in the job's working directory: its run folder
REQUEST_MAX = 65536
REQUEST_KEYS = {"fleet": int, "run_id": str, "tool": str, "sysctls": list, "pause_dcgm": bool,
                "allow_own": bool, "gpu_metrics": bool}
VERDICT_ENV = "FLEET_PROLOG_VERDICT"


@dataclass(frozen=True)
class JobRequest:
    """What a job asks of its node, read once from its request file (written by the job's user, read
    by root): only REQUEST_KEYS of their types; any other value reads as absent."""
    tool: Optional[str] = None
    sysctls: Tuple[str, ...] = ()
    pause_dcgm: bool = False
    allow_own: bool = False
    gpu_metrics: bool = False

    @classmethod
    def read(cls, doc):
        kept = {k: v for k, v in doc.items()
                if k in REQUEST_KEYS and isinstance(v, REQUEST_KEYS[k])}
        flags = {k: kept.get(k, False) for k in ("pause_dcgm", "allow_own", "gpu_metrics")}
        names = tuple(n for n in kept.get("sysctls", []) if isinstance(n, str))
        return cls(kept.get("tool"), names, **flags)

    def tool_or(self, default):  # the profiler the job asked for, else ``default``
        return self.tool if self.tool is not None else default


class NodeFault(Exception):
    """Node state fleet changed could not be put back."""


# --- what slurmd tells about the job (set by slurmd itself, not by the user) ---

def job_of(env):
    job_id, uid = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_UID", "")
    if not job_id.isdigit() or not uid.isdigit():
        raise nodeconfig.ConfigError("not run by slurmd: SLURM_JOB_ID "
                                     "and SLURM_JOB_UID are missing")
    # Slurm's ids, not NVML's
    gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES") or ""
    return {"id": job_id, "uid": int(uid), "gid": int(env.get("SLURM_JOB_GID") or uid),
            "gpus": tuple(int(g) for g in gpus.split(",") if g.strip().isdigit()) or None,
            "work_dir": env.get("SLURM_JOB_WORK_DIR") or ""}


# --- the job's request (untrusted) ---

def as_user(job, fn, timeout=30.0):
    """``fn()`` in a child that has become the job's user; its bytes back, or None. The child
    leads a process group of its own, which is killed whole at ``timeout`` and when it is done:
    nothing it started outlives it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns
        code = 1
        try:
            os.setpgid(0, 0)
            os.close(read_end)
            os.setgroups([])
            os.setgid(job["gid"])
            os.setuid(job["uid"])
            data = fn()
            if data is not None:
                os.write(write_end, data)
                code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    try:
        os.setpgid(pid, pid)  # also here: the group exists before anything is killed
    except OSError:
        pass
    os.close(write_end)
    chunks, deadline, timed_out = [], time.monotonic() + timeout, False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([read_end], [], [], left)[0]:
                timed_out = True
                break
            chunk = os.read(read_end, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(read_end)
        try:
            # whatever it left behind (or all of it, at the deadline)
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        _, status = os.waitpid(pid, 0)
    ok = not timed_out and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    return b"".join(chunks) if ok else None


def read_request(job):
    """The job's request (a JobRequest), and why it was ignored: (None, None)
    when the job did not opt in (no request file), (None, why) when its file was refused."""
    if not job["work_dir"].startswith("/"):
        return None, None
    path = rundir.RunDir(job["work_dir"]).request

    def read():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            return b"absent"
        except OSError as e:
            return ("refused: cannot open it as the job's user: %s" % e.strerror).encode()
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                return b"refused: not a regular file of the job's user"
            if st.st_size > REQUEST_MAX:
                return b"refused: larger than %d bytes" % REQUEST_MAX
            return b"request:" + os.read(fd, REQUEST_MAX)
        finally:
            os.close(fd)

    raw = as_user(job, read)
    if raw is None:
        return None, "could not read %s as the job's user" % path
    if raw == b"absent":
        return None, None
    if not raw.startswith(b"request:"):
        return None, "%s %s" % (path, raw.decode(errors="replace"))
    try:
        doc = json.loads(raw[len(b"request:"):].decode("utf-8"))
    except ValueError as e:
        return None, "%s refused: not JSON (%s)" % (path, e)
    except RecursionError:  # 64 KB of [[[[... is a valid size but nests past Python's stack
        return None, "%s refused: nested too deeply" % path
    if not isinstance(doc, dict):
        return None, "%s refused: not a JSON object" % path
    return JobRequest.read(doc), None


# --- fleet's own files (root-owned) ---

def job_dir(config, job):
    jobs = config["jobs_dir"]
    os.makedirs(jobs, mode=0o755, exist_ok=True)
    st = os.lstat(jobs)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise nodeconfig.ConfigError("%s must be a directory owned by root and "
                                     "writable by root alone" % jobs)
    return os.path.join(jobs, job["id"])


# --- the three entry points ---

def prolog(env, config):
    job = job_of(env)
    done = {"job": job["id"], "opted_in": False}
    try:
        repaired = owned.repair(config["state_dir"])  # what an earlier job left behind
    # a node whose state is unknown is not given to the next job
    except (owned.OwnedError, OSError) as e:
        raise NodeFault("could not put the node back before job %s: %s" % (job["id"], e))
    if repaired["restored"] or repaired["dcgm_resumed"]:
        done["repaired"] = repaired
    request, ignored = read_request(job)
    if request is None:
        # a request file that is there but refused: logged, and the job runs as if it had none
        if ignored:
            done.update(opted_in=True, ignored_request=ignored)
        return done  # not opted in: one file look-up, nothing else
    done["opted_in"] = True
    marker = job_dir(config, job)
    os.makedirs(marker, mode=0o755, exist_ok=True)
    os.utime(marker)
    # Who is on the job's GPUs as root sees them; the job's ranks read this before ncu.
    procs = node.processes()
    nvml, gpus = nvml_gpus.gpus(procs, job["uid"])
    mps, dcgm = node.daemons(procs)
    state = policy.NodeState.read({"gpus": gpus, "mps": mps, "dcgm": dcgm,
                                   "host_pid_namespace": node.host_pid_namespace()})
    indices = policy.job_gpu_indices(job["gpus"], state.gpus)
    seen = policy.Request(gpus=indices, allow_own=request.allow_own, job=job["id"])
    verdict = {"job": job["id"], "gpus": job["gpus"], "nvml": nvml.get("available"),
               "checked": time.time(),
               "tenants": [str(t) for t in policy.tenants(state, seen)]
               + policy.unseen_tenants(state, seen),
               "by_gpu": tenants_by_gpu(state, seen), "dcgm": None}
    holder = holders.job_holder(job["id"], config["jobs_dir"])
    wanted = {n: config["owned_sysctls"][n] for n in request.sysctls
              if n in config["owned_sysctls"]}
    done["ignored_sysctls"] = [n for n in request.sysctls if n not in config["owned_sysctls"]]
    if wanted:
        try:
            done["sysctls"] = owned.acquire_sysctls(wanted, config["owned_sysctls"], holder,
                                                    config["state_dir"],
                                                    baselines=config["baseline_sysctls"])
        except owned.LostRecord as e:
            raise NodeFault("job %s: %s" % (job["id"], e))
    chosen = policy.chosen_gpus(state, seen)
    counters = policy.uses_counters(request.tool_or(""), request.gpu_metrics)
    if policy.dcgm_pause(state, chosen, request.pause_dcgm
                         and config["pause_dcgm"] is True, counters):
        owned.pause_dcgm(holder, config["state_dir"])
        done["dcgm"] = verdict["dcgm"] = "paused"
    # Last: it says what was done. Readable by the job's ranks, which plan
    # with it as the job's user.
    files.write_private(os.path.join(marker, "verdict.json"), json.dumps(verdict), mode=0o644)
    done["tenants"] = verdict["tenants"]
    return done


def tenants_by_gpu(state, seen):
    """Each of the job's GPUs (by UUID, as a rank finds its own) and who else is on it: a rank
    of a job with one GPU per task is refused only for tenants on its own GPU."""
    out = {}
    for g in policy.chosen_gpus(state, seen):
        if g.uuid:
            one = policy.Request(gpus=(g.index,), allow_own=seen.allow_own, job=seen.job)
            out[g.uuid] = [str(t)
                           for t in policy.tenants(state, one)] + policy.unseen_tenants(state, one)
    return out


def epilog(env, config):
    job = job_of(env)
    holder = holders.job_holder(job["id"], config["jobs_dir"])
    marker = os.path.join(config["jobs_dir"], job["id"])
    done = {"job": job["id"]}
    try:
        done["released"] = owned.release(holder, config["state_dir"])
        done["repaired"] = owned.repair(config["state_dir"])  # what other jobs that died left
    except (owned.OwnedError, OSError) as e:
        raise NodeFault("could not put the node back after job %s: %s" % (job["id"], e))
    if os.path.isdir(marker) and not os.path.islink(marker):
        request, _ = read_request(job)
        if request and request.tool_or("nsys") == "nsys":
            done["finished"] = finish_leftovers(job, config)
        for name in os.listdir(marker):
            os.unlink(os.path.join(marker, name))
        os.rmdir(marker)
        # The job's record gone with a changed value left on the node: the next job would get it.
        lost = owned.off_baseline(config["baseline_sysctls"], config["state_dir"])
        if lost:
            raise NodeFault("after job %s: %s" % (job["id"], lost))
    return done


def finish_leftovers(job, config):
    """Reports nsys left unfinished under the job's directory (also where an importer killed while
    writing the report left it empty), finished by the job's user with the importer the node's
    config names, never one the job chose, all of it within the config's ``finish_timeout``."""
    importer = config["qdstrm_importer"] or qdstrm.installed_importer()
    why = (files.root_owned_problem(importer) if importer
           else "no QdstrmImporter installed under /opt/nvidia")
    if why:
        return ["unfinished reports left as they are: %s" % why]
    budget = float(config["finish_timeout"])
    started = time.monotonic()

    def finish():
        notes = []
        for leftover in glob.glob(rundir.RunDir(glob.escape(job["work_dir"])).node("*").file(
            "*.qdstrm")):
            report = leftover[: -len(".qdstrm")] + ".nsys-rep"
            left = budget - (time.monotonic() - started)
            if left < 1:
                notes.append("not finished, out of time: %s" % leftover)
                continue
            if os.path.exists(report) and os.path.getsize(report) == 0:
                os.unlink(report)
            if not os.path.exists(report):
                qdstrm.finish_qdstrm(importer, leftover, notes, timeout=left, own_group=False)
        return json.dumps(notes).encode()

    out = as_user(job, finish, timeout=budget + 5)
    return (json.loads(out) if out
            else ["finishing unfinished reports failed or ran out of time (%d s)" % budget])


def task_prolog(env, config):
    """Lines slurmd turns into the job's environment: where the prolog's verdict is.
    (slurmd runs the TaskProlog as the job's user, so it only reads.)"""
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        raise nodeconfig.ConfigError("not run by slurmd: SLURM_JOB_ID is missing")
    verdict = os.path.join(config["jobs_dir"], job_id, "verdict.json")
    return ["export %s=%s" % (VERDICT_ENV, verdict)] if os.path.exists(verdict) else []


# --- running under slurmd ---

def log(config, level, message):
    line = "fleet slurm: %s" % message
    syslog.openlog("fleet", syslog.LOG_PID, syslog.LOG_DAEMON)
    syslog.syslog(level, line)
    try:
        os.makedirs(os.path.dirname(config["log_file"]), mode=0o755, exist_ok=True)
        fd = os.open(config["log_file"], os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW,
                     0o644)
        with os.fdopen(fd, "a") as f:
            f.write("%s %s\n" % (time.strftime("%Y-%m-%dT%H:%M:%S"), line))
    except OSError:
        pass  # syslog has it


def hook_call(args):
    """(op, config path) of the hook's call, as `fleet slurm install` wrote them, read once: a value
    not a string reads as absent (no op; the default config)."""
    op, config = (v if isinstance(v, str) else None for v in (args.get("op"), args.get("config")))
    return op, config or "/etc/fleet/node.json"


def main(args, env=None):
    """One JSON line for the log; exit 0 unless fail_closed and the node could not be put back."""
    env = os.environ if env is None else env
    op, config_path = hook_call(args)
    if op == "check":  # `fleet slurm install`: this Python runs the hooks' code (it got this far)
        import sys
        print(json.dumps({"python": "%d.%d.%d" % tuple(sys.version_info[:3])}))
        return 0 if sys.version_info >= (3, 8) else 3
    config = dict(nodeconfig.DEFAULTS)
    try:
        config = nodeconfig.load_config(config_path)
        if op == "task-prolog":
            for line in task_prolog(env, config):
                print(line)
            return 0
        done = {"prolog": prolog, "epilog": epilog}[op](env, config)
        if done.get("opted_in", True):
            log(config, syslog.LOG_INFO, "%s %s" % (op, json.dumps(done, sort_keys=True)))
        return 0
    except NodeFault as e:
        log(config, syslog.LOG_ERR, "%s: NODE FAULT: %s" % (op, e))
        return 1 if config.get("fail_closed") is True else 0
    except Exception as e:  # fleet's own fault: logged, and the node stays in service
        log(config, syslog.LOG_ERR,
            "%s failed (node left in service): %s: %s" % (op, type(e).__name__, e))
        return 0

