"""Verdicts on a metric's history: pure, no I/O (documented in docs/nightly.md).

For each metric and device, the newest point is compared with a baseline: the
median of up to ``baseline_runs`` earlier clean points (runs without tenants
and without flags given up; flagged points are shown, never mixed into the
baseline or judged). With ``rel = (value - baseline) / baseline``:

* **Insufficient data**: fewer than ``min_runs`` clean points before the newest one;
* **Regression**: the newest ``consecutive`` clean points are each more than
  ``regression`` slower than the baseline taken before the first of them;
* **Suspicious**: the newest point is more than ``suspicious`` slower (or more
  than ``regression`` but not yet ``consecutive`` times);
* **No change**: otherwise (faster counts as no change, with its ``rel``).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

REGRESSION, SUSPICIOUS, NO_CHANGE, INSUFFICIENT = ("Regression", "Suspicious", "No change",
                                                   "Insufficient data")


@dataclass(frozen=True)
class Verdict:
    metric: str
    device: str
    verdict: str
    value: float | None
    baseline: float | None
    rel: float | None
    points: int
    note: str = ""


def judge(metric: str, device: str, points: list[dict], t: dict) -> Verdict:
    """``points``: oldest first, each {"value", "flags"}; ``t``: the playbook's thresholds."""
    clean = [p["value"] for p in points if not p.get("flags")]
    note = "the newest run had tenants or gave flags up; judged on the newest clean run" \
        if points and points[-1].get("flags") else ""
    k = max(1, int(t["consecutive"]))
    if len(clean) < int(t["min_runs"]) + 1:
        return Verdict(metric, device, INSUFFICIENT, clean[-1] if clean else None, None, None,
                       len(points), note)
    latest = clean[-1]
    base = statistics.median(clean[-1 - int(t["baseline_runs"]):-1])
    rel = (latest - base) / base if base else 0.0
    if len(clean) >= k + int(t["min_runs"]):
        before = clean[: len(clean) - k][-int(t["baseline_runs"]):]
        start = statistics.median(before)
        if start and all((v - start) / start > t["regression"] for v in clean[-k:]):
            return Verdict(metric, device, REGRESSION, latest, start, (latest - start) / start,
                           len(points), note)
    if rel > t["suspicious"]:
        return Verdict(metric, device, SUSPICIOUS, latest, base, rel, len(points), note)
    return Verdict(metric, device, NO_CHANGE, latest, base, rel, len(points), note)


def judge_history(rows: list[dict], thresholds: dict) -> list[Verdict]:
    """One verdict per (metric, device) of a playbook's history (``store.metric_history``)."""
    series: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["metric"], r["device"]), []).append(r)
    return [judge(m, d, pts, thresholds) for (m, d), pts in sorted(series.items())]


def runs_compared(points: list[dict], verdict: Verdict) -> tuple[str, str] | None:
    """(baseline run, judged run) of a verdict: the newest clean run, and the earlier clean
    run whose value is nearest the baseline (the newest of equals): the two runs whose
    kernels say what moved. ``points`` carry ``run_id``; None without a baseline."""
    clean = [p for p in points if not p.get("flags") and p.get("run_id")]
    if verdict.baseline is None or len(clean) < 2:
        return None
    latest = clean[-1]
    best = min(reversed(clean[:-1]), key=lambda p: abs(p["value"] - verdict.baseline))
    return best["run_id"], latest["run_id"]
