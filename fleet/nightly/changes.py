"""What changed in each metric's history, and why: change points over the clean points, each labelled
code, environment or unexplained, and the contaminated points said and kept out. Pure, no I/O
(documented in docs/nightly.md, "Change points").

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

from dataclasses import dataclass, field

from .changepoints import Settings, change_points
from .environment import Environment, differences

CODE, ENVIRONMENT, UNEXPLAINED = "code", "environment", "unexplained"
WORKLOAD = "workload "
NEAR = 3  # points either side of a change point searched for what changed: a small step in noise is placed to within a few


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
    changed: tuple[str, ...]   # what changed there: the environment's values, or the workload's version
    recent: bool

    @property
    def code_too(self) -> bool:
        """The workload's version changed there too (an environment change that may be the code's)."""
        return any(what.startswith(WORKLOAD) for what in self.changed)


@dataclass(frozen=True)
class SeriesChanges:
    metric: str
    device: str
    points: int
    clean: int
    changes: list[Change] = field(default_factory=list)
    contaminated: list[tuple[str, list[str]]] = field(default_factory=list)   # (run, why), oldest first
    lately: tuple[str, ...] = ()   # what of the environment changed among the newest runs the thresholds judge

    @property
    def newest(self) -> Change | None:
        """The change the newest runs sit after, where it is recent."""
        return self.changes[-1] if self.changes and self.changes[-1].recent else None


def _changed(a: Point, b: Point) -> list[str]:
    """What fleet recorded as different between two runs: the environment's values, then the workload's version."""
    found = differences(a.environment, b.environment)
    va, vb = a.environment.workload_version, b.environment.workload_version
    return found + ([f"{WORKLOAD}{va} -> {vb}"] if va and vb and va != vb else [])


def label(clean: list[Point], index: int, lo: int = 0, hi: int | None = None) -> tuple[str, tuple[str, ...]]:
    """(label, what changed) of a change between clean[index - 1] and clean[index]. What changed at that
    very pair decides; where nothing did, the pairs up to NEAR either side, within the segments either
    side of the change (``lo``, ``hi``: the change points before and after it), since a small step in
    noise is placed to within a few runs."""
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
    """What of the environment changed between the baseline's last clean run and the ``newest`` after it:
    a threshold verdict on those runs judges the environment, not the code, where this is not empty."""
    tail = clean[-(newest + 1):]
    return tuple(dict.fromkeys(d for a, b in zip(tail, tail[1:]) for d in differences(a.environment, b.environment)))


def judge_series(metric: str, device: str, points: list[Point], settings: Settings = Settings(),
                 recent: int = 7, newest: int = 2) -> SeriesChanges:
    """The changes of one metric on one device; ``points`` oldest first; ``newest``: how many of the
    newest clean runs the threshold verdict judges (the playbook's ``consecutive``)."""
    why = [(p, p.contaminated_by()) for p in points]
    clean = [p for p, reasons in why if not reasons]
    contaminated = [(p.run_id, reasons) for p, reasons in why if reasons]
    found = []
    cuts = change_points([p.value for p in clean], settings)
    edges = [0, *(cp.index for cp in cuts), len(clean)]
    for n, cp in enumerate(cuts):
        kind, changed = label(clean, cp.index, edges[n], edges[n + 2])
        found.append(Change(clean[cp.index - 1].run_id, clean[cp.index].run_id, clean[cp.index].started,
                            cp.before, cp.after, cp.rel, cp.p_value, kind, changed,
                            recent=len(clean) - cp.index <= recent))
    return SeriesChanges(metric, device, len(points), len(clean), found, contaminated, _lately(clean, newest))


def slowdowns(series: list[SeriesChanges], kind: str) -> list[SeriesChanges]:
    """The series whose newest, recent change is a slowdown labelled ``kind``."""
    return [s for s in series if s.newest is not None and s.newest.rel > 0 and s.newest.label == kind]
