"""One trend plot of the nightly report as inline SVG: a dated x axis (the runs' start
times), a y axis with ticks in the metric's unit, the baseline and the thresholds around
it, and a marker where the driver, the profiler's version or the host changed."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

from ..kernelnames import short_names
from ..visible import html_text
from .changes import CODE, ENVIRONMENT, UNEXPLAINED
from .trends import INSUFFICIENT, NO_CHANGE, REGRESSION, SUSPICIOUS, Verdict

COLOURS = {REGRESSION: "#c0392b", SUSPICIOUS: "#d68910", NO_CHANGE: "#1e8449",
           INSUFFICIENT: "#7f8c8d"}
W, H = 760, 250
LEFT, RIGHT, TOP, BOTTOM = 78, 44, 34, 40


def scale(metric: str) -> tuple[float, str]:
    """nsys metrics are nanoseconds, shown in ms; an ncu metric carries its unit in its label
    ("ncu NAME (unit)"). Only an ncu label: a kernel's name ends in "(...)" too, as in
    "void cutlass::Kernel2<...>(T1::Params)"."""
    unit = metric.rsplit("(",
                         1)[1].rstrip(")") if metric.startswith("ncu ") and metric.endswith(
                             ")") else None
    if unit is not None and not UNIT.fullmatch(unit):
        return 1.0, "?"  # a metric's name is a node's data: a unit that is not one is not shown
    return (1.0, unit) if unit else (1e6, "ms")


# ncu's units: nsecond, byte/second, %, cycle/usecond, inst
UNIT = re.compile(r"[A-Za-z0-9%/_. -]{1,32}")
# a kernel or top_kernels metric's label: "kernel " and the glob, or the kernel's name
KERNEL = "kernel "


def shown_metrics(metrics) -> dict[str, str]:
    """Each metric's label as a person reads it: a ``top_kernels`` metric, labelled ``kernel NAME``
    after its kernel's full name, with the kernel's short name (tagged where two would read
    alike). A glob (``kernel *gemm*``) and every other label are kept."""
    metrics = list(metrics)
    short = short_names(m[len(KERNEL):] for m in metrics if m.startswith(KERNEL))
    return {m: KERNEL + short[m[len(KERNEL):]] if m.startswith(KERNEL) else m for m in metrics}


def shown_metric(metric: str) -> str:
    return shown_metrics([metric])[metric]


def with_tooltip(shown: str, full: str) -> str:
    """``shown``, escaped; where it is not ``full``, in a span whose tooltip is ``full``."""
    if shown == full:
        return html_text(shown)
    return f'<span class="short-name" title="{html_text(full)}">{html_text(shown)}</span>'


def time_labels(times: list[datetime]) -> tuple[str, str]:
    """(strftime format of the x ticks, the axis caption): dates for a history of days, the time
    of day for runs within a day (with seconds within an hour): runs nights apart and runs
    minutes apart both read as what they are."""
    span = (max(times) - min(times)).total_seconds()
    zone = min(times).strftime("%Z") or "local time"
    if span >= 2 * 86400:
        return "%Y-%m-%d", "run started (date)"
    if min(times).date() != max(times).date():
        return "%m-%d %H:%M", f"run started (month-day time, {zone})"
    return ("%H:%M:%S" if span < 3600
            else "%H:%M"), f"run started on {min(times):%Y-%m-%d} ({zone})"


def when(started: str | None) -> datetime | None:
    """A run's ``started`` (as manifests write it: 2026-11-01T02:00:00+0000, or shorter)."""
    if not started:
        return None
    for parse in (datetime.fromisoformat, lambda s: datetime.strptime(s, "%Y-%m-%dT%H:%M:%S%z")):
        try:
            t = parse(started)
            return t.replace(tzinfo=None) if t.tzinfo is None else t
        except ValueError:
            continue
    return None


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values (1, 2, 5 times a power of ten apart) from ``lo`` to ``hi``."""
    raw = (hi - lo) / max(count, 1) or abs(hi) or 1.0
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def thresholds_of(verdict: Verdict, t: dict) -> tuple[float, float] | None:
    """(suspicious, regression) levels above the baseline, in the metric's raw unit."""
    if verdict.baseline is None:
        return None
    return verdict.baseline * (1 + t["suspicious"]), verdict.baseline * (1 + t["regression"])


def changes(points: list[dict], runs: dict[str, dict]) -> list[tuple[int, str]]:
    """(index, what changed) for each point whose run's driver, profiler version or host
    differs from the run before it in this series."""
    out, before = [], None
    for i, p in enumerate(points):
        info = runs.get(p["run_id"], {})
        now = {k: info.get(k) for k in ("driver", "tool_version", "host")}
        if before is not None:
            what = [f"{label} {before[k]} → {now[k]}" for k, label in
                    (("driver", "driver"), ("tool_version", "nsys"), ("host", "host"))
                    if before[k] and now[k] and before[k] != now[k]]
            if what:
                out.append((i, "; ".join(what)))
        before = now
    return out


@dataclass
class Axes:
    """Where each run's point goes: its value in the shown unit, its place along the x axis
    (0 to 1: by start time where every run has a distinct one, else by order), the y range."""
    values: list[float]
    div: float
    unit: str
    lo: float
    hi: float
    ticks: list[float]
    times: list[datetime | None]
    dated: bool
    frac: list[float]

    def x(self, f: float) -> float:
        return LEFT + (W - LEFT - RIGHT) * f

    def y(self, v: float) -> float:
        return H - BOTTOM - (H - TOP - BOTTOM) * (v - self.lo) / (self.hi - self.lo)


def axes(points: list[dict], verdict: Verdict, level: tuple[float, float] | None,
         runs: dict[str, dict]) -> Axes:
    div, unit = scale(verdict.metric)
    values = [p["value"] / div for p in points]
    marks = values + ([verdict.baseline / div, level[1] / div] if level else [])
    lo, hi = min(marks), max(marks)
    span = (hi - lo) or max(abs(hi), 1.0) * 0.1
    lo, hi = lo - span * 0.08, hi + span * 0.08
    ticks = nice_ticks(lo, hi)
    lo, hi = min(lo, ticks[0]), max(hi, ticks[-1])
    times = [when(runs.get(p["run_id"], {}).get("started") or p.get("started")) for p in points]
    dated = all(times) and len(set(times)) == len(times) and len({t.tzinfo is None
                                                                  for t in times}) == 1
    if dated and times[0].tzinfo is not None:  # one zone on one axis (sites, daylight saving)
        times = [t.astimezone(times[0].tzinfo) for t in times]
    if dated:
        t0, t1 = min(times), max(times)
        frac = [((tm - t0).total_seconds() / max((t1 - t0).total_seconds(), 1)) for tm in times]
    else:
        frac = [i / max(len(points) - 1, 1) for i in range(len(points))]
    return Axes(values, div, unit, lo, hi, ticks, times, dated, frac)


def plot(points: list[dict], verdict: Verdict, t: dict, runs: dict[str, dict], found=None) -> str:
    """``found``: the series' change points (:class:`.changes.SeriesChanges`), marked where they
    are, its contaminated runs drawn hollow."""
    level = thresholds_of(verdict, t)
    a = axes(points, verdict, level, runs)
    label = html_text(f"{shown_metric(verdict.metric)} on {verdict.device}")
    parts = [f'<svg class="plot" role="img" width="{W}" height="{H}" viewBox="0 0 '
             f'{W} {H}" aria-label="{label}">',
             # the kernel's full name
             f'<title>{html_text(f"{verdict.metric} on {verdict.device}")}</title>',
             f'<rect x="0" y="0" width="{W}" height="{H}" fill="#fbfbfb" stroke="#ddd"/>']
    if level:
        parts += bands(a, verdict, t, level)
    parts += y_axis(a) + x_axis(a) + change_markers(a, changes(points, runs))
    if found is not None:
        parts += change_point_markers(a, points, found)
    kept_out = dict(found.contaminated) if found is not None else {}
    parts += trend(a, points, COLOURS[verdict.verdict], kept_out)
    parts.append("</svg>")
    return "".join(parts)


def bands(a: Axes, verdict: Verdict, t: dict, level: tuple[float, float]) -> list[str]:
    """Between the suspicious and the regression level, and above it; the baseline dashed."""
    s, r, b = (a.y(v / a.div) for v in (*level, verdict.baseline))
    return [f'<rect class="band suspicious" x="{LEFT}" y="{r:.1f}" width="{W - LEFT - RIGHT}" '
            f'height="{max(s - r, 0):.1f}" fill="#f5cba7" fill-opacity="0.5"><title>suspicious: '
            f'more than {t["suspicious"]:.0%} over the baseline</title></rect>',
            f'<rect class="band regression" x="{LEFT}" y="{TOP}" width="{W - LEFT - RIGHT}" '
            f'height="{max(r - TOP, 0):.1f}" fill="#f1948a" fill-opacity="0.25"><title>regression: '
            f'more than {t["regression"]:.0%} over the baseline</title></rect>',
            f'<text class="band-label" x="{W - RIGHT - 4}" y="{r - 3:.1f}" font-size="10" '
            f'fill="#a93226" text-anchor="end">+{t["regression"]:.0%} regression</text>',
            f'<text class="band-label" x="{W - RIGHT - 4}" y="{s - 3:.1f}" font-size="10" '
            f'fill="#9c640c" text-anchor="end">+{t["suspicious"]:.0%} suspicious</text>',
            f'<line class="baseline" x1="{LEFT}" x2="{W - RIGHT}" y1="{b:.1f}" y2="{b:.1f}" '
            f'stroke="#555" stroke-dasharray="5 3"/><text class="band-label" x="{W - RIGHT - 4}" '
            f'y="{b + 12:.1f}" font-size="10" fill="#555" text-anchor="end">baseline '
            f'{verdict.baseline / a.div:.4g} {a.unit}</text>']


def y_axis(a: Axes) -> list[str]:
    """Ticks, grid and the unit."""
    parts = ([f'<line class="axis" x1="{LEFT}" x2="{LEFT}" y1="{TOP}" '
              f'y2="{H - BOTTOM}" stroke="#333"/>'])
    for v in a.ticks:
        parts.append(f'<line x1="{LEFT - 4}" x2="{W - RIGHT}" y1="{a.y(v):.1f}" y2="{a.y(v):.1f}" '
                     f'stroke="#e5e5e5"/><text class="ytick" x="{LEFT - 6}" y="{a.y(v) + 3.5:.1f}" '
                     f'font-size="11" fill="#333" text-anchor="end">{v:.4g}</text>')
    parts.append(f'<text class="yunit" x="14" y="{(TOP + H - BOTTOM) / 2:.1f}" font-size="11" '
                 'fill="#333" text-anchor="middle" transform="rotate(-90 14 '
                 f'{(TOP + H - BOTTOM) / 2:.1f})">{html_text(a.unit)}</text>')
    return parts


def x_axis(a: Axes) -> list[str]:
    """A tick at each run, a date label on as many as fit."""
    parts = [f'<line class="axis" x1="{LEFT}" x2="{W - RIGHT}" y1="{H - BOTTOM}" y2="{H - BOTTOM}" '
             'stroke="#333"/>']
    fmt, caption = time_labels(a.times) if a.dated else ("", "run")
    count = len(a.frac)
    every = max(1, math.ceil(count / ((W - LEFT - RIGHT) // 62)))
    for i, f in enumerate(a.frac):
        parts.append(f'<line x1="{a.x(f):.1f}" x2="{a.x(f):.1f}" y1="{H - BOTTOM}" '
                     f'y2="{H - BOTTOM + 4}" stroke="#333"/>')
        if i % every == 0 or i == count - 1 and (i % every) * 2 >= every:
            text = a.times[i].strftime(fmt) if a.dated else f"run {i + 1}"
            parts.append(f'<text class="xtick" x="{a.x(f):.1f}" y="{H - BOTTOM + 16}" '
                         f'font-size="11" fill="#333" text-anchor="middle">{text}</text>')
    parts.append(f'<text x="{(LEFT + W - RIGHT) / 2:.1f}" y="{H - 6}" font-size="11" fill="#555" '
                 f'text-anchor="middle">{html_text(caption)}</text>')
    return parts


def change_markers(a: Axes, found: list[tuple[int, str]]) -> list[str]:
    """A change of driver, nsys or host: a vertical marker between the two runs."""
    parts = []
    for i, what in found:
        cx = (a.x(a.frac[i - 1]) + a.x(a.frac[i])) / 2
        parts.append(f'<g class="change"><line x1="{cx:.1f}" x2="{cx:.1f}" y1="{TOP - 14}" '
                     f'y2="{H - BOTTOM}" stroke="#2e86c1" stroke-width="1.5" stroke-dasharray="2 '
                     f'2"/><text class="change-label" x="{cx + (4 if cx < W * 0.6 else -4):.1f}" '
                     f'y="{TOP - 6:.1f}" font-size="11" fill="#1b4f72" '
                     f'text-anchor="{"start" if cx < W * 0.6 else "end"}">{html_text(what)}</text>'
                     f'<title>{html_text(what)}</title></g>')
    return parts


LABEL_COLOURS = {CODE: "#c0392b", ENVIRONMENT: "#2e86c1", UNEXPLAINED: "#8e44ad"}


def change_point_markers(a: Axes, points: list[dict], found) -> list[str]:
    """Each change point: a solid line before the first run after it, in its label's colour, with
    its size and label."""
    where = {p["run_id"]: i for i, p in enumerate(points)}
    parts = []
    for c in found.changes:
        before, after = where.get(c.run_before), where.get(c.run_after)
        if before is None or after is None:
            continue
        cx = (a.x(a.frac[before]) + a.x(a.frac[after])) / 2  # between the clean runs either side
        colour, text = LABEL_COLOURS[c.label], f"{c.rel:+.1%} {c.label}"
        what = f"change point: {text}" + (f" ({'; '.join(c.changed)})" if c.changed
                                          else "") + f", p={c.p_value:.3g}"
        parts.append(f'<g class="change-point {c.label}"><line x1="{cx:.1f}" x2="{cx:.1f}" '
                     f'y1="{TOP}" y2="{H - BOTTOM}" stroke="{colour}" stroke-width="2"/><text '
                     f'class="change-point-label" x="{cx + 4:.1f}" y="{TOP + 12:.1f}" '
                     f'font-size="11" fill="{colour}">{html_text(text)}</text>'
                     f"<title>{html_text(what)}</title></g>")
    return parts


def trend(a: Axes, points: list[dict], colour: str,
          kept_out: dict[str, list[str]] | None = None) -> list[str]:
    """The line through the runs, and a point for each (hollow where the run gave flags up or was
    kept out of change-point detection as contaminated)."""
    line = " ".join(f"{a.x(f):.1f},{a.y(v):.1f}" for f, v in zip(a.frac, a.values))
    parts = ([f'<polyline class="trend" points="{line}" fill="none" '
              f'stroke="{colour}" stroke-width="2"/>'])
    for f, p, v, tm in zip(a.frac, points, a.values, a.times):
        flags = [str(f) for f in p.get("flags") or []] or (kept_out or {}).get(p["run_id"], [])
        title = html_text(f"{p['run_id']}" + (f" ({tm:%Y-%m-%d %H:%M})" if tm else "")
                          + f": {v:.4g} {a.unit}"
                            + ("; " + "; ".join(flags) if flags else ""))
        parts.append(f'<circle class="point" cx="{a.x(f):.1f}" cy="{a.y(v):.1f}" r="4" '
                     f'fill="{"#fff" if flags else colour}" stroke="{"#999" if flags else colour}">'
                     f'<title>{title}</title></circle>')
    return parts
