"""Ansible's INI inventories, read line by line as Ansible's ini plugin reads them.

configparser does not fit: hosts are lines without '=', a host line carries several
``key=value`` words quoted as a shell quotes them, and values are Python literals. The
rules below follow ansible-core's ``plugins/inventory/ini.py``:

- lines before any section are hosts of ``ungrouped``; ``#`` and ``;`` start comments;
- ``[group]`` lists hosts (patterns, ``host:port``, then ``key=value`` words split by shlex);
- ``[group:vars]`` has one ``key=value`` a line, everything after the first ``=`` the value;
- ``[group:children]`` names groups, each declared in this file by ``[child]`` or
  ``[child:children]``, before or after;
- a value that reads as a Python literal (``2201``, ``True``, ``[1, 2]``, ``'quoted'``) is that
  literal, anything else a string.
"""

from __future__ import annotations

import ast
import re
import shlex
import warnings
from typing import Any

from .builder import Builder
from .host import InventoryError

# The same expressions as Ansible's: a group name is anything but ':', ']' and spaces.
_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
_GROUP_LINE = re.compile(r"^([^:\]\s]+)\s*(?:#.*)?$")


def parse_value(text: str, where: str) -> Any:
    """A Python literal when the text is one (Ansible's ``ast.literal_eval``), else the text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    # `{[1]: 2}`, or nested past what Python parses
    except (TypeError, MemoryError, RecursionError) as e:
        raise InventoryError(where, f"cannot read the value {text[:60]!r}: {e}") from None
    return _as_ansible(value)


def _as_ansible(value: Any) -> Any:
    """The literal as Ansible's ini plugin keeps it: tuples and sets become lists, bytes text,
    ``...`` and complex numbers their text (``_parse_recursive_coerce_types_and_tag``)."""
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_as_ansible(v) for v in value]
    if isinstance(value, dict):
        return {k: _as_ansible(v) for k, v in value.items()}
    if value is ...:
        return "..."
    if isinstance(value, complex):
        return str(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def looks_like_ini(text: str) -> bool:
    """Whether a file with no telling extension is INI: its first line that says anything is a
    section header or a host line, not a YAML key (``all:``) or document start."""
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line == "---" or re.fullmatch(r"[\w.-]+:(\s.*)?", line) or line.startswith("{"):
            return False
        return True
    return True


def read_inventory(text: str, file: str, builder: Builder) -> None:
    lines = text.splitlines()
    declared = _declared_groups(lines)
    group, state = "ungrouped", "hosts"
    for number, raw in enumerate(lines, 1):
        where = f"{file}:{number}"
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if m := _SECTION.match(line):
            group, state = _section(builder, m, declared, where)
            continue
        if line.startswith("[") and line.endswith("]"):
            raise InventoryError(where, f"invalid section {line!r}: a group name without spaces, "
                                        "optionally followed by :vars or :children")
        if state == "hosts":
            _host_line(builder, group, line, where)
        elif state == "vars":
            _vars_line(builder, group, line, where)
        else:
            _children_line(builder, group, line, declared, where)


def _section(builder: Builder, m: re.Match, declared: set[str], where: str) -> tuple[str, str]:
    """A section header's group and type (hosts, children or vars), the group declared."""
    group, state = m[1], m[2] or "hosts"
    if state not in ("hosts", "children", "vars"):
        raise InventoryError(where, f"section [{group}:{state}] has an unknown type {state!r} "
                                    "(expected [group], [group:vars] or [group:children])")
    if state == "vars" and group not in builder.groups and group not in declared:
        raise InventoryError(where, f"[{group}:vars] is for a group that is not defined: add a "
                                    f"[{group}] section")
    builder.group(group, where)
    return group, state


def _vars_line(builder: Builder, group: str, line: str, where: str) -> None:
    """A line of ``[group:vars]``: one ``key=value``, everything after the first ``=`` the value."""
    if "=" not in line:
        raise InventoryError(where, f"expected key=value, got {line!r}")
    key, value = (part.strip() for part in line.split("=", 1))
    builder.group_var(group, key, parse_value(value, where), where)


def _children_line(builder: Builder, group: str, line: str, declared: set[str], where: str) -> None:
    """A line of ``[group:children]``: a group this file declares."""
    m = _GROUP_LINE.match(line)
    if not m:
        raise InventoryError(where, f"expected a group name, got {line!r}")
    if m[1] not in declared and m[1] not in builder.groups:
        raise InventoryError(where,
                             f"[{group}:children] names {m[1]!r}, a group not declared in this "
                                    f"file (add a [{m[1]}] section)")
    builder.child(group, m[1], where)


def _declared_groups(lines: list[str]) -> set[str]:
    """Groups this file declares by ``[g]`` or ``[g:children]`` (``[g:vars]`` does not)."""
    out = set()
    for line in lines:
        m = _SECTION.match(line.strip())
        if m and (m[2] or "hosts") in ("hosts", "children"):
            out.add(m[1])
    return out


def _host_line(builder: Builder, group: str, line: str, where: str) -> None:
    try:
        words = shlex.split(line, comments=True)
    except ValueError as e:  # an unclosed quote
        raise InventoryError(where, f"cannot split the host line {line!r}: {e}") from None
    if words and words[0] == "---":
        raise InventoryError(where, "'---' in an INI inventory: is this a YAML file? Name it .yml")
    if not words:
        return
    assignments = []
    for word in words[1:]:
        if "=" not in word:
            raise InventoryError(where, f"expected key=value after the host name, got {word!r}")
        key, value = word.split("=", 1)
        assignments.append((key, parse_value(value, where)))
    for host in builder.hosts(group, words[0], where):
        for key, value in assignments:
            builder.host_var(host, key, value, where)
