"""The nightly report as one static HTML page: inline SVG plots, no script, no server.

It opens from disk. Each (metric, device) gets a trend plot: one point per run,
flagged runs (tenants, flags given up) drawn hollow and grey, the baseline as a
dashed line; the verdict table links each run to its reports in the store.
"""

from __future__ import annotations

import html
import os
from pathlib import Path

from .trends import INSUFFICIENT, NO_CHANGE, REGRESSION, SUSPICIOUS, Verdict

COLOURS = {REGRESSION: "#c0392b", SUSPICIOUS: "#d68910", NO_CHANGE: "#1e8449", INSUFFICIENT: "#7f8c8d"}
W, H, PAD = 560, 180, 40


def scale(metric: str) -> tuple[float, str]:
    """nsys metrics are nanoseconds, shown in ms; an ncu metric carries its unit in its label."""
    unit = metric.rsplit("(", 1)[1].rstrip(")") if metric.endswith(")") and "(" in metric else None
    return (1.0, unit) if unit else (1e6, "ms")


def _plot(points: list[dict], verdict: Verdict) -> str:
    div, unit = scale(verdict.metric)
    values = [p["value"] / div for p in points]
    lo, hi = min(values), max(values)
    if verdict.baseline is not None:
        lo, hi = min(lo, verdict.baseline / div), max(hi, verdict.baseline / div)
    span = (hi - lo) or max(hi, 1.0) * 0.1
    lo, hi = lo - span * 0.1, hi + span * 0.1
    x = lambda i: PAD + (W - 2 * PAD) * (i / max(len(values) - 1, 1))
    y = lambda v: H - PAD / 2 - (H - PAD) * (v - lo) / (hi - lo)
    colour = COLOURS[verdict.verdict]
    parts = [f'<svg class="plot" role="img" width="{W}" height="{H}" viewBox="0 0 {W} {H}" '
             f'aria-label="{html.escape(verdict.metric)} on {html.escape(verdict.device)}">',
             f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fbfbfb" stroke="#ddd"/>',
             f'<text x="4" y="{y(hi) + 12:.1f}" font-size="10" fill="#555">{hi:.3g} {unit}</text>',
             f'<text x="4" y="{y(lo) - 2:.1f}" font-size="10" fill="#555">{lo:.3g} {unit}</text>']
    if verdict.baseline is not None:
        b = y(verdict.baseline / div)
        parts.append(f'<line class="baseline" x1="{PAD}" x2="{W - PAD}" y1="{b:.1f}" y2="{b:.1f}" '
                     'stroke="#888" stroke-dasharray="4 3"/>')
    line = " ".join(f"{x(i):.1f},{y(v):.1f}" for i, v in enumerate(values))
    parts.append(f'<polyline class="trend" points="{line}" fill="none" stroke="{colour}" stroke-width="2"/>')
    for i, (p, v) in enumerate(zip(points, values)):
        fill = "#fff" if p.get("flags") else colour
        title = html.escape(f"{p['run_id']}: {v:.4g} {unit}" + ("; " + "; ".join(p["flags"]) if p.get("flags") else ""))
        parts.append(f'<circle class="point" cx="{x(i):.1f}" cy="{y(v):.1f}" r="4" fill="{fill}" '
                     f'stroke="{colour if not p.get("flags") else "#999"}"><title>{title}</title></circle>')
    parts.append("</svg>")
    return "".join(parts)


def _section(playbook: str, rows: list[dict], verdicts: list[Verdict], link) -> str:
    series: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["metric"], r["device"]), []).append(r)
    table = ["<table><tr><th>metric</th><th>device</th><th>verdict</th><th>latest</th><th>baseline</th>"
             "<th>change</th><th>runs</th><th>note</th></tr>"]
    for v in verdicts:
        div, unit = scale(v.metric)
        fmt = lambda x: "" if x is None else f"{x / div:.4g} {unit}"
        table.append(f'<tr class="verdict"><td>{html.escape(v.metric)}</td><td>{html.escape(v.device)}</td>'
                     f'<td style="color:{COLOURS[v.verdict]};font-weight:bold">{v.verdict}</td>'
                     f"<td>{fmt(v.value)}</td><td>{fmt(v.baseline)}</td>"
                     f"<td>{'' if v.rel is None else f'{v.rel:+.1%}'}</td><td>{v.points}</td>"
                     f"<td>{html.escape(v.note)}</td></tr>")
    table.append("</table>")
    plots = [f'<section><h3>{html.escape(v.metric)} — {html.escape(v.device)}: '
             f'<span style="color:{COLOURS[v.verdict]}">{v.verdict}</span></h3>'
             f'{_plot(series[(v.metric, v.device)], v)}<p class="runs">runs: '
             f'{", ".join(link(p["run_id"]) for p in series[(v.metric, v.device)])}</p></section>' for v in verdicts]
    return f"<h2>{html.escape(playbook)}</h2>" + "".join(table) + "".join(plots)


def render(sections: list[tuple[str, list[dict], list[Verdict]]], runs: dict[str, str], out: Path) -> str:
    """One page for every playbook: (name, metric history, verdicts); ``runs``: run id -> its
    folder in the store, linked relative to the page's folder ``out``."""
    def link(run_id: str) -> str:
        where = runs.get(run_id)
        if not where:
            return html.escape(run_id)
        return f'<a href="{html.escape(os.path.relpath(where, out))}/">{html.escape(run_id)}</a>'

    return ("<!doctype html><html><head><meta charset='utf-8'><title>fleet nightly report</title>"
            "<style>body{font-family:sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}section{margin:1.5em 0}"
            ".runs{font-size:12px;color:#555}</style></head><body><h1>fleet nightly report</h1>"
            "<p>Hollow grey points: runs with tenants on the GPU or profiler flags given up; they are shown "
            "but not used for the baseline or the verdict. Dashed line: the baseline.</p>"
            + "".join(_section(name, rows, verdicts, link) for name, rows, verdicts in sections)
            + "</body></html>\n")
