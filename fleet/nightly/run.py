"""Nightly profiling: run a playbook through the ordinary profile paths, and report on trends.

``run_playbook`` is ``fleet profile`` with the playbook's request (lab hosts or
a Slurm job); the run's manifest then gets the playbook's metrics, read from
the summaries that came home, and the catalog indexes them. ``report`` judges
every metric's history (:mod:`fleet.nightly.trends`) and writes one static HTML page
and its JSON twin.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from ..lab import profile
from .. import store
from . import stragglers, trends
from ..store.manifest import RunManifest, new_run_id
from .playbook import Playbook, run_metrics
from ..plan import ProfileRequest
from .report_html import render
from .report_plot import shown_metric

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..slurm.options import CheckedJobSpec
    from ..transport import Fanout


@dataclass(frozen=True)
class Progress:
    """Where a run's progress goes: the workload's and profiler's lines (lab servers), the job's
    states (Slurm), the reports coming home (a byte counter); by default nowhere."""
    write: Callable[[str, str], None] = lambda stream, text: None
    on_state: Callable[[Any], None] = lambda state: None
    gathering: Any = None


def request_for(pb: Playbook) -> ProfileRequest:
    return ProfileRequest(tool=pb.tool, command=pb.command, run_id=new_run_id(),
                          profiler_args=pb.profiler_args)


def job_spec(pb: Playbook, req: ProfileRequest) -> "CheckedJobSpec":
    """The playbook's job, checked once against what sbatch takes and against its request
    (``UnsafeValue``, ``JobSpecError``: exit 2), before the cluster is asked anything."""
    from ..slurm import options
    from ..slurm.spec import JobSpec

    t = pb.target
    raw = JobSpec(partition=t.get("partition"), nodes=t.get("nodes"), ntasks=t.get("ntasks"),
                  ntasks_per_node=t.get("ntasks_per_node"), gpus=t.get("gpus"), gres=t.get("gres"),
                  time=t.get("time"), account=t.get("account"), qos=t.get("qos"),
                  ranks=tuple(t["ranks"]) if t.get("ranks") is not None else None,
                  launcher=t.get("launcher", "srun"))
    return options.checked(raw, req)


async def run_playbook(fan: "Fanout", inventory: "Inventory", pb: Playbook, *, embedded: bool, store_root: Path,
                       dry_run: bool = False, poll: float = 5.0, progress: Progress = Progress()) -> RunManifest:
    """One run of the playbook; its manifest (with the playbook's metrics) is in the store. What
    it says while it runs goes to ``progress``, as ``fleet profile``'s does."""
    req = request_for(pb)
    if pb.on_slurm:
        from ..slurm import run as slurm_run
        from ..slurm.cluster import choose

        spec = job_spec(pb, req)
        cluster = choose(inventory, pb.target.get("partition"), pb.target.get("cluster"), embedded=embedded)
        manifest = await slurm_run.profile(fan, cluster, req, spec, store_root=store_root, dry_run=dry_run,
                                           poll=poll, on_state=progress.on_state, gathering=progress.gathering)
    else:
        hosts = inventory.select([pb.target["hosts"]])
        manifest = await profile.profile(fan, hosts, req, store_root=store_root, site="lab", dry_run=dry_run,
                                         write=progress.write, gathering=progress.gathering)
    if dry_run:
        return manifest
    manifest.playbook = {"name": pb.name, "path": pb.path, "metrics": run_metrics(pb, manifest),
                         "thresholds": pb.thresholds}
    found = stragglers.of_run(store_root, manifest, pb.ranks)
    if found is not None:
        manifest.playbook["stragglers"] = found
    store.save(store_root, manifest)
    return manifest


def run_info(store_root: Path, run_id: str) -> dict:
    """What the report shows of a run, from its manifest: its folder, when it started, and its
    hosts' names, GPUs, drivers and profiler versions (each joined when hosts differ)."""
    try:
        path = store.manifest_of(store_root, run_id)
        m = store.read_manifest(path)
    except (LookupError, store.CatalogError):
        return {}
    join = lambda key: ", ".join(dict.fromkeys(str(getattr(h, key)) for h in m.hosts if getattr(h, key))) or None
    reports = [r.stored for h in m.hosts for r in h.reports if r.stored and Path(r.stored).exists()]
    return {"dir": str(path.parent), "started": m.started, "host": join("host"), "gpu": join("gpu"),
            "driver": join("driver"), "tool_version": join("tool_version"), "reports": reports,
            "stragglers": (m.playbook or {}).get("stragglers")}


class EmbeddedHistory:
    """Where a report reads the runs it judges: the embedded store (the team store's twin is
    :class:`fleet.store.team.read.TeamHistory`, with the same three calls)."""

    def __init__(self, store_root: Path):
        self.store_root = store_root

    def metric_history(self, playbook: str, since: str | None) -> list[dict]:
        return store.metric_history(self.store_root, playbook, since)

    def run_info(self, run_id: str) -> dict:
        return run_info(self.store_root, run_id)

    def compare(self, a: str, b: str) -> list[dict]:
        return store.compare(self.store_root, a, b)


def _compared(history, rows: list[dict], verdicts: list) -> dict:
    """For each metric called a regression or suspicious: the two runs it compares, and their kernels."""
    compared = {}
    for v in verdicts:
        pair = trends.runs_compared([r for r in rows if (r["metric"], r["device"]) == (v.metric, v.device)], v)
        if v.verdict in (trends.REGRESSION, trends.SUSPICIOUS) and pair:
            compared[(v.metric, v.device)] = (*pair, history.compare(*pair))
    return compared


def report(store_root: Path, playbooks: list[Playbook], out: Path, since: str | None = None,
           history=None) -> dict:
    """Judge every playbook's history (from ``history``: the embedded store's by default); write
    ``out`` (HTML) and ``out`` with .json. The summary back."""
    history = history or EmbeddedHistory(store_root)
    sections, runs, summary = [], {}, {"playbooks": []}
    for pb in playbooks:
        rows = history.metric_history(pb.name, since)
        verdicts = trends.judge_history(rows, pb.thresholds)
        for r in rows:
            if r["run_id"] not in runs:
                runs[r["run_id"]] = history.run_info(r["run_id"])
        shares = stragglers.judged([(run_id, runs[run_id]["stragglers"]) for run_id in dict.fromkeys(
            r["run_id"] for r in rows) if (runs[run_id] or {}).get("stragglers")])
        sections.append((pb.name, rows, verdicts, pb.thresholds, _compared(history, rows, verdicts), shares))
        summary["playbooks"].append({"name": pb.name, "runs": len({r["run_id"] for r in rows}),
                                     "verdicts": [asdict(v) for v in verdicts], "stragglers": shares})
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(sections, runs, out.parent))
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    summary["regressions"] = [f"{p['name']}: {shown_metric(v['metric'])} on {v['device']} {v['rel']:+.1%}"
                              for p in summary["playbooks"] for v in p["verdicts"] if v["verdict"] == trends.REGRESSION]
    return summary
