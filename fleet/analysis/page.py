"""The cross-rank analysis as one self-contained HTML page (inline SVG, no script, no server):
a timeline per rank of its steps and its waits in each collective, the straggler's row
highlighted, then each collective's waiting time as a bar per rank, then the table and verdicts.

The timeline shifts each rank onto the first rank's clock by the collectives' ends (all ranks
leave a blocking collective together): drawn so, never used for the verdict.
"""

from __future__ import annotations

from ..visible import html_text
from .ranks import Analysis

STYLE = ("body{font-family:sans-serif;margin:2em;color:#222;"
         "max-width:1100px}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid "
         "#ccc;padding:3px "
         "8px;text-align:left;font-size:13px}th{background:#f3f3f3}td.num{text-align:right;"
         "font-variant-numeric:tabular-nums}tr.straggler "
         "td{background:#fdecea}.legend{font-size:13px;color:#444}li{margin:.3em 0}svg "
         "text{font-size:11px;fill:#333}")
W, LEFT, ROW = 1000, 120, 26
STEP, WAIT, LATE = "#aed6f1", "#e67e22", "#c0392b"


def _e(text) -> str:
    return html_text(text)


def timeline_svg(a: Analysis, straggler: str | None) -> str:
    rows = list(a.timeline.items())
    spans = [(s + t["offset_ns"], e + t["offset_ns"]) for _, t in rows
             for s, e in t["syncs"] + t["steps"]]
    lo, hi = min(s for s, _ in spans), max(e for _, e in spans)
    x = lambda ns: LEFT + (ns - lo) / max(hi - lo, 1) * (W - LEFT - 10)  # noqa: E731
    parts = [f'<svg class="timeline" width="{W}" height="{ROW * len(rows) + 30}">']
    for i, (label, t) in enumerate(rows):
        y = 5 + i * ROW
        late = label == straggler
        parts.append(f'<g class="rank-row{" straggler" if late else ""}" data-rank="{_e(label)}">')
        if late:
            parts.append(f'<rect class="highlight" x="0" y="{y - 3}" width="{W}" height="{ROW}" '
                         'fill="#fdecea"/>')
        parts.append(f'<text x="4" y="{y + 14}">{_e(label)}{" (straggler)" if late else ""}</text>')
        for s, e in t["steps"]:
            parts.append(f'<rect class="step" x="{x(s + t["offset_ns"]):.1f}" y="{y}" width="'
                         f'{max(x(e + t["offset_ns"]) - x(s + t["offset_ns"]), 0.5):.1f}" '
                         f'height="18" fill="{STEP}"/>')
        for s, e in t["syncs"]:
            parts.append(f'<rect class="wait" x="{x(s + t["offset_ns"]):.1f}" y="{y + 4}" width="'
                         f'{max(x(e + t["offset_ns"]) - x(s + t["offset_ns"]), 0.5):.1f}" '
                         f'height="10" fill="{LATE if late else WAIT}"><title>wait '
                         f'{(e - s) / 1e6:.2f} ms</title></rect>')
        parts.append("</g>")
    parts.append(f'<text x="{LEFT}" y="{ROW * len(rows) + 22}">0 s</text><text x="{W - 60}" '
                 f'y="{ROW * len(rows) + 22}">{(hi - lo) / 1e9:.2f} s</text></svg>')
    return "".join(parts)


def waits_svg(a: Analysis, straggler: str | None) -> str:
    labels = [r.label for r in a.ranks]
    peak = max((w for c in a.per_collective for w in c["waits_s"].values()), default=0) or 1
    group = (W - LEFT) / max(len(a.per_collective), 1)
    bar = max(group / (len(labels) + 1), 1)
    height = 160
    parts = [f'<svg class="waits" width="{W}" height="{height + 40}">',
             f'<text x="4" y="14">wait (ms)</text><text x="4" y="30">max {peak * 1e3:.1f}</text>']
    for i, c in enumerate(a.per_collective):
        for j, label in enumerate(labels):
            w = c["waits_s"].get(label)
            if w is None:
                continue
            h = w / peak * height
            colour = LATE if label == straggler else WAIT
            parts.append(f'<rect class="wait-bar" data-rank="{_e(label)}" data-collective="{i}" '
                         f'x="{LEFT + i * group + j * bar:.1f}" y="{height - h + 10:.1f}" '
                         f'width="{bar * 0.9:.1f}" height="{max(h, 0.5):.1f}" '
                         f'fill="{colour}"><title>collective {i + 1}, {_e(label)}: {w * 1e3:.2f} '
                         'ms</title></rect>')
    parts.append(f'<text x="{LEFT}" y="{height + 30}">collectives 1 to {len(a.per_collective)}, '
                 f'one bar per rank ({", ".join(_e(lb) for lb in labels)})</text></svg>')
    return "".join(parts)


def table(a: Analysis, straggler: str | None) -> str:
    head = ("<tr><th>rank</th><th>host</th><th>GPU</th><th>kernel "
            "s</th><th>kernels</th><th>collective s</th><th>idle s</th><th>median step "
            "ms</th><th>lost rank-s</th><th>last</th></tr>")
    rows = []
    for r in a.ranks:
        step = f"{r.step_median_s * 1e3:.1f}" if r.step_median_s is not None else "-"
        rows.append(f'<tr class="rank{" straggler" if r.label == straggler else ""}"><td>'
                    f'{_e(r.label)}</td><td>{_e(r.host)}</td><td>'
                    f'{_e(r.gpu["index"] if r.gpu.get("index") is not None else r.gpu.get("bus"))}'
                    f'</td><td class="num">{r.kernel_s:.3f}</td>'
                    f'<td class="num">{r.kernels}</td><td class="num">{r.collective_s:.3f}</td>'
                    f'<td class="num">{r.idle_s:.3f}</td><td class="num">{step}</td>'
                    f'<td class="num">{r.lost_s:.3f}</td><td class="num">{r.last} of '
                    f'{a.collectives}</td></tr>')
    return f'<table class="ranks">{head}{"".join(rows)}</table>'


def render(run_id: str, a: Analysis) -> str:
    straggler = a.verdicts[0]["rank"] if a.verdicts else None
    verdicts = "".join(f'<li class="verdict"><b>{_e(v["summary"])}</b><ul>'
                       + "".join(f'<li class="cause"><b>{_e(c["cause"])}</b>: '
                                 f'{_e(c["evidence"])}</li>'
                                 for c in v["causes"]) + "</ul></li>" for v in a.verdicts)
    notes = "".join(f"<li>{_e(n)}</li>" for n in a.notes + [f'{m["label"]}: no export ({m["why"]})'
                                                              for m in a.missing])
    return ("<!doctype html><html><head><meta charset='utf-8'><title>fleet: ranks of "
            f"{_e(run_id)}</title><style>{STYLE}</style></head><body><h1>Which rank was slow: run "
            f"{_e(run_id)}</h1><p>{len(a.ranks)} ranks, {a.collectives} collectives from "
            f"{_e(a.source)}; <b>{a.lost_s:.3f} rank-seconds lost waiting</b>.</p><ul "
            f"class='verdicts'>{verdicts}</ul><h2>Timeline</h2><p class='legend'>Light blue: "
            "steps; orange: waits in a collective (red: the straggler's). Each rank is shifted "
            "onto the first rank's clock by the collectives' ends, for drawing "
            f"only.</p>{timeline_svg(a, straggler)}<h2>Waits per collective</h2><p "
            "class='legend'>The shortest wait of each collective is the rank that arrived "
            f"last.</p>{waits_svg(a, straggler)}<h2>Per rank</h2>{table(a, straggler)}"
            + (f"<h2>Notes</h2><ul class='notes'>{notes}</ul>" if notes else "")
            + "</body></html>\n")
