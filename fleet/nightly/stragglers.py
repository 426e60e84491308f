"""The straggler share of a nightly run with several ranks (docs/ranks.md): which rank arrived last
at the collectives, in what share of them, and the rank-seconds the others lost waiting, from the
cross-rank analysis of its exports. A run in which a tenant shared a GPU is marked, and kept out
of the baseline (the median share of the clean runs before it), as the metrics' trends are.
"""

from __future__ import annotations

import functools
import statistics
from pathlib import Path

from ..store.manifest import RunManifest
from ..visible import html_text

BASELINE_RUNS = 7


def of_run(store_root: Path, m: RunManifest, settings: dict) -> dict | None:
    """The run's straggler, its share and the rank-seconds lost; None for a run of one rank. What
    could not be analysed is said in ``note``."""
    from ..analysis import export, load, ranks, record

    source = ranks.Source(settings.get("sync_range"), settings.get("sync_call"))
    try:
        # matched to each run by time
        kept = _record(settings["record"]) if settings.get("record") else None
        found = load.analyze_run(store_root, m, source, settings.get("step_range", "step"), kept)
    except (LookupError, export.ExportError, record.RecordError) as e:
        return {"note": str(e)} if settings else None
    if len(found.ranks) < 2:
        return None
    top = found.verdicts[0] if found.verdicts else None
    flags = _tenants(m, found)
    return {"straggler": top["rank"] if top else None, "share": top["last"] / top["of"] if top
            else 0.0,
            "lost_s": found.lost_s, "ranks": len(found.ranks), "collectives": found.collectives,
            "causes": [c["cause"] for c in top["causes"]] if top else [], "flags": flags}


def _tenants(m: RunManifest, found) -> list[str]:
    """The run's flags, each once: the tenants seen on its hosts, then the other users' processes
    that the analysis found sharing a GPU."""
    tenants = [f"tenant: {t}" for h in m.hosts for t in h.tenants_seen]
    tenants += [f"tenant: {c['evidence']}" for v in found.verdicts for c in v["causes"]
                if c["cause"] == "shared GPU" and "another user's process" in c["evidence"]]
    return list(dict.fromkeys(tenants))


@functools.lru_cache(maxsize=2)
def _record(path: str):
    """A look's record, read once for every run of the playbook's history."""
    from ..analysis import record

    return record.read(path)


def judged(history: list[tuple[str, dict]]) -> list[dict]:
    """Each run's straggler share (oldest first) beside the baseline: the median share of up to
    ``BASELINE_RUNS`` clean runs before it (runs with a tenant on a GPU are shown, never
    counted)."""
    out, clean = [], []
    for run_id, doc in history:
        base = statistics.median(clean[-BASELINE_RUNS:]) if clean else None
        out.append(dict(doc, run_id=run_id, baseline=base))
        if "share" in doc and not doc.get("flags"):
            clean.append(doc["share"])
    return out


def table(rows: list[dict], link) -> str:
    """The playbook's runs with several ranks: straggler, share, rank-seconds lost, baseline."""
    if not rows:
        return ""
    head = ("<table class='stragglers'><caption>Stragglers (runs with several ranks): the rank "
            "that arrived last at the collectives, in what share of them, and the rank-seconds the "
            "others lost waiting. Runs with a tenant on a GPU are marked and kept out of the "
            "baseline.</caption><tr><th>run</th><th>straggler</th><th>share</th><th>baseline</th>"
            "<th>lost rank-s</th><th>why</th><th>flags</th></tr>")
    body = []
    for r in rows:
        if "share" not in r:
            body.append(f"<tr class='straggler-run'><td>{link(r['run_id'])}</td><td colspan='6'>"
                        f"{html_text(r.get('note', ''))}</td></tr>")
            continue
        flagged = " flagged" if r["flags"] else ""
        base = "" if r["baseline"] is None else f"{r['baseline']:.0%}"
        body.append(f"<tr class='straggler-run{flagged}'><td>{link(r['run_id'])}</td>"
                    f"<td>{html_text(str(r['straggler']))}</td><td class='num "
                    f"share'>{r['share']:.0%}</td><td class='num'>{base}</td><td "
                    f"class='num'>{r['lost_s']:.3f}</td><td>"
                    f"{html_text(', '.join(r['causes']))}</td><td>"
                    f"""{html_text('; '.join(r['flags'])
                                   + (' (kept out of the baseline)' if r['flags'] else ''))}"""
                    "</td></tr>")
    return head + "".join(body) + "</table>"
