"""Who holds a change fleet made to the node, and whether it still lives: an agent process (its
pid and start time, so a reused pid is not mistaken for a live holder) or a Slurm job (its
marker, made by the prolog and removed by the epilog).

Runs ON THE NODE (standard library, Python 3.8), for :mod:`owned`, whose state record lists the
holders of each change and puts back what only dead ones held.
"""

from __future__ import annotations

import os
import pwd
import time


def start_time(pid):
    """The process's start time in clock ticks, or None when it is gone."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def me():
    return {"pid": os.getpid(), "start": start_time(os.getpid()),
            "user": pwd.getpwuid(os.getuid()).pw_name}


JOB_GRACE = 300  # seconds a job's marker counts as alive before its slurmstepd is seen


def job_holder(job_id, jobs_dir):
    """A Slurm job as a holder: it lives while its marker (made by the prolog, removed by the
    epilog) exists, and either a slurmstepd of the job runs here or the marker is new."""
    return {"job": str(job_id), "marker": os.path.join(jobs_dir, str(job_id))}


def _job_running(job_id):
    prefix = "slurmstepd: [%s." % job_id
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/cmdline" % entry, "rb") as f:
                    if f.read(64).decode(errors="replace").startswith(prefix):
                        return True
            except OSError:
                continue
    return False


def alive(holder):
    if "job" in holder:
        try:
            age = time.time() - os.lstat(holder["marker"]).st_mtime
        except OSError:
            return False
        return age < JOB_GRACE or _job_running(holder["job"])
    return start_time(holder["pid"]) == holder.get("start")


def same(a, b):
    if "job" in a or "job" in b:
        return a.get("job") == b.get("job")
    return (a["pid"], a.get("start")) == (b["pid"], b.get("start"))
