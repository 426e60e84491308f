"""What changed in each metric's history, and why: change points over the clean points, each
labelled code, environment or unexplained, and the contaminated points said and kept out. Pure, no
I/O (documented in docs/nightly.md, "Change points").

* **contaminated**: a point with tenants or unseen memory on its GPU, profiler flags given up, or
  clocks held down by heat or the hardware while it ran. It is kept out of detection (one such night
  fools any change-point method) and shown hollow; it is never a change.
* **environment**: the GPU model, the node, the driver, the profiler's or fleet's version, or the
  busy SM clock differs between the clean points either side of the change (at that pair; where
  nothing did, within ``NEAR`` runs of it, since a small step in noise is placed to within a few).
  The verdict names what changed.
* **code**: the workload's own version (the playbook's ``version`` command) changed there, and
  nothing of the environment did.
* **unexplained**: nothing fleet recorded changed there. A person must look at it.

A change is **recent** while the points after it are at most ``recent`` clean runs: it moved the
level the newest runs sit at, and it is news. Only a recent slowdown sets the exit status.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from .changepoints import KNOWN_ALPHA, Settings, change_points, holm, known_step
from .environment import Environment, differences

CODE, ENVIRONMENT, UNEXPLAINED = "code", "environment", "unexplained"
WORKLOAD = "workload "
# runs either side of a known change its test looks at, at most: the levels there, not a year's
KNOWN_SPAN = 20
NEAR = 3  # points either side of a change point searched for what changed: a small step in noise is
          # placed to within a few


@dataclass(frozen=True)
class Point:
    run_id: str
    started: str
    value: float
    environment: Environment
    flags: tuple[str, ...] = ()

    def contaminated_by(self) -> list[str]:
        return list(dict.fromkeys([*self.flags, *self.environment.contaminated_by()]))


@dataclass(frozen=True)
class Change:
    run_before: str        # the last clean run before the change
    run_after: str         # the first clean run after it
    started: str           # when run_after started
    before: float          # the median of the level before
    after: float           # the median of the level after
    rel: float
    p_value: float
    label: str
    # what changed there: the environment's values, or the workload's version
    changed: tuple[str, ...]
    recent: bool

    @property
    def code_too(self) -> bool:
        """The workload's version changed there too (an environment change that may be the
        code's)."""
        return any(what.startswith(WORKLOAD) for what in self.changed)


@dataclass(frozen=True)
class SeriesChanges:
    metric: str
    device: str
    points: int
    clean: int
    changes: list[Change] = field(default_factory=list)
    # (run, why), oldest first
    contaminated: list[tuple[str, list[str]]] = field(default_factory=list)
    # what of the environment changed among the newest runs the thresholds judge
    lately: tuple[str, ...] = ()
    least: float = 0.0             # the least change that counts (the playbook's thresholds.change)

    @property
    def newest(self) -> Change | None:
        """The change the newest runs sit after, where it is recent."""
        return self.changes[-1] if self.changes and self.changes[-1].recent else None

    def standing(self, kind: str) -> Change | None:
        """The newest recent slowdown labelled ``kind`` (code: also an environment change where the
        workload's version changed too) that the level the newest runs sit at has not undone: a
        later change (a faster driver, say) neither hides it nor, where it took it back, keeps it
        news."""
        for n in range(len(self.changes) - 1, -1, -1):
            c = self.changes[n]
            of_kind = c.label == kind or (kind == CODE and c.code_too)
            if (c.recent and c.rel > 0 and of_kind and c.before
                    and (self._now_but_environment(n) - c.before) / abs(c.before) >= self.least):
                return c
        return None

    def _now_but_environment(self, n: int) -> float:
        """The level the newest runs sit at, with the steps of the environment alone after change
        ``n`` taken out: a faster driver after a code regression does not undo the code's."""
        now = self.changes[-1].after
        for later in self.changes[n + 1:]:
            if later.label == ENVIRONMENT and not later.code_too and later.after:
                now *= later.before / later.after
        return now


def _changed(a: Point, b: Point) -> list[str]:
    """What fleet recorded as different between two runs: the environment's values, then the
    workload's version."""
    found = differences(a.environment, b.environment)
    va, vb = a.environment.workload_version, b.environment.workload_version
    return found + ([f"{WORKLOAD}{va} -> {vb}"] if va and vb and va != vb else [])


def label(clean: list[Point], index: int, lo: int = 0,
          hi: int | None = None) -> tuple[str, tuple[str, ...]]:
    """(label, what changed) of a change between clean[index - 1] and clean[index]. What changed at
    that very pair decides; where nothing did, the pairs up to NEAR either side, within the segments
    either side of the change (``lo``, ``hi``: the change points before and after it), since a small
    step in noise is placed to within a few runs."""
    hi = len(clean) if hi is None else hi
    at = _changed(clean[index - 1], clean[index])
    if not at:
        near = range(max(lo + 1, index - NEAR), min(hi, index + NEAR + 1))
        at = [what for j in near for what in _changed(clean[j - 1], clean[j])]
    at = list(dict.fromkeys(at))
    if any(not what.startswith(WORKLOAD) for what in at):
        return ENVIRONMENT, tuple(at)
    return (CODE, tuple(at)) if at else (UNEXPLAINED, ())


def _lately(clean: list[Point], newest: int) -> tuple[str, ...]:
    """What of the environment changed between the baseline's last clean run and the ``newest``
    after it:
    a threshold verdict on those runs judges the environment, not the code, where this is not
    empty."""
    tail = clean[-(newest + 1):]
    return tuple(dict.fromkeys(d for a, b in zip(tail, tail[1:])
                               for d in differences(a.environment, b.environment)))


def _known_cuts(clean: list[Point], min_size: int) -> list[int]:
    """Where the environment or the workload's version changed between clean runs and stayed so for
    ``min_size`` runs either side: the places fleet can name beforehand. One night on another clock
    is no stretch of its own, nor is a version a night."""
    at = [i for i in range(1, len(clean)) if _changed(clean[i - 1], clean[i])]
    edges = [0, *at, len(clean)]
    return [i for n, i in enumerate(at, 1) if i - edges[n - 1] >= min_size
            and edges[n + 1] - i >= min_size]


def _cuts(values: list[float], known: list[int], settings: Settings,
          versions: set[int] = frozenset()) -> dict[int, float]:
    """The change points of a series, each with its p-value. First those a search over the whole
    series finds; then each place the environment or the workload's version changed, away from
    those, tested on its own (:func:`_known_steps`); then a search again within each stretch between
    them; then each searched change put at a recorded place near it, and each tested step that no
    longer shows dropped. A change of the environment that comes and goes (four nights on locked
    clocks, then restored) leaves no split of the whole series significant, and so hides a step of
    the code after it."""
    searched = {cp.index: cp.p_value for cp in change_points(values, settings)}
    steps = _known_steps(values, known, searched, settings, versions)
    found = {**searched, **{i: step.p_value for i, step in steps.items()}}
    edges = sorted({0, len(values), *found})
    for lo, hi in zip(edges, edges[1:]):
        found.update({lo + cp.index: cp.p_value for cp in change_points(values[lo:hi], settings)})
    found = _snapped(found, known)
    while failing := [i for i in steps if i in found and not _holds(values, found, i, steps[i],
                                                                    settings)]:
        # one at a time: the others judged anew
        del found[min(failing, key=lambda i: abs(steps[i].rel))]
    return dict(sorted(found.items()))


def _known_steps(values: list[float], known: list[int], searched: dict[int, float],
                 settings: Settings, versions: set[int]) -> dict:
    """The steps at the known places away from the searched changes that hold together (Holm)."""
    # else a searched change is its place
    tested = [i for i in known if all(abs(i - j) > NEAR for j in searched)]
    around = sorted({0, len(values), *searched, *known})
    steps = {}
    for i in tested:
        lo = max(around[around.index(i) - 1], i - KNOWN_SPAN)
        hi = min(around[around.index(i) + 1], i + KNOWN_SPAN)
        step = known_step(values[lo:hi], i - lo, settings)
        if step is not None:
            steps[i] = step
    # the tests of all the places
    held = holm({i: step.p_value for i, step in steps.items()}, KNOWN_ALPHA)
    # where the workload's version changed, a slowdown may be called the code's (exit 7): such a
    # step must also pass the search's own level, so weekly deployments in noise raise no false
    # alarm
    return {i: step for i, step in steps.items() if i in held
            and (i not in versions or step.p_value < settings.alpha)}


def _snapped(found: dict[int, float], known: list[int]) -> dict[int, float]:
    """Each searched change within NEAR runs of a place fleet recorded moved to that place: a step
    in noise is placed to within a few runs, and the place is where it is (its run, its medians, how
    long it has been recent)."""
    out = {}
    for i, p in sorted(found.items()):
        close = [k for k in known if abs(k - i) <= NEAR and k not in found]
        out[min(close, key=lambda k: abs(k - i)) if i not in known and close else i] = p
    return out


def _holds(values: list[float], found: dict[int, float], i: int, step, settings: Settings) -> bool:
    """Whether a step tested at a known place still shows between its neighbouring change points:
    the levels either side differ by the least change, the same way."""
    edges = sorted({0, len(values), *found})
    at = edges.index(i)
    before, after = statistics.median(values[edges[at
                                                   - 1]:i]), statistics.median(values[i:edges[at
                                                                                              + 1]])
    rel = (after - before) / abs(before) if before else 0.0
    return abs(rel) >= settings.min_change and (rel > 0) == (step.rel > 0)


def judge_series(metric: str, device: str, points: list[Point], settings: Settings = Settings(),
                 recent: int = 7, newest: int = 2) -> SeriesChanges:
    """The changes of one metric on one device; ``points`` oldest first; ``newest``: how many of the
    newest clean runs the threshold verdict judges (the playbook's ``consecutive``)."""
    why = [(p, p.contaminated_by()) for p in points]
    clean = [p for p, reasons in why if not reasons]
    contaminated = [(p.run_id, reasons) for p, reasons in why if reasons]
    values = [p.value for p in clean]
    known = _known_cuts(clean, settings.min_size)
    versions = {i for i in known if any(what.startswith(WORKLOAD) for what in _changed(clean[i - 1],
                                                                                       clean[i]))}
    cuts = _cuts(values, known, settings, versions)
    edges = [0, *cuts, len(clean)]
    found = []
    for n, (index, p_value) in enumerate(cuts.items()):
        before, after = (statistics.median(values[edges[n]:index]),
                         statistics.median(values[index:edges[n + 2]]))
        kind, changed = label(clean, index, edges[n], edges[n + 2])
        found.append(Change(clean[index - 1].run_id, clean[index].run_id, clean[index].started,
                            before, after,
                            (after - before) / abs(before) if before else 0.0, p_value, kind,
                            changed, recent=len(clean) - index <= recent))
    return SeriesChanges(metric, device, len(points), len(clean), found, contaminated,
                         _lately(clean, newest), settings.min_change)


def slowdowns(series: list[SeriesChanges], kind: str) -> list[tuple[SeriesChanges, Change]]:
    """Each series with a recent slowdown labelled ``kind`` that still stands, and that change."""
    return [(s, c) for s in series for c in [s.standing(kind)] if c is not None
            and (kind == CODE or not c.code_too)]
