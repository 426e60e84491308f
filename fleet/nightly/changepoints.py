"""Change points of one metric's history: E-divisive means with a permutation test. Pure, no I/O.

Why this method (docs/nightly.md, "Change points"):

* It finds a shift anywhere in the history, not only at the newest night, and it judges each
  candidate against the series' own noise (a permutation test), not against a fixed threshold.
* It is MongoDB's method and the core of Apache Otava's. Otava itself (0.8.0) pins numpy 2.2 and
  brings BigQuery, Slack and PostgreSQL clients, and failed on numpy arrays; ``ruptures`` finds
  segments but gives no significance, so a threshold on its penalty would be a guess again.
  The method is short: written here on the standard library, it runs wherever fleet does.
* A point with a neighbour on the GPU fools every change-point method (one +15 % night gave
  Otava 29 false change points per 100 series). fleet knows those nights: the caller leaves them
  out before detection (:mod:`.changes`). What is left is guarded twice more: each side of a
  change holds at least ``min_size`` points, and the medians either side differ by at least
  ``min_change``, so one odd night nobody flagged does not make a change on its own.

The statistic (Matteson and James, 2014, with alpha = 1), for a split of ``x`` at ``t`` into
``A = x[:t]`` and ``B = x[t:]``::

    q(t) = |A| |B| / n * (2 mean|a - b| - mean|a - a'| - mean|b - b'|)

The candidate is the ``t`` with the largest ``q``. Its p-value is the share of shuffles of the
segment whose largest ``q`` is at least as large. A significant candidate splits the segment and
each side is searched again (binary segmentation); a segment whose candidate is not significant is
final. The shuffles come from a generator seeded by the series itself, so the same history gives
the same verdict every morning.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import random
import statistics
import struct
from dataclasses import dataclass
from typing import Sequence

# a change is significant below this p-value: about 0.5 false changes per 100 noise series
ALPHA = 0.005
PERMUTATIONS = 399    # shuffles per candidate: p-values down to 0.0025
MIN_SIZE = 3          # points each side of a change, at least
MIN_CHANGE = 0.02     # the medians either side differ by at least this much (relative)
# the places fleet recorded a change, all together (Holm's step-down among them)
KNOWN_ALPHA = 0.05
# a known place's split tested over every arrangement where there are at most this many
EXACT = 10000
# statistics this close (relative) are equal: the same split, its sums in another order
TIE = 1e-9


@dataclass(frozen=True)
class ChangePoint:
    index: int        # the first point after the change, in the series given
    before: float     # the median of the segment before it
    after: float      # the median of the segment after it
    rel: float        # (after - before) / before
    p_value: float


@dataclass(frozen=True)
class Settings:
    alpha: float = ALPHA
    permutations: int = PERMUTATIONS
    min_size: int = MIN_SIZE
    min_change: float = MIN_CHANGE

    def __post_init__(self):
        if self.min_size < 2:  # a side of one point has no pairs within it
            raise ValueError("min_size: 2 or more")


def _pair_sums(x: Sequence[float]) -> tuple[list[float], list[float]]:
    """For each k: the sum of |x[i] - x[k]| over the i before it, and over the i after it.

    In O(n log n), not O(n^2): the points already passed are kept in a Fenwick tree over the
    values' ranks (counts and sums), and the sum over all the others of a value is found from the
    sorted values; a year of nights and hundreds of shuffles stay well under a second a series."""
    return _sums_in_order(*_ranked(x))


def _ranked(x: Sequence[float]) -> tuple[list[int], list[float], list[float]]:
    """(each point's rank among the values, from 1; the values in ascending order; each rank's sum
    of distances to all the values): what the shuffles of one series share, made once for all."""
    n = len(x)
    order = sorted(range(n), key=x.__getitem__)
    rank = [0] * n
    for r, i in enumerate(order):
        rank[i] = r + 1
    ascending = [x[i] for i in order]
    prefix = [0.0]
    for v in ascending:
        prefix.append(prefix[-1] + v)
    to_all = [(r * v - prefix[r]) + (prefix[n] - prefix[r + 1]) - (n - r - 1) * v
              for r, v in enumerate(ascending)]
    return rank, ascending, to_all


def _sums_in_order(rank: list[int], ascending: list[float],
                   to_all: list[float]) -> tuple[list[float], list[float]]:
    """:func:`_pair_sums` of the series whose k-th point has the value of rank ``rank[k]``."""
    n = len(rank)
    counts, sums = [0] * (n + 1), [0.0] * (n + 1)
    before, after, passed_sum = [0.0] * n, [0.0] * n, 0.0
    for k, r in enumerate(rank):
        v = ascending[r - 1]
        less, less_sum, j = 0, 0.0, r - 1
        while j > 0:
            less, less_sum, j = less + counts[j], less_sum + sums[j], j & (j - 1)
        before[k] = (less * v - less_sum) + (passed_sum - less_sum) - (k - less) * v
        after[k] = to_all[r - 1] - before[k]
        passed_sum += v
        j = r
        while j <= n:
            counts[j], sums[j], j = counts[j] + 1, sums[j] + v, j + (j & -j)
    return before, after


def best_split(x: Sequence[float], min_size: int = MIN_SIZE) -> tuple[int, float]:
    """(t, q(t)) of the split of ``x`` with the largest statistic; (0, 0.0)
    where none is allowed."""
    if len(x) < 2 * min_size:
        return 0, 0.0
    return _best_of(*_pair_sums(x), min_size)


def _best_of(before: list[float], after: list[float], min_size: int) -> tuple[int, float]:
    """:func:`best_split` from the series' pair sums."""
    n = len(before)
    total = sum(before)
    left = sum(before[:min_size])        # pairs within x[:t]
    right = sum(after[min_size:])        # pairs within x[t:]
    best = (0, 0.0)
    for t in range(min_size, n - min_size + 1):
        m = n - t
        between = total - left - right
        e = 2 * between / (t * m) - left / (t * (t - 1) / 2) - right / (m * (m - 1) / 2)
        q = t * m / n * e
        if q > best[1]:
            best = (t, q)
        left += before[t]
        right -= after[t]
    return best


def _stable_hash(x: Sequence[float]) -> int:
    """A seed from the values themselves: the same series, the same shuffles, the same verdict
    (Python's own hash of bytes changes with each process)."""
    return int.from_bytes(hashlib.sha256(struct.pack(f"{len(x)}d", *x)).digest()[:8], "big")


def p_value(x: Sequence[float], q: float, s: Settings) -> float:
    """The share of shuffles of ``x`` whose best split is at least ``q``. The shuffling stops as
    soon as the answer cannot fall below ``s.alpha`` (most candidates in noise
    stop within a few dozen)."""
    rng = random.Random(_stable_hash(x))
    # The ranks are shuffled, not the values: the same draws give the same arrangements, while the
    # values' order and sums, the same for every arrangement, are found once.
    shuffled, ascending, to_all = _ranked(x)
    at_least = 0
    # this many shuffles at least q: p >= alpha, not significant
    most = s.alpha * (s.permutations + 1) - 1
    for done in range(1, s.permutations + 1):
        rng.shuffle(shuffled)
        if _best_of(*_sums_in_order(shuffled, ascending, to_all), s.min_size)[1] >= q * (1 - TIE):
            at_least += 1
            if at_least >= most:
                return (at_least + 1) / (done + 1)
    return (at_least + 1) / (s.permutations + 1)


def _q_at(x: Sequence[float], t: int) -> float:
    """The statistic of the split of ``x`` at ``t`` (2 points a side at least),
    against all of ``x[t:]``."""
    before, after = _pair_sums(x)
    left, right = sum(before[:t]), sum(after[t:])   # the pairs within x[:t], within x[t:]
    between, n = sum(before) - left - right, len(x)
    m = n - t
    return t * m / n * (2 * between / (t * m) - left / (t * (t - 1) / 2)
                        - right / (m * (m - 1) / 2))


def _split_p(x: list[float], t: int, s: Settings) -> float:
    """The permutation p-value of the split of ``x`` at ``t``: over every arrangement of which
    points come first where there are few (exact: 3 runs and 3 can never give
    less than 0.1), else over
    ``s.permutations`` shuffles seeded by the values."""
    n = len(x)
    if math.comb(n, t) <= EXACT:
        return _exact_split_p(x, t)
    observed, rng, shuffled, at_least = _q_at(x, t) * (1
                                                       - TIE), random.Random(_stable_hash(x)), list(
                                                           x), 0
    for _ in range(s.permutations):
        rng.shuffle(shuffled)
        at_least += _q_at(shuffled, t) >= observed
    return (at_least + 1) / (s.permutations + 1)


def _exact_split_p(x: list[float], t: int) -> float:
    """The share of every arrangement of ``t`` points first whose statistic is at least the split's
    own. The distances are taken once; it stops once the share reaches KNOWN_ALPHA, past which no
    test of a place is kept (Holm keeps none at p >= KNOWN_ALPHA)."""
    n, m = len(x), len(x) - t
    d = [[abs(a - b) for b in x] for a in x]
    everything = sum(map(sum, d)) / 2

    def q(first: tuple[int, ...]) -> float:
        chosen = set(first)
        rest = [i for i in range(n) if i not in chosen]
        within_a = sum(d[i][j] for i, j in itertools.combinations(first, 2))
        within_b = sum(d[i][j] for i, j in itertools.combinations(rest, 2))
        between = everything - within_a - within_b
        return t * m / n * (2 * between / (t * m) - within_a / (t * (t - 1) / 2)
                            - within_b / (m * (m - 1) / 2))

    observed, total, at_least = q(tuple(range(t))) * (1 - TIE), math.comb(n, t), 0
    for first in itertools.combinations(range(n), t):
        at_least += q(first) >= observed
        if at_least > KNOWN_ALPHA * total:
            break
    return at_least / total


def known_step(x: Sequence[float], t: int, s: Settings = Settings()) -> ChangePoint | None:
    """The step at ``t`` of ``x``, a place fleet named beforehand (the environment or the workload's
    version changed there), with the p-value of a permutation test of the split at that one place,
    where the levels either side differ by ``s.min_change`` at least; None where not. Nothing is
    searched, so a few runs a side can show it (four nights on locked clocks between two stretches
    at full clocks), where a search over every split must beat every place it could have chosen; the
    caller judges the p-values of all its places together (:func:`holm`)."""
    x = [float(v) for v in x]
    if min(t, len(x) - t) < 2:
        return None
    before, after = statistics.median(x[:t]), statistics.median(x[t:])
    if abs(_relative(before, after)) < s.min_change:
        return None
    return ChangePoint(t, before, after, _relative(before, after), _split_p(x, t, s))


def holm(p_values: dict[int, float], alpha: float = KNOWN_ALPHA) -> set[int]:
    """The places whose tests hold together at ``alpha`` (Holm's step-down: the smallest p against
    alpha / m, the next against alpha / (m - 1), ..., stopping at the first that fails): the chance
    that any one of them is noise stays under alpha, however many places are tested."""
    held, m = set(), len(p_values)
    for k, (place, p) in enumerate(sorted(p_values.items(), key=lambda item: item[1])):
        if p >= alpha / (m - k):
            break
        held.add(place)
    return held


def _relative(before: float, after: float) -> float:
    return (after - before) / abs(before) if before else 0.0


def _split(x: Sequence[float], s: Settings) -> tuple[int, float] | None:
    """(t, p) of a significant change in ``x`` big enough to count; None where there is none."""
    t, q = best_split(x, s.min_size)
    if t == 0 or q <= 0:
        return None
    if abs(_relative(statistics.median(x[:t]), statistics.median(x[t:]))) < s.min_change:
        return None
    p = p_value(x, q, s)
    return (t, p) if p < s.alpha else None


def change_points(values: Sequence[float], settings: Settings = Settings()) -> list[ChangePoint]:
    """The change points of ``values`` (oldest first), in order, each with the medians of the
    segments either side of it in the final segmentation."""
    x = [float(v) for v in values]
    cuts, pending, p_values = [], [(0, len(x))], {}
    while pending:
        start, end = pending.pop()
        found = _split(x[start:end], settings)
        if found is None:
            continue
        t, p = found
        cuts.append(start + t)
        p_values[start + t] = p
        pending += [(start, start + t), (start + t, end)]
    cuts.sort()
    edges = [0, *cuts, len(x)]
    out = []
    for i, cut in enumerate(cuts):
        before, after = statistics.median(x[edges[i]:cut]), statistics.median(x[cut:edges[i + 2]])
        out.append(ChangePoint(cut, before, after, _relative(before, after), p_values[cut]))
    return out
