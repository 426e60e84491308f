"""A run's ranks, as the analysis takes them: each rank's traced process from the SQLite exports
in the store, and what fleet recorded on its node, from the run's manifest.

A rank is one traced process that did GPU work or reached a collective. On Slurm each rank has
its own report, so the manifest names its rank. Where one report traced several ranks (a
launcher such as torchrun under one nsys on a lab server) a process names its rank with an
NVTX mark ``rank N``; one that does not is named by its host and pid. Where a launcher started each
rank under its own nsys on a lab server, the report's name says the rank (``rank2``).
"""

from __future__ import annotations

from pathlib import Path

from .. import store
from ..agent.messages import ProfileResult, Sample
from ..rundir import RunDir
from ..store.manifest import HostEntry, RunManifest
from . import export
from .inputs import NodeRecord, RankInput, Source, same_uuid


def _stored(manifest_path: Path, h: HostEntry) -> list[str]:
    found = []
    for rep in h.reports:
        path = store.here(manifest_path,
                          rep.stored) if rep.status == "export" and rep.verified else None
        if path and Path(path).is_file():
            found.append(path)
    return found


def inputs(manifest_path: Path, m: RunManifest, source: Source) -> tuple[list[RankInput],
                                                                         list[dict], list[str]]:
    """The ranks with exports, the ranks without (label and why), and notes on what was read."""
    ranks, missing = [], []
    calls = (source.sync_call,) if source.sync_call else ()
    for h in m.hosts:
        who = f"rank {h.rank}" if h.rank is not None else h.host
        paths = _stored(manifest_path, h)
        if not paths:
            why = h.missing_why or ("its export did not come home" if h.reports
                                    else f"status {h.status}")
            missing.append({"label": who, "why": why})
        for path in paths:
            try:
                ranks += _ranks_of(h, path, export.read(path, calls), m)
            except export.ExportError as e:
                missing.append({"label": who, "why": str(e)})
    notes = _apart(ranks)
    ranks.sort(key=lambda r: (r.rank is None, r.rank if r.rank is not None else 0, r.label))
    return ranks, missing, notes


def _ranks_of(h: HostEntry, path: str, procs: list, m: RunManifest) -> list[RankInput]:
    """The ranks of one export: each process that did GPU work or marked NVTX ranges (a launcher,
    torchrun, is traced too, and makes blocking calls of its own), named by its rank."""
    active = [p for p in procs if p.kernels or p.ranges]
    named = _named_rank(h, path)
    found = []
    for p in active:
        rank = named if named is not None and len(active) == 1 else p.rank_mark
        label = f"rank {rank}" if rank is not None else f"{h.host} pid {p.pid}"
        found.append(RankInput(label, rank, h.host, p, node_record(h, p, m)))
    return found


def _apart(ranks: list[RankInput]) -> list[str]:
    """Two processes claiming one rank (marks, or a rank's children) kept apart: the second is
    named by its host and pid too; a note for each."""
    notes, seen = [], {}
    for r in ranks:
        seen[r.label] = seen.get(r.label, 0) + 1
        if seen[r.label] > 1:
            notes.append(f"{r.label} named twice: the second is {r.host} pid {r.process.pid}")
            r.label = f"{r.label} ({r.host} pid {r.process.pid})"
    return notes


def _named_rank(h: HostEntry, path: str) -> int | None:
    """The rank a report stands for, where fleet named it: a Slurm rank's entry says it; on a lab
    server whose launcher (torchrun, mpirun) fleet started each rank under nsys, the report's name
    does (``rank2.sqlite``). A lab host's own report is not read for one: the
    host may be called so."""
    if h.rank is not None:
        return h.rank
    launched = h.planned is not None and h.planned.command.launcher
    return RunDir.report_rank(path) if launched else None


def _gpu_index(h: HostEntry, p: export.Process, m: RunManifest,
               answer: ProfileResult | None) -> int | None:
    """NVML's index of the process's GPU: by its UUID in the conditions fleet recorded; else, on a
    lab server, the CUDA device among the GPUs the run asked for (fleet pins them in that order),
    or CUDA's id; else (a Slurm rank) unknown."""
    gpu = p.gpus[0] if p.gpus else None
    if gpu is None:
        return None
    for index, uuid in answer.watched_gpus if answer is not None else ():
        if gpu.uuid and same_uuid(uuid, gpu.uuid):
            return index
    # a Slurm rank sees only the GPUs Slurm gave it: CUDA's 0 may be any of the node's
    if h.rank is not None:
        return None
    asked = m.asked.gpus
    if isinstance(gpu.cuda_id, int) and 0 <= gpu.cuda_id < len(asked):
        return asked[gpu.cuda_id]
    return gpu.cuda_id


def node_record(h: HostEntry, p: export.Process, m: RunManifest) -> NodeRecord:
    """The tenants and the sampled conditions of the process's GPU, as fleet recorded them
    (the result's ``conditions`` may be absent: results older than it lack it)."""
    answer = h.answer
    index = _gpu_index(h, p, m, answer)
    samples = [s for s in answer.samples if s.gpu == index] if answer is not None else []
    return NodeRecord(index, _tenants(h, index, samples), samples)


def _tenants(h: HostEntry, index: int | None, samples: list[Sample]) -> list[str]:
    """Who else was on the GPU: the foreign processes fleet saw at the start and in the samples,
    once each; else, from a result older than those, the tenants it named on that GPU."""
    return _foreign(h, index, samples) or list(dict.fromkeys(
        t for t in h.tenants_seen if index is None or t.startswith(f"GPU {index}:")
        or not t.startswith("GPU ")))


def _foreign(h: HostEntry, index: int | None, samples: list[Sample]) -> list[str]:
    at_start = [f"pid {seen.pid} ({seen.user or 'unknown user'})" for seen in h.processes_seen
                if seen.foreign and (index is None or seen.gpu == index)]
    sampled = [f"pid {q.pid} ({q.user or 'unknown user'})" for s in samples for q in s.processes
               if q.own is False]
    return list(dict.fromkeys(at_start + sampled))


def analyze_run(store_root: Path, m: RunManifest, source: Source, step_range: str | None,
                record=None):
    """The analysis of run ``m`` from the exports in the store (raises ``ranks.NoCollectives``,
    or LookupError when the run has no export to read); ``record``: a ``fleet top --record``
    (:mod:`.record`) whose samples of each rank's GPU join what fleet recorded on its node."""
    from .ranks import analyze

    ranks, missing, notes = inputs(store.manifest_of(store_root, m.run_id), m, source)
    if not ranks:
        raise LookupError(f"run {m.run_id} has no SQLite export in the store to read (runs "
                          f"profiled with nsys by this fleet keep one beside each report)")
    if record is not None:
        from .record import fold

        notes.append(fold(record, ranks, m.user))
    found = analyze(ranks, source, step_range, missing)
    found.notes[:0] = notes
    return found
