"""Host patterns as Ansible reads them (ansible-core's ``inventory/manager.py``), and where fleet's
own words (ranges, ``user@host:port``) fit beside them.

Ansible's grammar, followed to the letter:

- a target is split on ``,`` when it has one; else it is one pattern when it reads as an address
  (``host:port``, an IPv6 address, a host range), else it is split on the ``:`` outside brackets;
- the patterns are evaluated in Ansible's order: the plain ones (a union, in the order given;
  ``all`` when there is none), then the ``&`` ones (intersection), then the ``!`` ones (exclusion);
- one pattern is a ``~`` regular expression (matched from the start of a name), else a glob
  (``*``, ``?``, ``[abc]``, ``[!abc]``) on group names (a group gives all its hosts) and, when no
  group matched or the pattern has one of ``.?*[``, on host names; it may end in a subscript
  (``g[0]``, ``g[-1]``, ``g[1:3]``, ``g[2:]``) that picks hosts by position in that list.

fleet adds two things, each refused where it would pick other hosts than Ansible does:

- a pattern with a user or a port (``alice@gpu01``, ``gpu01:2222``) is a host to connect to, in
  the inventory or not (Ansible's reading of it matches nothing);
- fleet's ranges (``gpu[01:04]``, ``gpu[01-04,07]``) name hosts only where Ansible's reading of the
  same words picks the same hosts; where the two readings differ, the pattern is refused with both.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
from typing import Callable, Sequence

from ..hostlist import HostPatternError, TooManyNames, expand, split_patterns
from .host import TargetError

# ansible-core's PATTERN_WITH_SUBSCRIPT, as it is.
_SUBSCRIPT = re.compile(r"^(.+)\[(?:(-?[0-9]+)|([0-9]+)([:-])([0-9]*))\]$")
# ansible.parsing.utils.addresses, the expressions
# parse_address(allow_ranges=True) uses, as they are.
_NUM_RANGE = r"\[(?:[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_HEX_RANGE = r"\[(?:[0-9a-f]+:[0-9a-f]+)(?::[0-9]+)?\]"
_ALNUM_RANGE = r"\[(?:[a-z]:[a-z]|[0-9]+:[0-9]+)(?::[0-9]+)?\]"
_I6 = rf"(?:[0-9a-f]{{1,4}}|{_HEX_RANGE})"
_I4 = rf"(?:[01]?[0-9]{{1,2}}|2[0-4][0-9]|25[0-5]|{_NUM_RANGE})"
_LABEL = rf"(?:[\w]|{_ALNUM_RANGE})(?:[\w_-]|{_ALNUM_RANGE})*(?<![_-])"
_ADDRESS = {
    "bracketed_hostport": re.compile(r"^\[(.+)\]:([0-9]+)$"),
    "hostport": re.compile(r"^((?:[^:\[\]]|\[[^\]]*\])*):([0-9]+)$"),
    "ipv4": re.compile(rf"^(?:{_I4}\.){{3}}{_I4}$", re.I),
    "hostname": re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$", re.I),
}
# Compiled on first use (re keeps it): 4 ms, and a name of the inventory or a
# hostname never needs it.
_IPV6 = (
        rf"^((?:{_I6}:){{7}}{_I6}|(?:{_I6}:){{1,6}}:|(?:{_I6}:)(?::{_I6}){{1,6}}|"
        rf"(?:{_I6}:){{2}}(?::{_I6}){{1,5}}|(?:{_I6}:){{3}}(?::{_I6}){{1,4}}|"
        rf"(?:{_I6}:){{4}}(?::{_I6}){{1,3}}|(?:{_I6}:){{5}}(?::{_I6}){{1,2}}|"
        rf"(?:{_I6}:){{6}}(?::{_I6})|:(?::{_I6}){{1,6}}|{_I6}?::|(?:0:){{6}}(?:{_I6}\.){{3}}{_I6}|"
        rf"::(?:ffff:)?(?:{_I6}\.){{3}}{_I6}|(?:0:){{5}}ffff:(?:{_I6}\.){{3}}{_I6})$")
_COLON_SPLIT = re.compile(r"(?:[^\s:\[\]]|\[[^\]]*\])+")
MAX_PATTERN = 1000  # characters of one target: a regex from a playbook is run against every name


def parse_address(text: str) -> tuple[str, int | None] | None:
    """Ansible's ``parse_address(text, allow_ranges=True)``: (host, port),
    or None where it fails."""
    port = None
    for kind in ("bracketed_hostport", "hostport"):
        if m := _ADDRESS[kind].match(text):
            text, port = m[1], int(m[2])
    if _ADDRESS["ipv4"].match(text) or _ADDRESS["hostname"].match(text) or re.match(_IPV6, text,
                                                                                    re.I):
        return text, port
    return None


def split_host_pattern(text: str) -> list[str]:
    """Ansible's ``split_host_pattern``: on every comma if there is one, else one address, else the
    colons outside brackets."""
    if "," in text:
        patterns = text.split(",")
    elif parse_address(text) is not None:
        patterns = [text]
    else:
        patterns = _COLON_SPLIT.findall(text)
    return [p.strip() for p in patterns if p.strip()]


def order_patterns(patterns: Sequence[str]) -> list[str]:
    """Ansible's order of evaluation: the union first (``all`` if none), then ``&``, then ``!``."""
    plain = [p for p in patterns if p and p[0] not in "!&"]
    return (plain or ["all"]) + [p for p in patterns
                                 if p[:1] == "&"] + [p for p in patterns if p[:1] == "!"]


def split_subscript(pattern: str) -> tuple[str, tuple[int, int | None] | None]:
    """Ansible's ``_split_subscript``: the pattern and its (start, end) subscript, if any."""
    if pattern[0] == "~":
        return pattern, None
    m = _SUBSCRIPT.match(pattern)
    if not m:
        return pattern, None
    expr, index, start, _sep, end = m.groups()
    if index:
        return expr, (int(index), None)
    return expr, (int(start), int(end) if end else -1)


def _subscripted(names: list[str], subscript: tuple[int, int | None] | None,
                 pattern: str) -> list[str]:
    """Ansible's ``_apply_subscript``, with its quirks (``[0:0]`` is the whole list)."""
    if not names or not subscript:
        return names
    start, end = subscript
    if end:
        return names[start:(len(names) - 1 if end == -1 else end) + 1]
    try:
        return [names[start]]
    except IndexError:
        raise TargetError(f"{pattern!r}: no host at position {start}; it names "
                          f"{len(names)} host(s)") from None


class Matcher:
    """Ansible's evaluation over fleet's inventory: ``hosts`` in inventory order, ``groups`` each
    with its hosts in Ansible's order (own hosts, then its children's, breadth first)."""

    def __init__(self, hosts: Sequence[str], groups: dict[str, list[str]], where: str):
        self.hosts, self.groups, self.where = list(hosts), groups, where
        self._known = set(self.hosts)

    def select(self, text: str, split: list[str] | None = None, lenient: bool = False) -> list[str]:
        """The host names a target picks, in Ansible's order; ``split``: its patterns, when the
        caller split it. ``lenient``: a pattern that matches nothing picks nothing (Ansible's
        warning) instead of being refused (fleet's rule)."""
        if len(text) > MAX_PATTERN:
            raise TargetError(f"a target of {len(text)} characters: "
                              f"fleet reads at most {MAX_PATTERN}")
        chosen: list[str] = []
        for p in order_patterns(split_host_pattern(text) if split is None
                                else [p for p in split if p]):
            if p in self._known:
                chosen.append(p)
                continue
            that = self.match_one(p, lenient)
            if p[0] == "!":
                drop = set(that)
                chosen = [h for h in chosen if h not in drop]
            elif p[0] == "&":
                keep = set(that)
                chosen = [h for h in chosen if h in keep]
            else:
                chosen.extend(h for h in that if h not in set(chosen))
        return list(dict.fromkeys(chosen))

    def match_one(self, pattern: str, lenient: bool = False) -> list[str]:
        """Ansible's ``_match_one_pattern``: one pattern, its ``&`` or ``!`` ignored."""
        if pattern[0] in "&!":
            pattern = pattern[1:]
        if not pattern:
            raise TargetError("an empty pattern after '&' or '!'")
        expr, subscript = split_subscript(pattern)
        names = self._enumerate(expr, pattern, lenient)
        try:
            return _subscripted(names, subscript, pattern)
        except TargetError:
            if lenient:
                return []
            raise

    def _enumerate(self, pattern: str, whole: str, lenient: bool) -> list[str]:
        match = _matcher(pattern)
        groups = [g for g in self.groups if match(g)]
        out = [h for g in groups for h in self.groups[g]]
        if not groups or pattern[0] == "~" or any(c in pattern for c in ".?*["):
            out += [h for h in self.hosts if match(h)]
        if not out and not groups and pattern != "all" and not lenient:
            raise TargetError(self._nothing(whole))
        return out

    def _nothing(self, pattern: str) -> str:
        hint = difflib.get_close_matches(pattern, self.hosts + list(self.groups), n=1)
        more = (f" (did you mean {hint[0]!r}?)" if hint
                else f" (a host outside it is named with its user or port: user@{pattern})")
        return f"{pattern!r} is not a host or group in {self.where}{more}"


def _matcher(pattern: str) -> Callable[[str], bool]:
    """Ansible's ``_match_list``: ``~`` a regex matched from the start, else fnmatch's glob."""
    try:
        regex = re.compile(pattern[1:] if pattern[0] == "~" else fnmatch.translate(pattern))
    except re.error as e:
        raise TargetError(f"invalid host pattern {pattern!r}: {e}") from None
    return lambda name: regex.match(name) is not None


def range_reading(text: str, matcher: Matcher) -> None:
    """Refuse a target whose words fleet's ranges would read as other hosts than Ansible does.

    Each part that has brackets (split as Ansible splits it, and as fleet splits its ranges, on
    the commas outside brackets) whose expansion as fleet's range names an inventory host is read
    both ways; where the readings differ, neither is chosen for the user. A part whose range
    names no host of the inventory (``gpu[0]``, ``gpu[1:3]`` beside gpu01..) is Ansible's alone."""
    parts = split_host_pattern(text) + split_patterns(text)
    for part in dict.fromkeys(p.lstrip("!&") for p in parts):
        if "[" not in part or part[0] == "~":
            continue
        try:
            names = expand(part)
        except TooManyNames as e:  # refused before anything is made, whichever reading was meant
            raise TargetError(str(e)) from None
        except HostPatternError:  # not one of fleet's ranges: Ansible's words alone
            continue
        known = [n for n in names if n in matcher._known]
        if not known:  # no host has such a name: the words are Ansible's alone (gpu[0], gpu[1:3])
            continue
        ansible = matcher.select(part, lenient=True)
        if set(ansible) != set(names):
            missing = (f" ({len(names) - len(known)} of them not in the inventory)"
                       if len(known) < len(names) else "")
            raise TargetError(
                f"{part!r} reads two ways: as Ansible's pattern it picks {_few(ansible)}; as a "
                f"range of names it is {_few(names)}{missing}. fleet picks neither silently: name "
                f"the hosts ({','.join(known[:4])}{',...' if len(known) > 4 else ''}), or use a "
                "glob or a '~' regular expression (docs/inventory.md, Host patterns)")


def _few(names: list[str]) -> str:
    if not names:
        return "no host"
    return ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
