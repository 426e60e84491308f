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
from .statuses import HostStatus, RunStatus
from .store.collect import is_summary
from .visible import visible

if TYPE_CHECKING:
    from .store.manifest import HostEntry, ReportEntry


# The agent's words for its result (fleet/agent/wire.py), read into a HostStatus here alone (of_result).
AGENT_OK, AGENT_YIELDED, AGENT_REFUSED, AGENT_STOPPED, AGENT_PROFILER_ERROR = \
    "ok", "yielded", "refused", "stopped", "profiler-error"


def made_reports(result: dict) -> bool:
    """Whether the agent's result says it made reports to bring home (it ran, or yielded mid-run)."""
    return result.get("status") in (AGENT_OK, AGENT_YIELDED)


def lost(reports: Iterable["ReportEntry"]) -> list["ReportEntry"]:
    """The one lost-report rule: a report (not a summary) that did not come home verified."""
    return [rep for rep in reports if not rep.verified and not is_summary(rep)]


# The signals fleet stops a run with: its USR1 trap's and fleet cancel's SIGTERM (scancel), Ctrl-C.
FLEET_STOP_SIGNALS = ("SIGTERM", "SIGINT")


def stopped_by_fleet(result: dict, fleet_stopped: bool = False) -> bool:
    """Whether fleet stopped this run: its agent saw the stop, or fleet recorded its stop before
    sending the signal (``fleet_stopped``: a Slurm job's stop marks) and the workload died by that
    signal. The record is there before the signal, so the verdict never depends on which the
    agent saw first, its own signal or its profiler's end."""
    if result.get("stopped"):
        return True
    workload = result.get("workload")
    return fleet_stopped and isinstance(workload, dict) and workload.get("signal") in FLEET_STOP_SIGNALS


def workload_said(result: dict, fleet_stopped: bool = False) -> str | None:
    """'the workload exited 3' or 'the workload was killed by SIGSEGV', or None when it ended well
    or fleet itself stopped it (its time limit, Ctrl-C, Slurm's end; :func:`stopped_by_fleet`)."""
    if stopped_by_fleet(result, fleet_stopped):
        return None
    workload = result.get("workload")
    if isinstance(workload, dict):
        code, sig = workload.get("exit_status"), workload.get("signal")
    else:  # an agent older than the workload record: the profiler passes the workload's status on
        code, sig = result.get("exit_status"), None
        if isinstance(code, int) and code > 128 and code - 128 in signal.Signals._value2member_map_:
            code, sig = None, signal.Signals(code - 128).name
        elif isinstance(code, int) and code < 0:  # the profiler itself died by a signal, not the workload
            code = None
    if sig:
        return f"the workload was killed by {sig}"
    if isinstance(code, int) and code != 0:
        return f"the workload exited {code}"
    return None


def newcomer_said(newcomer: dict) -> str:
    """Who arrived on the GPU mid-run, when, and what fleet did about it, in one phrase."""
    memory = newcomer.get("used_memory")
    held = f"{memory / 2**30:.1f} GiB" if isinstance(memory, int) and memory > 0 else None
    if newcomer.get("unseen"):
        who = f"an unseen tenant ({held or 'GPU memory'} that no listed process holds)"
    else:
        who = f"pid {newcomer.get('pid')} ({', '.join(filter(None, [newcomer.get('user') or 'unknown user', held]))})"
    when = newcomer.get("appeared_s")
    text = f"{who} on GPU {newcomer.get('gpu')}"
    if isinstance(when, (int, float)):
        text += f", {when:.1f} s after the profiler started"
    overlap = newcomer.get("overlap_s")
    if isinstance(overlap, (int, float)):
        text += f"; overlapped {overlap:.1f} s"
    if newcomer.get("action"):
        text += f"; {newcomer['action']}"
    return text


def of_result(result: dict | None, reports: list["ReportEntry"], *, tool: str | None = None,
              fleet_stopped: bool = False, allow_own: bool = False) -> tuple[str, str | None]:
    """(status, why) of a host or rank from its agent's result and what came home of it (and
    whether fleet recorded a stop of its run: :func:`stopped_by_fleet`; whether a lab host's run
    allowed the user's own processes: ``completeness.allows_own`` of its plan). A missing result is
    the caller's to name (unreachable, missing, failed): this decides the rest."""
    if result is None:
        return HostStatus.FAILED, "the agent gave no result"
    said = result.get("status")
    reasons = "; ".join(result.get("reasons") or []) or None
    if said == AGENT_REFUSED:
        return HostStatus.REFUSED, reasons
    if said == AGENT_STOPPED:
        return HostStatus.STOPPED, reasons or "told to stop before the profiler started"
    if said == AGENT_PROFILER_ERROR:  # the profiler failed where no whole report can be made (the disk full)
        return HostStatus.PROFILER_ERROR, reasons or "the profiler failed"
    if not made_reports(result):  # no-report, error, or an agent's word this fleet does not know
        return HostStatus.FAILED, reasons or str(said)
    if not result.get("reports"):  # "ok" with nothing to bring home has not done its job
        return HostStatus.FAILED, reasons or "the agent said ok but named no report"
    gone = lost(reports)
    if gone:  # a summary that did not come home is recorded in its entry, and fails nothing
        return HostStatus.FAILED, "; ".join(rep.error or "not brought home" for rep in gone)
    cut = [r["truncated"] for r in result["reports"] if isinstance(r, dict) and isinstance(r.get("truncated"), str)]
    if cut:  # there and hashed, but not whole: never a complete run
        return HostStatus.PROFILER_ERROR, f"the report is truncated: {cut[0]}"
    if said == AGENT_YIELDED:
        return HostStatus.YIELDED, "gave the GPU's counters back to " + newcomer_said(result.get("newcomer") or {})
    if (why := workload_said(result, fleet_stopped)):
        return HostStatus.WORKLOAD_FAILED, why
    errors = result.get("profiler_errors") or []
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return HostStatus.PROFILER_ERROR, f"{tool or 'the profiler'} reported an error: {errors[0]}{more}"
    if (instead := completeness.used_instead(result, allow_own=allow_own)):  # wrong process: the class's own rule
        return HostStatus.FAILED, f"the profiled process never used the GPU; {instead} did (launcher-only)"
    return HostStatus.OK, None


def run_status(host_statuses: Iterable[str]) -> RunStatus:
    """A run's status from its hosts' (or ranks'): complete when every one is ok; partial when some
    are; a word of its own when every host yielded or every workload failed; else failed."""
    statuses = list(host_statuses)
    if statuses and all(s == HostStatus.OK for s in statuses):
        return RunStatus.COMPLETE
    if any(s == HostStatus.OK for s in statuses):
        return RunStatus.PARTIAL
    if statuses and len(set(statuses)) == 1 and statuses[0] in (HostStatus.YIELDED, HostStatus.WORKLOAD_FAILED):
        return RunStatus(statuses[0])
    return RunStatus.FAILED


def status_line(who: str, entry: "HostEntry", *, why: bool = True, indent: str = "") -> str:
    """A host's, rank's or worker's status line, as every path prints it (with its reason unless
    ``why`` is false): one line, whatever the node put in the reason."""
    return indent + visible(f"{who}: {entry.status}" + (f": {entry.missing_why}" if why and entry.missing_why else ""))


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
    result = entry.result or {}
    lines = [f"gave up:  {g}" for g in entry.given_up]
    lines += [f"note:     {n}" for n in result.get("notes") or []]
    newcomer = result.get("newcomer")
    if isinstance(newcomer, dict) and entry.status != HostStatus.YIELDED:
        lines.append(f"newcomer: {newcomer_said(newcomer)}")
    if (why := workload_said(result)) and entry.status != HostStatus.WORKLOAD_FAILED:
        lines.append(f"workload: {why}")
    lines += [f"error:    {e}" for e in (result.get("profiler_errors") or [])[:5]]
    lines += [whole] if (whole := completeness.line(entry)) else []
    lines += [report_line(rep, hashes=hashes) for rep in entry.reports]
    return [indent + visible(line) for line in lines]
