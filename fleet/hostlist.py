"""Host names with ranges, as a pure data type: expand patterns, fold names back.

Two range syntaxes are accepted because inventories come from both worlds:
Ansible's ``gpu[01:16]``, ``gpu[01:16:2]``, ``node[a:f]`` and Slurm's
``gpu[01-16]``, ``gpu[01-04,07,10-12]``. Several brackets in one name give
their cartesian product (``r[1-2]n[1-3]``). Leading zeros fix the width.
"""

from __future__ import annotations

import itertools
import re
import string
from typing import Iterable

__all__ = ["HostPatternError", "TooManyNames", "expand", "fold", "split_patterns"]

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


class HostPatternError(ValueError):
    """A host pattern that cannot be expanded; the message says why."""


class TooManyNames(HostPatternError):
    """A pattern whose ranges stand for more names than fleet expands."""


MAX_NAMES = 100_000  # one pattern's names at most: counted before any is made


def _numeric(start: str, end: str, step: int, pattern: str) -> tuple[range, int]:
    lo, hi = int(start), int(end)
    if lo > hi:
        raise HostPatternError(f"range {start}..{end} in {pattern!r} runs backwards")
    width = len(start) if start.startswith("0") and len(start) > 1 else 0
    return range(lo, hi + 1, step), width


def _alpha(start: str, end: str, step: int, pattern: str) -> tuple[range, None]:
    # Ansible counts letters in string.ascii_letters order: a..z then A..Z, so [y:B] is y z A B.
    lo, hi = string.ascii_letters.index(start), string.ascii_letters.index(end)
    if lo > hi:
        raise HostPatternError(f"range {start}..{end} in {pattern!r} runs backwards")
    return range(lo, hi + 1, step), None


def _bracket_ranges(body: str, pattern: str) -> list[tuple[range, int | None]]:
    """The ranges one bracket stands for, not yet expanded: ``01:16[:2]``, ``a:f`` or ``1-3,7``.
    Each is (numbers, zero-padded width), or (indices into
    string.ascii_letters, None) for letters."""
    if not body.strip():
        raise HostPatternError(f"empty range [] in {pattern!r}")
    if ":" in body:  # Ansible form: exactly one range, optional stride
        return [_ansible_range(body, pattern)]
    return _slurm_ranges(body, pattern)


def _ansible_range(body: str, pattern: str) -> tuple[range, int | None]:
    """The one range of an Ansible bracket, ``start:end`` or ``start:end:stride``, of numbers
    or of letters."""
    parts = body.split(":")
    if len(parts) not in (2, 3) or not all(parts[:2]):
        raise HostPatternError(f"bad range [{body}] in {pattern!r}: expected "
                               "[start:end] or [start:end:stride]")
    start, end = parts[0], parts[1]
    step = 1
    if len(parts) == 3:
        if not parts[2].isdigit() or int(parts[2]) < 1:
            raise HostPatternError(f"bad stride {parts[2]!r} in {pattern!r}: "
                                   "a positive integer is needed")
        step = int(parts[2])
    if start.isdigit() and end.isdigit():
        if start.startswith("0") and len(start) > 1 and len(start) != len(end):
            raise HostPatternError(f"bad range [{body}] in {pattern!r}: a zero-padded start needs "
                                   "an end of the same width (as Ansible requires)")
        return _numeric(start, end, step, pattern)
    if (len(start) == len(end) == 1 and start in string.ascii_letters
        and end in string.ascii_letters):
        return _alpha(start, end, step, pattern)
    raise HostPatternError(f"bad range [{body}] in {pattern!r}: both ends must "
                           "be numbers or single letters")


def _slurm_ranges(body: str, pattern: str) -> list[tuple[range, int | None]]:
    """The ranges of a Slurm bracket: comma-separated items, each N or lo-hi."""
    ranges = []
    for item in body.split(","):
        item = item.strip()
        if re.fullmatch(r"\d+", item):
            ranges.append(_numeric(item, item, 1, pattern))
        elif m := re.fullmatch(r"(\d+)-(\d+)", item):
            ranges.append(_numeric(m[1], m[2], 1, pattern))
        else:
            raise HostPatternError(f"bad range item {item!r} in {pattern!r}: expected N or N-M")
    return ranges


def _values(ranges: list[tuple[range, int | None]]) -> list[str]:
    return [string.ascii_letters[i] if width is None else str(i).zfill(width) for r, width in ranges
            for i in r]


def expand(pattern: str) -> list[str]:
    """All host names a pattern stands for, in order, without duplicates; at most ``MAX_NAMES``,
    which is checked by multiplying the ranges' sizes before any name is made."""
    if not pattern or pattern.strip() != pattern:
        raise HostPatternError(f"bad host name {pattern!r}")
    pieces: list[list[tuple[range, int | None]] | str] = []
    pos = 0
    for m in _BRACKET.finditer(pattern):
        pieces.append(pattern[pos:m.start()])
        pieces.append(_bracket_ranges(m[1], pattern))
        pos = m.end()
    rest = pattern[pos:]
    if "[" in rest or "]" in rest or any("[" in p or "]" in p for p in pieces[::2]):
        raise HostPatternError(f"unbalanced bracket in {pattern!r}")
    pieces.append(rest)
    total = 1
    for piece in pieces[1::2]:
        total *= sum(len(r) for r, _ in piece)
    if total > MAX_NAMES:
        raise TooManyNames(f"{pattern!r} stands for {total:,} host names, more than fleet expands "
                               f"({MAX_NAMES:,}); name fewer")
    words = [[p] if isinstance(p, str) else _values(p) for p in pieces]
    return list(dict.fromkeys("".join(p) for p in itertools.product(*words)))


def split_patterns(text: str) -> list[str]:
    """Split ``a,gpu[1-3,7],b`` on the commas that are outside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return [p.strip() for p in out if p.strip()]


_TAIL_NUMBER = re.compile(r"^(.*?)(\d+)([^\d]*)$")


def fold(names: Iterable[str]) -> str:
    """The shortest common form of many names: ``gpu[01-03,07],login``.

    Only the last run of digits of a name is folded, which covers the way
    clusters are named; names that do not fit are listed as they are.
    """
    groups, plain = _numbered_groups(names)
    _join_padded(groups)
    parts = list(plain)
    for (prefix, suffix, width), numbers in groups.items():
        numbers = sorted(set(numbers))
        if not numbers:
            continue
        if len(numbers) == 1:
            parts.append(f"{prefix}{str(numbers[0]).zfill(width)}{suffix}")
            continue
        parts.append(f"{prefix}[{','.join(_runs(numbers, width))}]{suffix}")
    return ",".join(sorted(parts))


def _numbered_groups(names: Iterable[str]) -> tuple[dict[tuple[str, str, int], list[int]],
                                                   list[str]]:
    """The names' numbers, grouped by (what comes before them, after them, their zero-padded
    width); and the names without a number, as they are. Each name once."""
    groups: dict[tuple[str, str, int], list[int]] = {}
    plain: list[str] = []
    for name in dict.fromkeys(names):
        m = _TAIL_NUMBER.match(name)
        if m is None:
            plain.append(name)
            continue
        digits = m[2]
        width = len(digits) if digits.startswith("0") and len(digits) > 1 else 0
        groups.setdefault((m[1], m[3], width), []).append(int(digits))
    return groups, plain


def _join_padded(groups: dict[tuple[str, str, int], list[int]]) -> None:
    """Moves each unpadded number as wide as a padded group's into that group, in place:
    gpu09 (padded) and gpu10 (no leading zero) belong to one padded set."""
    for (prefix, suffix, width) in [k for k in groups if k[2]]:
        loose = groups.get((prefix, suffix, 0), [])
        same = [n for n in loose if len(str(n)) == width]
        if same:
            groups[(prefix, suffix, width)] += same
            groups[(prefix, suffix, 0)] = [n for n in loose if len(str(n)) != width]


def _runs(numbers: list[int], width: int) -> list[str]:
    """Sorted ``numbers`` as runs of consecutive ones, ``01-03`` or ``07``, each zero-padded
    to ``width``."""
    runs, start, prev = [], numbers[0], numbers[0]
    for n in numbers[1:] + [None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        lo, hi = str(start).zfill(width), str(prev).zfill(width)
        runs.append(lo if start == prev else f"{lo}-{hi}")
        if n is not None:
            start = prev = n
    return runs
