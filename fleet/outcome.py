"""One outcome: what a host, a Slurm rank or a Ray worker did, decided in one place for every path.

A run's verdict covers the whole run: the agent's word, the workload's own exit, the
profiler's error lines, a newcomer the profiler yielded to, and whether every report came home
whole. Lab servers (:mod:`fleet.lab.profile`), Slurm ranks and Ray workers
(:mod:`fleet.slurm.run`), ``fleet gather`` and nightly all ask :func:`of_result`, and print
with :func:`detail_lines`; ``exitcodes.for_run`` turns these statuses into the run's exit status.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Iterable

from . import completeness
from .agent.messages import AgentStatus, Newcomer, ProfileResult
from .statuses import HostStatus, RunStatus
from .collection.fetch import is_summary
from .visible import visible

if TYPE_CHECKING:
    from .store.manifest import HostEntry, ReportEntry


def lost(reports: Iterable["ReportEntry"]) -> list["ReportEntry"]:
    """The one lost-report rule: a report (not a summary) that did not come home verified."""
    return [rep for rep in reports if not rep.verified and not is_summary(rep)]


# The signals fleet stops a run with: its USR1 trap's and fleet cancel's SIGTERM (scancel), Ctrl-C.
FLEET_STOP_SIGNALS = ("SIGTERM", "SIGINT")


def stopped_by_fleet(result: ProfileResult, fleet_stopped: bool = False) -> bool:
    """Whether fleet stopped this run: its agent saw the stop, or fleet recorded its stop before
    sending the signal (``fleet_stopped``: a Slurm job's stop marks) and the workload died by that
    signal. The record is there before the signal, so the verdict never depends on which the
    agent saw first, its own signal or its profiler's end."""
    if result.stopped:
        return True
    return (fleet_stopped and result.workload is not None
            and result.workload.signal in FLEET_STOP_SIGNALS)


def _workload_end(result: ProfileResult) -> tuple[int | None, str | None]:
    """The workload's exit status and the signal that killed it, from its record; from a result of
    an agent older than that record, from the profiler's exit status, which
    passes the workload's on."""
    if result.workload is not None:
        return result.workload.exit_status, result.workload.signal
    code = result.exit_status
    if code is not None and code > 128 and code - 128 in signal.Signals._value2member_map_:
        return None, signal.Signals(code - 128).name
    # below 0: the profiler itself was killed
    return (None if code is not None and code < 0 else code), None


def workload_said(result: ProfileResult, fleet_stopped: bool = False) -> str | None:
    """'the workload exited 3' or 'the workload was killed by SIGSEGV', or None when it ended well
    or fleet itself stopped it (its time limit, Ctrl-C, Slurm's end; :func:`stopped_by_fleet`)."""
    if stopped_by_fleet(result, fleet_stopped):
        return None
    code, sig = _workload_end(result)
    if sig:
        return f"the workload was killed by {sig}"
    if code is not None and code != 0:
        return f"the workload exited {code}"
    return None


def newcomer_said(newcomer: Newcomer) -> str:
    """Who arrived on the GPU mid-run, when, and what fleet did about it, in one phrase."""
    memory = newcomer.used_memory
    held = f"{memory / 2**30:.1f} GiB" if memory is not None and memory > 0 else None
    if newcomer.unseen:
        who = f"an unseen tenant ({held or 'GPU memory'} that no listed process holds)"
    else:
        who = (f"pid {newcomer.pid} "
               f"({', '.join(filter(None, [newcomer.user or 'unknown user', held]))})")
    text = f"{who} on GPU {newcomer.gpu}"
    if newcomer.appeared_s is not None:
        text += f", {newcomer.appeared_s:.1f} s after the profiler started"
    if newcomer.overlap_s is not None:
        text += f"; overlapped {newcomer.overlap_s:.1f} s"
    if newcomer.action:
        text += f"; {newcomer.action}"
    return text


# The agent's words that end a run before any report (its own reasons say why, else these).
NOTHING_RAN = {AgentStatus.REFUSED: (HostStatus.REFUSED, None),
               AgentStatus.STOPPED: (HostStatus.STOPPED,
                                     "told to stop before the profiler started"),
               # the profiler failed where no whole report can be made (the disk full)
               AgentStatus.PROFILER_ERROR: (HostStatus.PROFILER_ERROR, "the profiler failed")}


def of_result(result: ProfileResult | None, reports: list["ReportEntry"], *,
              tool: str | None = None,
              fleet_stopped: bool = False, allow_own: bool = False) -> tuple[str, str | None]:
    """(status, why) of a host or rank from its agent's result and what came home of it (and
    whether fleet recorded a stop of its run: :func:`stopped_by_fleet`; whether a lab host's run
    allowed the user's own processes: ``completeness.allows_own`` of its plan). A missing result is
    the caller's to name (unreachable, missing, failed): this decides the rest. The agent's words
    become a HostStatus here alone."""
    if result is None:
        return HostStatus.FAILED, "the agent gave no result"
    reasons = "; ".join(result.reasons) or None
    if result.status in NOTHING_RAN:
        status, otherwise = NOTHING_RAN[result.status]
        return status, reasons or otherwise
    if not result.made_reports:  # no-report, error, or an agent's word this fleet does not know
        return HostStatus.FAILED, reasons or str(result.said)
    if not result.reports:  # "ok" with nothing to bring home has not done its job
        return HostStatus.FAILED, reasons or "the agent said ok but named no report"
    return _of_reports(result, reports) or _of_run(result, tool, fleet_stopped, allow_own)


def _of_reports(result: ProfileResult, reports: list["ReportEntry"]) -> tuple[str, str] | None:
    """A lost or cut report's (status, why); None where every report came home whole."""
    gone = lost(reports)
    if gone:  # a summary that did not come home is recorded in its entry, and fails nothing
        return HostStatus.FAILED, "; ".join(rep.error or "not brought home" for rep in gone)
    cut = [r.truncated for r in result.reports if r.truncated is not None]
    if cut:  # there and hashed, but not whole: never a complete run
        return HostStatus.PROFILER_ERROR, f"the report is truncated: {cut[0]}"
    return None


def _of_run(result: ProfileResult, tool: str | None, fleet_stopped: bool,
            allow_own: bool) -> tuple[str, str | None]:
    """The status of a run whose reports came home whole: what happened while it ran."""
    if result.status == AgentStatus.YIELDED:
        return (HostStatus.YIELDED, "gave the GPU's counters back to "
                + newcomer_said(result.newcomer or Newcomer()))
    if (why := workload_said(result, fleet_stopped)):
        return HostStatus.WORKLOAD_FAILED, why
    errors = result.profiler_errors
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return (HostStatus.PROFILER_ERROR,
                f"{tool or 'the profiler'} reported an error: {errors[0]}{more}")
    # wrong process: the class's own rule
    if (instead := completeness.used_instead(result, allow_own=allow_own)):
        return (HostStatus.FAILED,
                f"the profiled process never used the GPU; {instead} did (launcher-only)")
    return HostStatus.OK, None


def run_status(host_statuses: Iterable[str]) -> RunStatus:
    """A run's status from its hosts' (or ranks'): complete when every one is ok; partial when some
    are; a word of its own when every host yielded or every workload failed; else failed."""
    statuses = list(host_statuses)
    if statuses and all(s == HostStatus.OK for s in statuses):
        return RunStatus.COMPLETE
    if any(s == HostStatus.OK for s in statuses):
        return RunStatus.PARTIAL
    if statuses and len(set(statuses)) == 1 and statuses[0] in (HostStatus.YIELDED,
                                                                HostStatus.WORKLOAD_FAILED):
        return RunStatus(statuses[0])
    return RunStatus.FAILED


def status_line(who: str, entry: "HostEntry", *, why: bool = True, indent: str = "") -> str:
    """A host's, rank's or worker's status line, as every path prints it (with its reason unless
    ``why`` is false): one line, whatever the node put in the reason."""
    return indent + visible(f"{who}: {entry.status}" + (f": {entry.missing_why}" if why
                                                        and entry.missing_why else ""))


def report_line(rep: "ReportEntry", *, hashes: bool = True) -> str:
    """One brought-home file, as every path prints it."""
    state = "verified" if rep.verified else f"NOT brought home: {rep.error}"
    if rep.status == "finished-from-qdstrm":
        state += ", finished from .qdstrm"
    if rep.status == "truncated":
        state += ", TRUNCATED: the disk filled while it was written"
    if is_summary(rep) and rep.status != "export" and rep.size == 0:
        state += ", empty: nothing of its kind was recorded"
    kind = "export: " if rep.status == "export" else "summary:" if is_summary(rep) else "report: "
    digest = f", sha256 {(rep.sha256 or '')[:12]}…" if hashes else ""
    return f"{kind}  {rep.stored} ({rep.size} bytes{digest}, {state})"


def detail_lines(entry: "HostEntry", *, indent: str = "  ", hashes: bool = True) -> list[str]:
    """What a host's or rank's outcome says below its status line: given up, notes, the workload,
    a newcomer, the profiler's errors, and every file brought home. Each is one line whatever the
    node put in it: a newline in a note is shown (``\\x0a``), never a line of fleet's own."""
    result = entry.answer or ProfileResult()
    lines = [f"gave up:  {g}" for g in entry.given_up]
    lines += [f"note:     {n}" for n in result.notes]
    if result.newcomer is not None and entry.status != HostStatus.YIELDED:
        lines.append(f"newcomer: {newcomer_said(result.newcomer)}")
    if (why := workload_said(result)) and entry.status != HostStatus.WORKLOAD_FAILED:
        lines.append(f"workload: {why}")
    lines += [f"error:    {e}" for e in result.profiler_errors[:5]]
    lines += [whole] if (whole := completeness.line(entry)) else []
    lines += [report_line(rep, hashes=hashes) for rep in entry.reports]
    return [indent + visible(line) for line in lines]
