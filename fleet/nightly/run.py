"""Nightly profiling: run a playbook through the ordinary profile paths, and report on trends.

``run_playbook`` is ``fleet profile`` with the playbook's request (lab hosts or
a Slurm job); the run's manifest then gets the playbook's metrics, read from
the summaries that came home, and the catalog indexes them. ``report`` judges
every metric's history (:mod:`fleet.nightly.trends`) and writes one static HTML page
and its JSON twin.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from .. import store
from ..run import LabRun, SlurmRun
from . import changes, stragglers, trends
from .changepoints import Settings
from ..store.manifest import RunManifest
from ..store.records import new_run_id
from .environment import Environment, run_facts
from .lock import playbook_lock
from .playbook import Playbook, run_metrics
from ..plan import LabPart, ProfileRequest
from ..safenames import quote
from ..visible import visible
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


def request_for(pb: Playbook, gpus: tuple[int, ...] | None = None) -> ProfileRequest:
    """The playbook's request; ``gpus`` (lab servers only): the NVML indices it runs on."""
    return ProfileRequest(tool=pb.tool, command=pb.command, run_id=new_run_id(),
                          profiler_args=pb.profiler_args,
                          lab=LabPart(gpus=gpus) if gpus is not None else None)


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


def workload_host(inventory: "Inventory", pb: Playbook, *, embedded: bool):
    """Where the playbook's version and checkout commands run: the first of its lab hosts, or its
    cluster's login node (the job's files are there, on a shared file system); None: no host."""
    if pb.on_slurm:
        from ..slurm.cluster import choose

        return choose(inventory, pb.target.get("partition"), pb.target.get("cluster"),
                      embedded=embedded).login
    hosts = inventory.select([pb.target["hosts"]])
    return hosts[0] if hosts else None


async def run_playbook(fan: "Fanout", inventory: "Inventory", pb: Playbook, *, embedded: bool,
                       store_root: Path,
                       dry_run: bool = False, poll: float = 5.0, progress: Progress = Progress(),
                       gpus: tuple[int, ...] | None = None,
                       confirm: dict | None = None) -> RunManifest:
    """One run of the playbook; its manifest (with the playbook's metrics) is in the store. What
    it says while it runs goes to ``progress``, as ``fleet profile``'s does. A run of ``fleet
    nightly confirm`` (``confirm``: its side and version) keeps its metrics under ``confirm``, where
    neither catalog indexes them: it is no night of the playbook's history."""
    # a confirmation holds the playbook's lock for all its runs; a dry run starts nothing
    with contextlib.nullcontext() if dry_run or confirm is not None else playbook_lock(
        store_root, pb.name, "a run"):
        return await _run_playbook(fan, inventory, pb, embedded=embedded, store_root=store_root,
                                   dry_run=dry_run,
                                   poll=poll, progress=progress, gpus=gpus, confirm=confirm)


async def _run_playbook(fan: "Fanout", inventory: "Inventory", pb: Playbook, *, embedded: bool,
                        store_root: Path,
                        dry_run: bool, poll: float, progress: Progress,
                        gpus: tuple[int, ...] | None, confirm: dict | None) -> RunManifest:
    req = request_for(pb, gpus)
    asked = workload_host(inventory, pb, embedded=embedded)
    # the night's run is a run as `fleet profile` makes one (fleet/run.py), on the night's pool
    if pb.on_slurm:
        from ..slurm.cluster import choose

        cluster = choose(inventory, pb.target.get("partition"), pb.target.get("cluster"),
                         embedded=embedded)
        manifest = await SlurmRun(req, store_root, None, cluster=cluster, spec=job_spec(pb, req),
                                  dry_run=dry_run, poll=poll).on(
            fan, on_state=progress.on_state, gathering=progress.gathering)
    else:
        hosts = inventory.select([pb.target["hosts"]])
        manifest = await LabRun(req, store_root, "lab", hosts=hosts, dry_run=dry_run).on(
            fan, write=progress.write, gathering=progress.gathering)
    if dry_run:
        return manifest
    metrics = run_metrics(pb, manifest)
    manifest.playbook = {"name": pb.name, "path": pb.path, "thresholds": pb.thresholds,
                         **({"metrics": metrics} if confirm is None
                            else {"confirm": {**confirm, "metrics": metrics}})}
    if pb.version and asked is not None:
        manifest.playbook.update(await workload_version(fan, asked, pb.version))
    found = stragglers.of_run(store_root, manifest, pb.ranks)
    if found is not None:
        manifest.playbook["stragglers"] = found
    store.save(store_root, manifest)
    return manifest


VERSION_TIMEOUT = 30   # seconds the playbook's version command may take
VERSION_LENGTH = 128   # characters of its first line kept


def home_script(words: tuple[str, ...], what: str = "version",
                deadline: int = VERSION_TIMEOUT) -> str:
    """The shell line that runs one of the playbook's commands (its ``version``, its ``checkout``)
    from the home directory, under a deadline: each word one quoted shell word, a leading ``~/``
    left for the shell to expand."""
    quoted = ["~/" + quote(w[2:], what) if w.startswith("~/") else quote(w, what) for w in words]
    return f"cd && exec timeout -k 5 {deadline} " + " ".join(quoted)


async def workload_version(fan: "Fanout", host, words: tuple[str, ...]) -> dict:
    """``{"version": TEXT}``, the first line the playbook's version command printed on ``host`` (as
    the inventory's user there, never another), or ``{"version": None, "version_error": WHY}``."""
    r = await fan.run(host, ["sh", "-c", home_script(words)], timeout=VERSION_TIMEOUT + 10, limit=64
                      * 1024)
    first = r.stdout.decode("utf-8",
                            "replace").strip().splitlines()[:1] if r.exit_status == 0 else []
    if first and first[0].strip():
        return {"version": visible(first[0].strip())[:VERSION_LENGTH]}
    why = r.error or f"exit status {r.exit_status}" + (": no output" if r.exit_status == 0 else "")
    return {"version": None,
            "version_error": visible(f"{' '.join(words)} on {host.name}: {why}")[:200]}


def run_place(store_root: Path, run_id: str) -> tuple[dict, "RunManifest"] | None:
    """Where a run of the embedded store is (its folder, its reports there) and its manifest; None
    where it cannot be read."""
    try:
        path = store.manifest_of(store_root, run_id)
        m = store.read_manifest(path)
    except (LookupError, store.CatalogError):
        return None
    reports = [r.stored for h in m.hosts for r in h.reports if r.stored and Path(r.stored).exists()]
    return {"dir": str(path.parent), "reports": reports}, m


class EmbeddedHistory:
    """Where a report reads the runs it judges: the embedded store (the team store's twin is
    :class:`fleet.store.team.read.TeamHistory`, with the same three calls)."""

    def __init__(self, store_root: Path):
        self.store_root = store_root

    def metric_history(self, playbook: str, since: str | None) -> list[dict]:
        return store.metric_history(self.store_root, playbook, since)

    def run_place(self, run_id: str) -> tuple[dict, "RunManifest"] | None:
        return run_place(self.store_root, run_id)

    def compare(self, a: str, b: str) -> list[dict]:
        return store.compare(self.store_root, a, b)


def _compared(history, rows: list[dict], level: list[dict], found: list[changes.SeriesChanges],
              verdicts: list) -> dict:
    """For each metric called a regression or suspicious: the two runs it compares, and their
    kernels:
    of the level since the newest change point, or where the verdict is that change (a recent
    slowdown), a run of the level before it and the newest."""
    compared, flagged = {}, _flagged(rows, found)
    before_change = {(s.metric, s.device): c.before for s in found for c in [said_change(s)]
                     if c is not None}
    for v in verdicts:
        key = (v.metric, v.device)
        # the verdict is that change
        across_change = key in before_change and before_change[key] == v.baseline
        judged = flagged if across_change else level
        pair = trends.runs_compared([r for r in judged if (r["metric"], r["device"]) == key], v)
        if v.verdict in (trends.REGRESSION, trends.SUSPICIOUS) and pair:
            compared[key] = (*pair, history.compare(*pair))
    return compared


def _points(rows: list[dict], runs: dict) -> dict[tuple[str, str], list[changes.Point]]:
    """Each (metric, device)'s points, oldest first, each with its run's environment on that
    device."""
    series: dict[tuple[str, str], list[changes.Point]] = {}
    for r in rows:
        if not isinstance(r["value"], (int, float)) or isinstance(r["value"], bool):
            continue
        environment = (runs.get(r["run_id"]) or {}).get("environments", {}).get(r["device"],
                                                                                Environment())
        point = changes.Point(r["run_id"], r["started"], r["value"], environment,
                              tuple(map(str, r["flags"])))
        series.setdefault((r["metric"], r["device"]), []).append(point)
    return series


def judge_changes(rows: list[dict], runs: dict, thresholds: dict) -> list[changes.SeriesChanges]:
    """The change points of every metric and device of a playbook's history, labelled."""
    settings = Settings(min_change=float(thresholds["change"]))
    return [changes.judge_series(metric, device, points, settings,
                                 recent=int(thresholds["baseline_runs"]),
                                 newest=max(1, int(thresholds["consecutive"])))
            for (metric, device), points in sorted(_points(rows, runs).items())]


def _flagged(rows: list[dict], found: list[changes.SeriesChanges]) -> list[dict]:
    """The rows, each contaminated run flagged with why (a run whose clocks were held down too,
    which the catalog's flags do not say)."""
    kept_out = {(s.metric, s.device, run): why for s in found for run, why in s.contaminated}
    return [dict(r, flags=list(r["flags"]) or kept_out.get((r["metric"], r["device"], r["run_id"]),
                                                           [])) for r in rows]


def current_level(rows: list[dict], found: list[changes.SeriesChanges]) -> list[dict]:
    """The rows the threshold verdict judges: each series' runs from its newest change point on (its
    baseline is the level the runs sit at now, not a mix of two), flagged as :func:`_flagged`
    does."""
    since = {(s.metric, s.device): s.changes[-1].run_after for s in found if s.changes}
    level, started = [], set()
    for r in _flagged(rows, found):
        key = (r["metric"], r["device"])
        # a series without a change point starts at once
        if since.get(key, r["run_id"]) == r["run_id"]:
            started.add(key)
        if key in started:
            level.append(r)
    return level


def said_change(s: changes.SeriesChanges) -> changes.Change | None:
    """The recent slowdown a series' verdict is said as: one the code may explain, else one nothing
    recorded explains; None where neither stands."""
    return s.standing(changes.CODE) or s.standing(changes.UNEXPLAINED)


def with_recent_changes(verdicts: list[trends.Verdict],
                        found: list[changes.SeriesChanges]) -> list[trends.Verdict]:
    """The threshold verdicts, where a series has a recent slowdown found as a change point that
    still stands, said as that change: a Regression against the level before it where the code may
    explain it, at least Suspicious where nothing recorded does. The threshold verdict judges the
    runs since the newest change point, so alone it calls the new, slower level "No change". A
    threshold Regression worse than the change keeps its own figures, the change in its note."""
    by_series = {(s.metric, s.device): said_change(s) for s in found}
    out = []
    for v in verdicts:
        c = by_series.get((v.metric, v.device))
        if c is None:
            out.append(v)
            continue
        note = "; ".join(filter(None, [f"changed at run {c.run_after}: {c.label}"
                                       + (f" ({'; '.join(c.changed)})" if c.changed else ""),
                                       v.note]))
        verdict = trends.REGRESSION if c.label == changes.CODE or c.code_too else trends.SUSPICIOUS
        if v.verdict == trends.REGRESSION and (verdict != trends.REGRESSION
                                               or (v.rel or 0) >= c.rel):
            out.append(replace(v, note=note))
        else:
            out.append(replace(v, verdict=verdict, baseline=c.before, rel=c.rel, note=note))
    return out


def _series_json(found: changes.SeriesChanges) -> dict:
    return {"metric": found.metric, "device": found.device, "points": found.points,
            "clean": found.clean, "changes": [asdict(c) for c in found.changes],
            "contaminated": [{"run_id": run, "why": why} for run, why in found.contaminated]}


def _line(playbook: str, metric: str, device: str, rel: float, where: str) -> str:
    return f"{playbook}: {shown_metric(metric)} on {device} {rel:+.1%}{where}"


NEWS_OF = {changes.CODE: "regressions", changes.UNEXPLAINED: "unexplained",
           changes.ENVIRONMENT: "environment"}


def _news(playbooks: list[dict], sections: list) -> dict[str, list[str]]:
    """What the morning's message says, by what it calls for: ``regressions`` (exit 7): a recent
    slowdown labelled code (or environment where the workload's version changed there too), or a
    threshold Regression of the newest runs against the level since the newest change point, where
    nothing of the environment changed among them; ``unexplained`` (exit 11): a recent slowdown
    nothing fleet recorded explains; ``environment``: a slowdown the environment explains (said, no
    exit status of its own)."""
    news: dict[str, list[str]] = {"regressions": [], "unexplained": [], "environment": []}
    for p, section in zip(playbooks, sections):
        found = section[6]
        for kind in (changes.CODE, changes.UNEXPLAINED, changes.ENVIRONMENT):
            # code: an environment change with the workload's too
            for s, c in changes.slowdowns(found, kind):
                what = f" ({'; '.join(c.changed)})" if c.changed else ""
                news[NEWS_OF[kind]].append(_line(p["name"], s.metric, s.device, c.rel,
                                                 f", changed at run {c.run_after}: "
                                                 f"{c.label}{what}"))
        by_series = {(c.metric, c.device): c for c in found}
        for v in p["verdicts"]:
            if v["verdict"] != trends.REGRESSION:
                # (its baseline is the level since the newest change point: a step after it)
                continue
            series = by_series.get((v["metric"], v["device"]))
            if series is not None and series.standing(changes.CODE) is not None:
                continue  # a regression already, said above as the change
            if series is not None and series.lately:
                news["environment"].append(_line(p["name"], v["metric"], v["device"], v["rel"],
                                                 " over the newest runs "
                                                 f"({'; '.join(series.lately)})"))
            else:
                news["regressions"].append(_line(p["name"], v["metric"], v["device"], v["rel"], ""))
    return news


def history_of(history, pb: Playbook, since: str | None, runs: dict) -> list[dict]:
    """The playbook's metric rows, oldest first; what the report shows of each run (where it is, and
    :func:`.environment.run_facts` of its manifest) added to ``runs``."""
    rows = history.metric_history(pb.name, since)
    for r in rows:
        if r["run_id"] not in runs:
            found = history.run_place(r["run_id"])
            runs[r["run_id"]] = {**found[0], **run_facts(found[1])} if found is not None else {}
    return rows


def report(store_root: Path, playbooks: list[Playbook], out: Path, since: str | None = None,
           history=None) -> dict:
    """Judge every playbook's history (from ``history``: the embedded store's by default); write
    ``out`` (HTML) and ``out`` with .json. The summary back."""
    history = history or EmbeddedHistory(store_root)
    sections, runs, summary = [], {}, {"playbooks": []}
    for pb in playbooks:
        rows = history_of(history, pb, since, runs)
        shares = stragglers.judged([(run_id, runs[run_id]["stragglers"])
                                    for run_id in dict.fromkeys(r["run_id"] for r in rows)
                                    if (runs[run_id] or {}).get("stragglers")])
        found = judge_changes(rows, runs, pb.thresholds)
        level = current_level(rows, found)
        verdicts = with_recent_changes(trends.judge_history(level, pb.thresholds), found)
        sections.append((pb.name, rows, verdicts, pb.thresholds, _compared(history, rows, level,
                                                                           found, verdicts),
                         shares, found))
        summary["playbooks"].append({"name": pb.name, "runs": len({r["run_id"] for r in rows}),
                                     "verdicts": [asdict(v) for v in verdicts],
                                     "stragglers": shares,
                                     "changes": [_series_json(c) for c in found]})
    summary.update(_news(summary["playbooks"], sections))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render(sections, runs, out.parent))
    out.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return summary
