"""The nightly report as one static HTML page: inline SVG plots, no script, no server.

It opens from disk. Each (metric, device) gets a trend plot (:mod:`.report_plot`): one
point per run on a dated axis, flagged runs (tenants, flags given up) drawn hollow and
grey, the baseline and the suspicious and regression thresholds around it, and a marker
where the driver, nsys or the host changed. A Regression or Suspicious verdict lists the
kernels that moved most between the baseline run and the judged one; a playbook with several
ranks has its runs' straggler shares (:mod:`.stragglers`); each playbook ends
with its runs, linked (relative to the page) to their folders and reports in the store.
Kernel names are shown short (:mod:`fleet.kernelnames`), each with its full name as its tooltip.
"""

from __future__ import annotations

import os
from pathlib import Path

from . import stragglers
from ..kernelnames import short_names
from ..visible import html_href, html_text
from .report_plot import (COLOURS, LABEL_COLOURS, changes, plot, scale, shown_metrics, when,
                          with_tooltip)
from .trends import REGRESSION, SUSPICIOUS, Verdict

__all__ = ["render", "scale", "COLOURS"]
TOP_KERNELS = 8

STYLE = ("body{font-family:sans-serif;margin:2em;color:#222;"
         "max-width:1000px}table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid "
         "#ccc;padding:3px "
         "8px;text-align:left;font-size:13px}th{background:#f3f3f3}section{margin:1.5em "
         "0}td.num{text-align:right;font-variant-numeric:tabular-nums}tr.flagged "
         "td{color:#888}.slower{color:#a93226}.faster{color:#1e8449}.legend{font-size:13px;"
         "color:#444}.kernel{font-family:monospace;font-size:12px;max-width:520px;"
         "overflow-wrap:anywhere}caption{text-align:left;font-size:13px;color:#444;padding:2px 0}"
         # kernel names run to 150 characters without a space (cuBLAS, CUTLASS templates)
         "h3,.verdicts td:first-child,.changes td:first-child{overflow-wrap:anywhere}"
         ".verdicts td:first-child{max-width:440px}.changes td:first-child{max-width:300px}")

LEGEND = ("<p class='legend'>Points: one a run, on the date it started. Hollow grey points: runs "
          "with tenants on the GPU or profiler flags given up; they are shown but not used for the "
          "baseline or the verdict. Dashed grey line: the baseline; orange band: suspicious (over "
          "the suspicious threshold); red band: regression (over the regression threshold). Dotted "
          "blue line: the driver, the nsys version or the host changed between the two runs either "
          "side of it.</p>")


def _ms(ns: float) -> str:
    return f"{ns / 1e6:.3f}"


def _moved(compared: tuple[str, str, list[dict]] | None, link) -> str:
    """The kernels that moved most from the baseline run to the judged run."""
    if compared is None:
        return ""
    base, latest, rows = compared
    head = (f"<caption>Kernels that moved most from the baseline run {link(base)} to "
            f"{link(latest)} (total time over all hosts)</caption>")
    if not rows:
        return (f'<table class="moved">{head}<tr><td>no kernel summaries (cuda_gpu_kern_sum) '
                'catalogued for '
                f"these runs</td></tr></table>")
    body = (["<tr><th>kernel</th><th>baseline (ms)</th><th>now (ms)</th><th>change "
             "(ms)</th><th>change</th></tr>"])
    short = short_names(r["kernel"] for r in rows)
    for r in rows[:TOP_KERNELS]:
        cls = "slower" if r["change_ns"] > 0 else "faster" if r["change_ns"] < 0 else "same"
        rel = "new" if r["change"] is None else f"{r['change']:+.1%}"
        body.append(f'<tr class="moved-kernel {cls}"><td class="kernel" '
                    f'title="{html_text(r["kernel"])}">{html_text(short[r["kernel"]])}</td>'
                    f'<td class="num">{_ms(r["a_ns"])}</td><td class="num">{_ms(r["b_ns"])}</td>'
                    f'<td class="num">{r["change_ns"] / 1e6:+.3f}</td><td '
                    f'class="num">{rel}</td></tr>')
    return f'<table class="moved">{head}{"".join(body)}</table>'


def _moved_once(compared, shown_before: dict, metric: str, link) -> str:
    """The kernels that moved between two runs, once a page section: a later metric judged on the
    same two runs points back to it."""
    if compared is None:
        return ""
    pair = compared[:2]
    if pair in shown_before:
        return (f"<p class='moved-see-above'>Kernels that moved from {link(pair[0])} to "
                f"{link(pair[1])}: in the table under {html_text(shown_before[pair])} above.</p>")
    shown_before[pair] = metric
    return _moved(compared, link)


def _runs_table(run_ids: list[str], runs: dict[str, dict], link, out: Path) -> str:
    head = ("<table class='runs'><caption>Runs, oldest first: each links to its folder in the "
            "store, and to its "
            "reports</caption><tr><th>run</th><th>started</th><th>host</th><th>GPU</th><th>"
            "driver</th><th>nsys</th><th>reports</th></tr>")
    rows = []
    for run_id in run_ids:
        info = runs.get(run_id, {})
        reports = " ".join(f'<a class="report" href="{html_href(os.path.relpath(p, out))}">'
                           f"{html_text(Path(p).name)}</a>" for p in info.get("reports", []))
        tm = when(info.get("started"))
        cells = [tm.strftime("%Y-%m-%d %H:%M") if tm else info.get("started", ""), *(
            info.get(k) or "" for k in ("host", "gpu", "driver", "tool_version"))]
        rows.append(f'<tr class="run"><td>{link(run_id)}</td>'
                    + "".join(f"<td>{html_text(str(c))}</td>" for c in cells)
                    + f"<td>{reports}</td></tr>")
    return head + "".join(rows) + "</table>"


def _changes_table(found: list, link) -> str:
    """Every change point of the playbook's metrics, once each, and the runs kept out of
    detection."""
    shown = shown_metrics(s.metric for s in found)
    rows = [(s, c) for s in found for c in s.changes]
    body = ["<tr><th>metric</th><th>device</th><th>change</th><th>at "
            "run</th><th>before</th><th>after</th><th>p</th><th>what changed</th></tr>"]
    for s, c in rows:
        div, unit = scale(s.metric)
        recent = " (recent)" if c.recent else ""
        body.append('<tr class="change-row '
                    f'{c.label}"><td>{with_tooltip(shown[s.metric], s.metric)}</td>'
                    f"<td>{html_text(s.device)}</td><td "
                    f"style='color:{LABEL_COLOURS[c.label]};font-weight:bold'>{c.rel:+.1%} "
                    f"{c.label}{recent}</td><td>{link(c.run_after)}</td>"
                    f'<td class="num">{c.before / div:.4g} {unit}</td><td '
                    f'class="num">{c.after / div:.4g} {unit}</td><td '
                    f'class="num">{c.p_value:.3g}</td><td>'
                    f'{html_text("; ".join(c.changed) or "nothing recorded")}'
                    "</td></tr>")
    kept = {run: why for s in found for run, why in s.contaminated}
    caption = (f"<caption>Change points over each metric's clean runs ({len(rows)}), each labelled "
               f"code, environment or unexplained; {len(kept)} run(s) kept out as "
               "contaminated</caption>")
    table = f"<table class='changes'>{caption}{''.join(body) if rows else ''}</table>"
    if kept:
        table += "<ul class='kept-out'>" + "".join(f"<li>{link(run)}: "
                                                   f"{html_text('; '.join(why))}</li>"
                                                   for run, why in kept.items()) + "</ul>"
    return table


def _section(playbook: str, rows: list[dict], verdicts: list[Verdict], t: dict,
             compared: dict, shares: list[dict], found: list, runs: dict[str, dict], link,
             out: Path) -> str:
    series: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        series.setdefault((r["metric"], r["device"]), []).append(r)
    table = ["<table "
             "class='verdicts'><tr><th>metric</th><th>device</th><th>verdict</th><th>latest</th>"
             "<th>baseline</th><th>change</th><th>runs</th><th>note</th></tr>"]
    shown = shown_metrics(v.metric for v in verdicts)

    def metric(v: Verdict) -> str:
        return with_tooltip(shown[v.metric], v.metric)

    for v in verdicts:
        div, unit = scale(v.metric)
        fmt = lambda x: "" if x is None else f"{x / div:.4g} {unit}"
        table.append(f'<tr class="verdict"><td>{metric(v)}</td><td>{html_text(v.device)}</td>'
                     f'<td style="color:{COLOURS[v.verdict]};font-weight:bold">{v.verdict}</td>'
                     f"<td>{fmt(v.value)}</td><td>{fmt(v.baseline)}</td>"
                     f"<td>{'' if v.rel is None else f'{v.rel:+.1%}'}</td><td>{v.points}</td>"
                     f"<td>{html_text(v.note)}</td></tr>")
    table.append("</table>")
    by_series = {(f.metric, f.device): f for f in found}
    plots, moved_shown = [], {}
    for v in verdicts:
        points = series[(v.metric, v.device)]
        changed = "".join(f'<li class="change-note">{link(points[i - 1]["run_id"])} → '
                          f'{link(points[i]["run_id"])}: '
                          f"{html_text(what)}</li>" for i, what in changes(points, runs))
        plots.append(f'<section class="metric"><h3>{metric(v)} — {html_text(v.device)}: '
                     f'<span style="color:{COLOURS[v.verdict]}">{v.verdict}</span></h3>'
                     f"{plot(points, v, t, runs, by_series.get((v.metric, v.device)))}"
                     + (f"<ul class='changes'>{changed}</ul>" if changed else "")
                     + (_moved_once(compared.get((v.metric, v.device)), moved_shown,
                                    shown[v.metric], link)
                        if v.verdict in (REGRESSION, SUSPICIOUS) else "") + "</section>")
    run_ids = list(dict.fromkeys(r["run_id"] for r in rows))
    return (f"<h2>{html_text(playbook)}</h2>" + "".join(table) + _changes_table(found, link)
            + "".join(plots)
            + stragglers.table(shares, link) + _runs_table(run_ids, runs, link, out))


def render(sections: list[tuple], runs: dict[str, dict], out: Path) -> str:
    """One page for every playbook: (name, metric history, verdicts, thresholds, kernels
    compared: (metric, device) -> (baseline run, judged run, ``store.compare`` rows), straggler
    shares of its runs with several ranks (``stragglers.judged``)).
    ``runs``: run id -> {dir, started, host, gpu, driver, tool_version, reports}; folders
    and reports are linked relative to the page's folder ``out``."""
    def link(run_id: str) -> str:
        where = runs.get(run_id, {}).get("dir")
        if not where:
            return html_text(run_id)
        return ('<a class="run-link" '
                f'href="{html_href(os.path.relpath(where, out))}/">{html_text(run_id)}</a>')

    return ("<!doctype html><html><head><meta charset='utf-8'><title>fleet nightly report</title>"
            f"<style>{STYLE}</style></head><body><h1>fleet nightly report</h1>{LEGEND}"
            + "".join(_section(*s, runs, link, out) for s in sections)
            + "</body></html>\n")
