"""Synthetic nightly histories with a known truth, for the change points' tests and bench/changepoints.py.

Each history is a list of :class:`fleet.nightly.changes.Point` (one metric on one device, oldest first)
and the truth planted in it: where a change is, and what it should be labelled. The noise is
multiplicative and Gaussian, at two levels:

* ``H200_NOISE``: the spread of the reference playbook's total GPU kernel time over five runs one
  after another on an H200 test machine (``tests/fixtures/nightly-h200/``), read from those
  manifests here, not typed;
* ``NIGHT_NOISE``: 2 %, the spread the issue's synthetic series used for nights on a shared machine
  (other jobs, other clocks, other data placement), much the larger.

Nothing here knows fleet's rules: a tenant is a flag on a night and a value pushed up, a throttled
night is a clock reason and a lower clock, a driver update is a new driver string.
"""

from __future__ import annotations

import json
import random
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from fleet.nightly.changes import Point
from fleet.nightly.environment import Environment

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "nightly-h200" / "lab"
NIGHT_NOISE = 0.02
NIGHTS, AT = 60, 40   # 60 nights, a planted change at night 40


def h200_noise() -> float:
    """The relative spread of the clean runs' total GPU kernel time in the recorded H200 history."""
    values = []
    for path in sorted(FIXTURE.glob("*/*/manifest.json")):
        for row in json.loads(path.read_text())["playbook"]["metrics"]:
            if row["metric"] == "total GPU kernel time" and not row["flags"]:
                values.append(row["value"])
    first = values[:5]  # the last two runs carry the planted slowdown
    return statistics.stdev(first) / statistics.mean(first)


@dataclass(frozen=True)
class Truth:
    at: int | None          # the planted change's first night (None: no change)
    label: str | None       # what it should be labelled
    contaminated: tuple[int, ...] = ()   # nights that must be kept out


BASE = Environment(gpu="NVIDIA H200", gpu_uuid="GPU-5a1e", driver="580.95.05", tool_version="2025.3.1.0",
                   fleet_version="0.1.0", node="gx-01", sm_clock_mhz=1980.0, workload_version="v1")


def _nights(rng: random.Random, noise: float, nights: int = NIGHTS) -> list[float]:
    return [1.0e9 * (1 + rng.gauss(0, noise)) for _ in range(nights)]


def _points(values: list[float], environments: list[Environment], flags: dict[int, tuple[str, ...]]) -> list[Point]:
    return [Point(f"run-{i:03d}", f"2026-10-{1 + i // 2:02d}T0{i % 2}:00:00+0000", v, environments[i], flags.get(i, ()))
            for i, (v) in enumerate(values)]


def pure_noise(seed: int, noise: float = NIGHT_NOISE) -> tuple[list[Point], Truth]:
    rng = random.Random(seed)
    return _points(_nights(rng, noise), [BASE] * NIGHTS, {}), Truth(None, None)


def step(seed: int, kind: str, size: float = 0.05, noise: float = NIGHT_NOISE) -> tuple[list[Point], Truth]:
    """A slowdown of ``size`` from night AT on: with the workload's version changed there ("code"),
    with the driver changed there ("environment"), or with nothing recorded changed ("unexplained")."""
    rng = random.Random(seed)
    values = [v * (1 + size) if i >= AT else v for i, v in enumerate(_nights(rng, noise))]
    after = {"code": replace(BASE, workload_version="v2"), "environment": replace(BASE, driver="580.159.04"),
             "unexplained": BASE}[kind]
    return _points(values, [BASE] * AT + [after] * (NIGHTS - AT), {}), Truth(AT, kind)


def neighbours(seed: int, nights: tuple[int, ...] = (12, 30, 47), noise: float = NIGHT_NOISE) -> tuple[list[Point], Truth]:
    """Pure noise but for nights with a neighbour on the GPU: 15 to 30 % slower, and flagged."""
    rng = random.Random(seed)
    values = _nights(rng, noise)
    for i in nights:
        values[i] *= 1 + rng.uniform(0.15, 0.30)
    flags = {i: (f"tenant: GPU 0: pid {4000 + i} (bob)",) for i in nights}
    return _points(values, [BASE] * NIGHTS, flags), Truth(None, None, nights)


def throttling(seed: int, first: int = 20, last: int = 25, noise: float = NIGHT_NOISE) -> tuple[list[Point], Truth]:
    """Nights ``first`` to ``last`` on a GPU held down by heat: 12 % slower, a lower clock, the reason seen."""
    rng = random.Random(seed)
    values = [v * 1.12 if first <= i < last else v for i, v in enumerate(_nights(rng, noise))]
    hot = replace(BASE, sm_clock_mhz=1700.0, throttled=("hw_thermal_slowdown",))
    environments = [hot if first <= i < last else BASE for i in range(NIGHTS)]
    return _points(values, environments, {}), Truth(None, None, tuple(range(first, last)))


def outlier(seed: int, night: int = 30, noise: float = NIGHT_NOISE) -> tuple[list[Point], Truth]:
    """One night 15 % slower that nothing flagged (a neighbour fleet could not see)."""
    rng = random.Random(seed)
    values = _nights(rng, noise)
    values[night] *= 1.15
    return _points(values, [BASE] * NIGHTS, {}), Truth(None, None)


SCENARIOS = {
    "code step +5%": lambda seed: step(seed, "code"),
    "driver change +5%": lambda seed: step(seed, "environment"),
    "unexplained step +5%": lambda seed: step(seed, "unexplained"),
    "nights with a neighbour": neighbours,
    "throttling GPU": throttling,
    "pure noise": pure_noise,
    "one unflagged +15% night": outlier,
}
TOLERANCE = 3  # nights a found change may be from the planted one


@dataclass
class Score:
    series: int = 0
    planted: int = 0            # series with a planted change
    found: int = 0              # change points found, over all series
    right: int = 0              # found within TOLERANCE of the planted one, with its label
    placed: int = 0             # found within TOLERANCE, whatever the label
    kept_out_wrong: int = 0     # series whose contaminated nights were not exactly those planted

    @property
    def precision(self) -> float | None:
        return self.right / self.found if self.found else None

    @property
    def recall(self) -> float | None:
        return self.right / self.planted if self.planted else None

    @property
    def false_per_100(self) -> float:
        return 100 * (self.found - self.placed) / self.series


def score(make, seeds, judge) -> Score:
    """``judge(points)`` -> :class:`fleet.nightly.changes.SeriesChanges` for each seeded history of ``make``."""
    s = Score()
    for seed in seeds:
        points, truth = make(seed)
        found = judge(points)
        s.series += 1
        s.planted += truth.at is not None
        s.found += len(found.changes)
        index = {p.run_id: i for i, p in enumerate(points)}
        for c in found.changes:
            near = truth.at is not None and abs(index[c.run_after] - truth.at) <= TOLERANCE
            s.placed += near
            s.right += near and c.label == truth.label
        kept = tuple(index[run] for run, _ in found.contaminated)
        s.kept_out_wrong += kept != truth.contaminated
    return s
