"""A lab run's launcher ranks: which of the ranks its launcher was counted to start left no report,
each named as a ``missing`` entry of its own, and the line saying when the count was not known."""

from __future__ import annotations

from ..wrapping import launchers
from ..rundir import RunDir
from ..outcome import HostStatus
from ..store.manifest import HostEntry, RunManifest

# The launchers a lab server's run starts its ranks with (--launcher), each
# rank under its own profiler.
LAB_LAUNCHERS = ("mpirun", "torchrun")


def with_missing_ranks(entries: list[HostEntry]) -> list[HostEntry]:
    """The lab hosts' entries, each followed by one ``missing`` entry for every rank its launcher
    was counted to start that left no report (its agent's ``missing_ranks``), named ``HOST rank K``
    as a Slurm rank that left nothing is: the run is then partial, never complete. Made afresh from
    the results each time (``fleet gather`` reads a result later), so a rank
    is never listed twice."""
    found = []
    for entry in entries:
        if entry.rank is not None:  # on lab servers only these: made again below
            continue
        found.append(entry)
        found += [HostEntry(entry.host, HostStatus.MISSING, rank=rank, node=entry.node,
                            missing_why=f"rank {rank} left no report")
                  for rank in missing_ranks(entry)]
    return found


def missing_ranks(entry: HostEntry) -> list[int]:
    """The ranks the host's agent says left no report, as far as the plan and the reports brought
    home bear it out: only ranks the plan counted (0..N-1), each once, none whose report came home.
    The node's word alone (wire.RESULT holds only its shape) never names more."""
    said = entry.answer.missing_ranks if entry.answer is not None else ()
    counted = entry.planned.ranks if entry.planned is not None else None
    if not said or isinstance(counted, bool) or not isinstance(counted, int):
        return []
    home = {RunDir.report_rank(r.stored) for r in entry.reports
            if r.verified and isinstance(r.stored, str) and r.stored.endswith(".nsys-rep")}
    return sorted({r for r in said if r < counted} - home)


def ranks_line(manifest: RunManifest) -> str | None:
    """The run's line saying that its launcher's rank count was not known, and so no rank that left
    no report is named (why, as fleet.wrapping.launchers.rank_count says it);
    None for any other run."""
    asked = manifest.asked
    if asked.launcher not in LAB_LAUNCHERS or asked.ranks is not None:
        return None
    try:
        _, why = launchers.rank_count(asked.launcher, list(asked.command or ()),
                                      asked.profiler_args)
    except launchers.LauncherError:
        return None
    return f"ranks:   not counted ({why}): a rank that left no report is not named"
