"""Whether each report is whole, and whose: one class per host or rank, after gather.

A report can be verified (its bytes came home, its hash matches) and still not be what the user
meant to profile. The classes, decided here from what the node's agent recorded in its result
(its reports and summaries, the run watch's per-sample process lists with ``own`` for the
wrapped command's own processes, and ``whose``: the user, and on Slurm the job, step, rank and
launcher) and from what came home:

* ``complete``: a whole report of a process that used the GPU (or of a run nobody saw on one);
* ``empty``: no GPU activity in the report, while the node saw the wrapped process on a GPU (a
  workload killed by a signal loses its CUDA activity: seen with nsys 2025.3 on an H200);
* ``truncated``: the report was cut (the disk filled while it was written), its session was cut
  (the profiler killed, the report finished from what it had collected), or its data was left
  unfinished;
* ``launcher-only``: the wrapped process never touched the GPU, while another process of the
  same user did (a worker that a launcher or a daemon started): the driver was wrapped;
* ``missing``: a host or rank that left no report.

Refused and stopped hosts ran nothing and have no class, nor has a Ray program's own line (its
driver, which is no rank and is never wrapped). Pure: the controller's, never shipped.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Iterable

from .agent.messages import AgentStatus, ProfileResult
from .statuses import HostStatus

if TYPE_CHECKING:
    from .plan import Plan
    from .store.manifest import HostEntry

COMPLETE, EMPTY, TRUNCATED, LAUNCHER_ONLY, MISSING = ("complete", "empty", "truncated",
                                                      "launcher-only", "missing")
CLASSES = (COMPLETE, EMPTY, TRUNCATED, LAUNCHER_ONLY, MISSING)
NO_REPORT_EXPECTED = (HostStatus.REFUSED, HostStatus.STOPPED, HostStatus.PLANNED,
                      HostStatus.PENDING)
# a Ray program's own line (fleet/slurm/raygather.py): not a rank, no report of its own
RAY_DRIVER = "(driver)"
KERNELS = "cuda_gpu_kern_sum"  # the summary that is empty when a report holds no GPU kernel
MAX_NAMED = 3

# What to do instead, said once a run has reports of the class.
ADVICE = {
    LAUNCHER_ONLY: "the profiled process never used the GPU, while the process named used it: "
                   "profile the worker, not its driver or launcher (with torchrun, mpirun or Ray "
                   "pass --launcher, and fleet wraps each worker; a worker started beforehand by a "
                   "daemon is profiled where it is started)",
    EMPTY: "the process was on the GPU but its report holds no GPU activity: a workload killed by "
           "a signal loses it; let it end on its own, or give --timeout, which nsys "
           "stops it at with its kernels kept",
    TRUNCATED: "the report is cut: give its node's report folder room (report_dir in "
               "the inventory) and run again",
}


@dataclass(frozen=True)
class Verdict:
    cls: str
    why: str | None = None


def classify(entry: "HostEntry", result: ProfileResult | None = None) -> Verdict | None:
    """The class of one host's or rank's report (of ``result`` where given: one of its reports
    alone, :func:`per_report`); None where none was to be made."""
    if entry.status in NO_REPORT_EXPECTED or entry.host == RAY_DRIVER:
        return None
    result = result or entry.answer
    if result is None:
        return _without_result(entry)
    if result.said in NO_REPORT_EXPECTED:
        return None
    if not result.reports:
        return _without_report(result)
    return _cut(result) or _whose(result, allows_own(entry.planned)) or Verdict(COMPLETE)


def _without_result(entry: "HostEntry") -> Verdict:
    """A Ray worker's class from its report alone (Ray's nsys, no agent beside it); else missing."""
    if entry.worker is not None:
        whole = [r for r in entry.reports if r.verified and r.status == "complete"]
        return Verdict(COMPLETE) if whole else Verdict(MISSING, entry.missing_why
                                                       or "its report did not come home")
    return Verdict(MISSING, entry.missing_why or "it left no result")


def _without_report(result: ProfileResult) -> Verdict:
    """A run that named no report: cut where its profiler failed or left its data
    unfinished, else missing."""
    # the agent's word for each leftover of nsys's data it could not finish
    unfinished = result.unfinished
    # the profiler failed mid-report (the disk full): cut
    if result.status == AgentStatus.PROFILER_ERROR:
        return Verdict(TRUNCATED, unfinished[-1] if unfinished
                       else "the profiler failed before its report was whole")
    if unfinished:
        return Verdict(TRUNCATED, unfinished[-1])
    return Verdict(MISSING, "; ".join(result.reasons) or "it left no report")


def _cut(result: ProfileResult) -> Verdict | None:
    """The run's reports are not whole: one says it is cut, the profiler failed mid-report, or it
    was killed and its report finished from what it had collected; None
    where none of these holds."""
    cut = [r.truncated for r in result.reports if r.truncated is not None]
    if cut:
        return Verdict(TRUNCATED, cut[0])
    # failed mid-report: never whole, whatever its files say
    if result.status == AgentStatus.PROFILER_ERROR:
        return Verdict(TRUNCATED,
                       "; ".join(result.reasons)
                       or "the profiler failed before its report was whole")
    killed = result.exit_status is not None and result.exit_status < 0
    if killed and any(r.finished_from_qdstrm for r in result.reports):
        return Verdict(TRUNCATED,
                       f"the profiler was killed (signal {-result.exit_status}): the report was "
                                  "finished from the data it had collected until then")
    return None


def _whose(result: ProfileResult, allow_own: bool) -> Verdict | None:
    """A whole report of the wrong process (launcher-only), or of one that was on the GPU and ran no
    kernel (empty); None where it is the workload's."""
    if (instead := used_instead(result, allow_own=allow_own)):
        return Verdict(LAUNCHER_ONLY, "used the GPU instead: " + instead)
    own, _ = gpu_processes(result)
    kernels = [s for s in result.summaries if s.summary == KERNELS]
    if own and kernels and all(s.size == 0 for s in kernels):
        return Verdict(EMPTY, f"no GPU kernel in the report, while {own[0]} was on the GPU")
    return None


def gpu_processes(result: ProfileResult, *, arrived_only: bool = False) -> tuple[list[str],
                                                                                 list[str]]:
    """The processes the run watch saw on the run's GPUs: the wrapped command's own, and the other
    processes of the same user (another user's are neighbours, not the workload's), named; with
    ``arrived_only``, of those others only the ones not there in the first look at their GPU."""
    own: dict[int, str] = {}
    others: dict[int, str] = {}
    first: dict[int | None, set[int]] = {}  # GPU -> the pids of its first sample
    for sample in result.samples:
        there_at_start = first.setdefault(sample.gpu, {p.pid for p in sample.processes})
        for p in sample.processes:
            named = f"pid {p.pid} ({p.name or '?'}, GPU {sample.gpu})"
            if p.own is True:
                own.setdefault(p.pid, named)
            elif (result.user is not None and p.user == result.user
                  and not (arrived_only and p.pid in there_at_start)):
                others.setdefault(p.pid, named)
    return list(own.values()), [v for k, v in others.items() if k not in own]


def allows_own(plan: "Plan | None") -> bool:
    """Whether a lab host's run was asked with --allow-own, as its plan says in its watch or its
    last-moment check; False without a plan (a Slurm rank)."""
    if plan is None:
        return False
    return any(part is not None and part.allow_own is True for part in (plan.watch, plan.recheck))


def used_instead(result: ProfileResult, *, allow_own: bool = False) -> str | None:
    """The processes that used the run's GPUs where the wrapped one never did (``launcher-only``),
    named; None where the wrapped process was on a GPU, or nobody of its user was. The one rule of
    the class and of the host's status (fleet.outcome), so a launcher-only report is never ``ok``:
    a process of the user's already on the GPU when the run began counts (a daemon's worker started
    beforehand), except under --allow-own (``allow_own``), which says the user's own processes
    there are theirs, beside the workload (another job of theirs beside a CPU-only workload)."""
    own, others = gpu_processes(result, arrived_only=allow_own)
    return ", ".join(others[:MAX_NAMED]) if others and not own else None


def line(entry: "HostEntry") -> str | None:
    """The host's class below its status, as ``whole:    launcher-only: ...``; None for complete."""
    verdict = classify(entry)
    if verdict is None or verdict.cls == COMPLETE:
        return None
    return f"whole:    {verdict.cls}" + (f": {verdict.why}" if verdict.why else "")


def per_report(entry: "HostEntry") -> list[Verdict]:
    """The class of each report an entry stands for: one per host or rank, and one per report where
    its agent made several: each rank's on a lab server whose launcher started the ranks under the
    host's one agent (fleet.wrapping.launchers), each window's (--repeat), each with its own
    summaries (named from its report)."""
    result = entry.answer
    if result is None or len(result.reports) < 2:
        verdict = classify(entry)
        return [verdict] if verdict is not None else []
    found = []
    for rep in result.reports:
        stem = rep.path.rsplit(".", 1)[0]
        own = tuple(s for s in result.summaries if s.path.startswith((stem + "_", stem + ".")))
        verdict = classify(entry, replace(result, reports=(rep,), summaries=own))
        found += [verdict] if verdict is not None else []
    return found


def run_lines(hosts: Iterable["HostEntry"]) -> list[str]:
    """The run's count of each class, and what to do instead where a class needs it."""
    counts: dict[str, int] = {}
    for entry in hosts:
        for verdict in per_report(entry):
            counts[verdict.cls] = counts.get(verdict.cls, 0) + 1
    if not counts:
        return []
    lines = ["reports: " + ", ".join(f"{counts[c]} {c}" for c in CLASSES if c in counts)]
    return lines + [f"  {c}: {ADVICE[c]}" for c in (LAUNCHER_ONLY, EMPTY, TRUNCATED) if c in counts]
