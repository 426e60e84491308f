"""Whether a change holds: the workload's two versions either side of a change point, rerun in turn
on the same GPU (A, B, B, A, repeated ``rounds`` times), each metric judged over those runs alone.
Pure, no I/O (the runs themselves: :mod:`.confirm_runs`; documented in
docs/nightly.md, "Confirming a change").

Why A/B/B/A: the order cancels a drift that runs along the session (a GPU warming up, a neighbour's
load on the host rising), which A, A, B, B would read as the change. Why a permutation test: with
two runs a side, the only honest measure is how often a random split of the same values would look
as clean, which is at best 1 in 6 (1 in 70 with two rounds).

A metric's verdict:

* **holds**: every B run lies beyond every A run, in the direction of the change (of the history's
  change where there is one), by at least the playbook's least change (at the nearest pair);
* **does not hold**: A and B differ by less than the least change, or the other way;
* **unclear**: they overlap, a run was contaminated (a tenant, flags given up, clocks held down),
  or the environment moved between the runs (another node or GPU model, driver, profiler, SM clock).
"""

from __future__ import annotations

import itertools
import statistics
import sys
from dataclasses import dataclass, replace

from ..errors import FleetError
from .changes import SeriesChanges
from .environment import Environment, differences

HOLDS, NOT_HELD, UNCLEAR = "holds", "does not hold", "unclear"
# the command takes up to 5 rounds: 20 runs, C(20, 10) = 184,756 splits for the exact test
ORDER = "ABBA"


class ConfirmError(FleetError, ValueError):
    """Nothing to confirm, or a confirmation that could not go on; ``str()``
    is the one line said."""


@dataclass(frozen=True)
class Target:
    """What is confirmed: version ``before`` (A) against ``after`` (B); ``expected``: each (metric,
    device) the history saw change there, with its relative size (empty for two versions named)."""
    before: str
    after: str
    run_after: str | None = None
    expected: tuple[tuple[str, str, float], ...] = ()


@dataclass(frozen=True)
class Measured:
    """One confirmation run's value of one metric on one device."""
    side: str          # "A" or "B"
    run_id: str
    value: float
    environment: Environment
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    metric: str
    device: str
    a: tuple[float, ...]
    b: tuple[float, ...]
    rel: float | None        # median(B) / median(A) - 1
    p_value: float | None    # one-sided, exact: the share of splits at least as far apart
    expected: float | None   # the history's change there, where it saw one
    verdict: str
    why: str


def sides(order: str = ORDER, rounds: int = 1) -> str:
    return order * rounds


def _versions_of(change_env: tuple[Environment, Environment]) -> tuple[str, str] | None:
    a, b = (e.workload_version for e in change_env)
    return (a, b) if a and b and a != b else None


def target_of(found: list[SeriesChanges], environments: dict,
              run_after: str | None = None) -> Target:
    """The change to confirm: the one at ``run_after`` (the first clean run after it), else the
    newest change where the workload's version changed. ``environments``: run id ->
    device -> Environment."""
    at = [(s, c) for s in found for c in s.changes if run_after is None or c.run_after == run_after]
    if not at:
        raise ConfirmError(f"no change point at run {run_after} in the playbook's history"
                           if run_after else
                           "the playbook's history has no change point to confirm")
    with_versions = []
    for s, c in at:
        pair = (environments.get(c.run_before, {}).get(s.device, Environment()),
                environments.get(c.run_after, {}).get(s.device, Environment()))
        versions = _versions_of(pair)
        if versions:
            with_versions.append((c.started, c.run_after, versions, s, c))
    if not with_versions:
        s, c = max(at, key=lambda sc: sc[1].started)
        what = "; ".join(c.changed) or "nothing recorded changed"
        raise ConfirmError(f"the change at run {c.run_after} ({c.label}: {what}) is not the "
                           "workload's: its version is the same either side, so there is nothing "
                           "to rerun (name two with --versions A B)")
    newest = max(with_versions, key=lambda w: (w[0], w[1]))
    # every series that changed with the same two versions (a step is placed to
    # within a run or two per series)
    chosen = [w for w in with_versions if w[2] == newest[2]]
    return Target(*newest[2], run_after=newest[1],
                  expected=tuple((s.metric, s.device, c.rel) for _, _, _, s, c in chosen))


def p_value(a: list[float], b: list[float], direction: int) -> float:
    """The exact one-sided permutation p-value of mean(B) - mean(A) in
    ``direction`` (+1: B larger)."""
    pooled, observed = a + b, direction * (statistics.fmean(b) - statistics.fmean(a))
    total = sum(pooled)
    # Sums of large values (nanoseconds) round: a split equal to the observed one must count as
    # such, within a few units in the last place of the sums, and no more.
    slack = 8 * sys.float_info.epsilon * sum(abs(x) for x in pooled)
    count = at_least = 0
    for chosen in itertools.combinations(range(len(pooled)), len(b)):
        in_b = sum(pooled[i] for i in chosen)
        diff = in_b / len(b) - (total - in_b) / len(a)
        at_least += direction * diff >= observed - slack
        count += 1
    return at_least / count


def _moved(runs: list[Measured]) -> list[str]:
    """What of the environment differs between the first run and any other (the workload's version
    aside), the GPU's UUID included: a confirmation compares runs on one GPU."""
    first = runs[0].environment
    moved = [d for r in runs[1:] for d in differences(first, r.environment)]
    moved += [f"GPU {first.gpu_uuid} -> {r.environment.gpu_uuid}" for r in runs[1:]
              if first.gpu_uuid and r.environment.gpu_uuid
              and r.environment.gpu_uuid != first.gpu_uuid]
    return list(dict.fromkeys(moved))


def _contaminated(runs: list[Measured]) -> list[str]:
    found = []
    for r in runs:
        reasons = list(dict.fromkeys([*r.flags, *r.environment.contaminated_by()]))
        if reasons:
            found.append(f"run {r.run_id} ({'; '.join(reasons)})")
    return found


def _spoiled(runs: list[Measured]) -> tuple[str, str] | None:
    """UNCLEAR and why, where a run was contaminated or the environment moved between the runs."""
    spoiled, moved = _contaminated(runs), _moved(runs)
    if not (spoiled or moved):
        return None
    why = ([f"contaminated: {', '.join(spoiled)}"] if spoiled else []) + \
        ([f"the environment moved: {'; '.join(moved)}"] if moved else [])
    return UNCLEAR, "; ".join(why) + "; run it again"


def _compared(a: list[float], b: list[float], rel: float, direction: int, expected: float | None,
              least: float) -> tuple[str, str]:
    """The verdict of clean runs: B beyond A by at least ``least`` in
    ``direction``, every run of them."""
    if abs(rel) < least or rel * direction < 0:
        history = f", the history's change was {expected:+.1%}" if expected is not None else ""
        return NOT_HELD, f"B is {rel:+.1%} of A{history}"
    nearest_a, nearest_b = (max(a), min(b)) if direction > 0 else (min(a), max(b))
    if not nearest_a:
        return UNCLEAR, "an A run measured 0"
    closest = nearest_b / nearest_a - 1  # the nearest B to the nearest A
    if closest * direction < least:
        return (UNCLEAR,
                "A and B overlap or lie closer than the least change "
                f"({closest:+.1%} at the nearest pair)")
    return HOLDS, (f"every B run {'above' if direction > 0 else 'below'} every A run by "
                   f"{abs(closest):.1%} or more, {rel:+.1%}")


def judge(metric: str, device: str, runs: list[Measured], expected: float | None,
          least: float) -> Verdict:
    """One metric's verdict over its confirmation runs (``least``: the playbook's least change)."""
    a = [r.value for r in runs if r.side == "A"]
    b = [r.value for r in runs if r.side == "B"]
    blank = Verdict(metric, device, tuple(a), tuple(b), None, None, expected, UNCLEAR, "")
    if not a or not b:
        return replace(blank, why=f"no value on one side: {'A' if not a else 'B'} measured nothing")
    if not statistics.median(a):
        return replace(blank, why="A's level is 0")
    rel = statistics.median(b) / statistics.median(a) - 1
    direction = 1 if (expected if expected is not None else rel) >= 0 else -1
    verdict, why = _spoiled(runs) or _compared(a, b, rel, direction, expected, least)
    return replace(blank, rel=rel, p_value=p_value(a, b, direction), verdict=verdict, why=why)


def judge_all(measured: dict[tuple[str, str], list[Measured]], target: Target,
              least: float) -> list[Verdict]:
    """A verdict for each metric the history saw change (or, for two versions
    named, for every metric)."""
    expected = {(m, d): rel for m, d, rel in target.expected}
    keys = list(expected) if expected else sorted(measured)
    return [judge(m, d, measured.get((m, d), []), expected.get((m, d)), least) for m, d in keys]


def holds(verdicts: list[Verdict]) -> bool:
    return bool(verdicts) and all(v.verdict == HOLDS for v in verdicts)

