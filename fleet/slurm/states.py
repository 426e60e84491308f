"""What a job's Slurm state means for a run: pure rules, no I/O.

Two questions, each answered from Slurm's own words (its job reason codes,
doc/html/job_reason_codes.shtml, and its job states):

* a PENDING job's reason: one Slurm clears by itself (Priority, Resources, a
  group limit other jobs free), so fleet waits; or one it never clears, so the
  job can never start as submitted (:func:`never_starts`);
* how the job ended: a state that killed the ranks (NODE_FAIL, PREEMPTED,
  OUT_OF_MEMORY, TIMEOUT, BOOT_FAIL) makes a rank it killed not ``ok``, whatever
  its report says, and a requeue is said (:func:`job_end_verdict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from .. import outcome
from ..statuses import HostStatus

if TYPE_CHECKING:
    from ..store.manifest import HostEntry

# Reasons Slurm never clears by itself: the request exceeds a limit that applies to each job
# alone (not a sum other jobs free), names what it may not use, or waits on what will never be.
# Under EnforcePartLimits=NO (Slurm's default) sbatch accepts such a job and it pends forever.
NEVER_STARTS = (
    (re.compile(r"AccountNotAllowed"), "the partition does not allow the job's account"),
    (re.compile(r"QOSNotAllowed"), "the partition or association does not allow the job's QOS"),
    (re.compile(r"InvalidAccount|Job's account not known.*"),
     "the job's account is not known to Slurm"),
    (re.compile(r"InvalidQOS"), "the job's QOS is not known to Slurm"),
    (re.compile(r"PartitionTimeLimit"), "the job's time limit is above its partition's MaxTime"),
    (re.compile(r"(Assoc|QOS)Max\w*PerJob\w*"), "the job asks for more than one job may have"),
    (re.compile(r"(Assoc|QOS)Max\w*PerNode"),
     "the job asks for more on a node than one job may have"),
    (re.compile(r"QOSMin\w+"), "the job asks for less than its QOS requires of a job"),
    (re.compile(r"MaxMemPerLimit"), "the job asks for more memory per CPU or node than allowed"),
    (re.compile(r"BadConstraints"), "no node can satisfy the job's requirements"),
    (re.compile(r"DependencyNeverSatisfied"),
     "the job depends on a job that will never satisfy it"),
    (re.compile(r"ReservationDeleted"), "the job's reservation no longer exists"),
    (re.compile(r"DeadLine"), "the job can no longer meet its deadline"),
    (re.compile(r"JobHoldMaxRequeue"), "the job was requeued too often and is held"),
    (re.compile(r"JobHeldAdmin|launch failed requeued held"),
     "the job is held (its launch failed, or an admin held it); only `scontrol release` starts it"),
    (re.compile(r"ReqNodeNotAvail, UnavailableNodes:"),
     "the nodes the job asks for are not available, and Slurm names none that could come back"),
)

# Job states that ended the ranks from outside: a rank they stopped is not a complete profile.
KILLING = {
    "NODE_FAIL": "a node of the job failed",
    "PREEMPTED": "the job was preempted",
    "OUT_OF_MEMORY": "the job ran out of memory",
    "TIMEOUT": "the job was killed at its time limit",
    "BOOT_FAIL": "a node of the job failed to boot",
    "DEADLINE": "the job was killed at its deadline",
}


def never_starts(reason: str | None) -> str | None:
    """Why a PENDING job with this reason can never start as submitted, or None: Slurm may yet
    start it (Priority, Resources, a limit that other jobs' ending frees, a dependency, a begin
    time, a user's hold). "ReqNodeNotAvail" counts only with an empty list of unavailable nodes
    (a named node that is down, busy or reserved may come back)."""
    text = (reason or "").strip()
    for pattern, why in NEVER_STARTS:
        if pattern.fullmatch(text):
            return why
    return None


@dataclass(frozen=True)
class JobEnd:
    note: str | None                    # said on the run line and kept in the manifest
    # the ranks' entries, those the job's end killed no longer ok
    hosts: list


def _killed(entry: "HostEntry", stopped_by_fleet: bool) -> bool:
    """Whether the job's end stopped this rank: no result, or one that says it was stopped or
    that its workload did not exit 0 (a rank that had finished first is left as it is); not
    one fleet's own stop ended first (``stopped_by_fleet``: fleet stopped it ahead of the end)."""
    res = entry.answer
    if not entry.result or res is None:
        return True
    if stopped_by_fleet and outcome.stopped_by_fleet(res, True):
        return False
    if res.workload is not None and (res.workload.signal
                                     or res.workload.exit_status not in (None, 0)):
        return True
    return res.stopped and not stopped_by_fleet


def job_end_verdict(state: str | None, hosts: list, *, requeues: int = 0,
                    stopped_before_time_limit: bool = False,
                    stopped_by_fleet: bool = False) -> JobEnd:
    """The ranks' entries under the job's end state. NODE_FAIL, PREEMPTED, OUT_OF_MEMORY,
    TIMEOUT, BOOT_FAIL (and DEADLINE) are said; a rank they stopped is ``failed`` with the
    reason, its reports kept. At TIMEOUT a rank fleet's own stop ended ahead of the limit (its USR1
    trap, ``stopped_before_time_limit``; or Ctrl-C, ``stopped_by_fleet``) finished its report and
    stays as it was."""
    notes = []
    if requeues:
        notes.append(f"Slurm requeued the job {requeues} time(s): what was "
                     "gathered is from its last start")
    why = KILLING.get(state or "")
    out = list(hosts)
    if why:
        notes.insert(0, f"job ended {state}: {why}")
        fleet_stop = state == "TIMEOUT" and (stopped_before_time_limit or stopped_by_fleet)
        for i, entry in enumerate(out):
            if entry.status == HostStatus.OK and _killed(entry, fleet_stop):
                out[i] = replace(entry, status=HostStatus.FAILED,
                                 missing_why=f"killed by the job's end: {state} ({why}); "
                                             "its report is kept but does "
                                             "not cover the whole workload")
    return JobEnd("; ".join(notes) or None, out)


# The batch script's own checks (the agent's Python on the node; nsys on PATH for Ray) end the job
# with this status before anything starts, their reason the last line they write to the job's log,
# and leave the refusal mark (RunDir.JOB_REFUSED; fleet/slurm/launchers.py REFUSE).
REFUSED_EXIT = 127


def job_refusal(job_exit: int | None, log_tail: str, marked: bool) -> str | None:
    """Why the batch script started nothing, in its own one line (``fleet: ...``), or None. Only
    with its refusal mark (``marked``): a program that ends with 127 after a line of its own that
    begins ``fleet:`` is the program's failure, not a refusal. The log is the job's: only its last
    line, printable and bounded."""
    if job_exit != REFUSED_EXIT or not marked:
        return None
    lines = [line for line in log_tail.splitlines() if line.strip()]
    if not lines or not lines[-1].startswith("fleet: "):
        return ("the job's own check refused to start it (its reason is not "
                "the last line of the job's log)")
    return "".join(c if c.isprintable() else "?" for c in lines[-1][len("fleet: "):])[:400]


# srun's and the step daemon's own error lines: why a step never started (an MPI plugin the node
# lacks under MpiDefault=pmix, a GRES it cannot bind, ...).
SRUN_ERROR = re.compile(r"(srun|slurmstepd): (error|fatal): ")
SAID_LIMIT = 300


def srun_said(log_tail: str) -> str | None:
    """srun's first error line in the end of the job's log, or None. The log is the job's: the
    line is made printable and bounded."""
    for line in log_tail.splitlines():
        if SRUN_ERROR.match(line.strip()):
            return "".join(c if c.isprintable() else "?" for c in line.strip())[:SAID_LIMIT]
    return None


def why_missing(rank: int, state: str | None, log: str, refusal: str | None,
                log_tail: str = "") -> str:
    """Why a rank left no result: the script's refusal, the job's end state, else what srun said
    in the job's log (``log``, its name; ``log_tail``, its end as it came home)."""
    if refusal:  # the batch script's own check, before anything started
        return f"rank {rank} left no result: the job refused to start: {refusal}"
    if state == "CANCELLED":
        return f"rank {rank} left no result: the job was cancelled before it finished ({log})"
    if state == "TIMEOUT":
        return (f"rank {rank} left no result: killed at the time limit before "
                f"its report was finished ({log})")
    said = srun_said(log_tail)
    return (f"rank {rank} left no result (job {state or 'unknown'}; see {log})"
            + (f": srun said: {said}" if said else ""))


def no_gpus(partition: str, gres: tuple[str, ...], asked: str) -> str | None:
    """Why ``asked`` (ncu, GPU metrics: the GPU's counters) cannot run on ``partition``, whose
    nodes' GRES sinfo gave as ``gres`` (one line per configuration; ``(null)`` for none): none of
    them a GPU. None where one is, or sinfo said nothing (then sbatch and the job decide)."""
    names = {g.split(":", 1)[0].strip() for line in gres for g in line.split(",")}
    if not gres or "gpu" in names:
        return None
    return (f"{asked} on partition {partition}: its nodes have no GPU (sinfo's GRES: "
            f"{', '.join(gres)[:200]}), and it reads a GPU's counters: choose a partition "
            "with GPUs; nothing was submitted")
