"""What changed in each metric's history, and why: change points over the clean points, each labelled
code, environment or unexplained, and the contaminated points said and kept out. Pure, no I/O
(documented in docs/nightly.md, "Change points").

* **contaminated**: a point with tenants or unseen memory on its GPU, profiler flags given up, or
  clocks held down by power or heat while it ran. It is kept out of detection (one such night
  fools any change-point method) and shown hollow; it is never a change.
* **environment**: the GPU, its UUID, the node, the driver, the profiler's or fleet's version, or the
  busy SM clock differs between the clean points either side of the change (within ``NEAR`` points
  of it, since a small step is placed to within a point or two). The verdict names what changed.
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


def _near(clean: list[Point], index: int) -> range:
    """The indices j whose pair (j - 1, j) is within NEAR of the change at ``index``."""
    return range(max(1, index - NEAR), min(len(clean), index + NEAR + 1))


def label(clean: list[Point], index: int) -> tuple[str, tuple[str, ...]]:
    """(label, what changed) of a change between clean[index - 1] and clean[index]."""
    environment, versions = [], []
    for j in _near(clean, index):
        a, b = clean[j - 1].environment, clean[j].environment
        environment += differences(a, b)
        if a.workload_version and b.workload_version and a.workload_version != b.workload_version:
            versions.append(f"workload {a.workload_version} -> {b.workload_version}")
    environment, versions = list(dict.fromkeys(environment)), list(dict.fromkeys(versions))
    if environment:
        return ENVIRONMENT, tuple(environment + versions)
    if versions:
        return CODE, tuple(versions)
    return UNEXPLAINED, ()


def _lately(clean: list[Point], newest: int) -> tuple[str, ...]:
    """What of the environment changed between the baseline's last clean run and the ``newest`` after it:
    a threshold verdict on those runs judges the environment, not the code, where this is not empty."""
    tail = clean[-(newest + 1):]
    return tuple(dict.fromkeys(d for a, b in zip(tail, tail[1:]) for d in differences(a.environment, b.environment)))


def judge_series(metric: str, device: str, points: list[Point], settings: Settings = Settings(),
                 recent: int = 7, newest: int = 2) -> SeriesChanges:
    """The changes of one metric on one device; ``points`` oldest first; ``newest``: how many of the
    newest clean runs the threshold verdict judges (the playbook's ``consecutive``)."""
    clean = [p for p in points if not p.contaminated_by()]
    contaminated = [(p.run_id, p.contaminated_by()) for p in points if p.contaminated_by()]
    found = []
    for cp in change_points([p.value for p in clean], settings):
        kind, changed = label(clean, cp.index)
        found.append(Change(clean[cp.index - 1].run_id, clean[cp.index].run_id, clean[cp.index].started,
                            cp.before, cp.after, cp.rel, cp.p_value, kind, changed,
                            recent=len(clean) - cp.index <= recent))
    return SeriesChanges(metric, device, len(points), len(clean), found, contaminated, _lately(clean, newest))


def slowdowns(series: list[SeriesChanges], kind: str) -> list[SeriesChanges]:
    """The series whose newest, recent change is a slowdown labelled ``kind``."""
    return [s for s in series if s.newest is not None and s.newest.rel > 0 and s.newest.label == kind]
