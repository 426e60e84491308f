"""What an inventory is once read: hosts with their merged variables, groups, and the errors.

This module knows nothing of file formats; ``load`` (in ``__init__``) builds an
:class:`Inventory` from whatever sources it was given.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any, Iterable

from ..hostlist import HostPatternError, expand, split_patterns


class InventoryError(ValueError):
    """A malformed inventory; ``str()`` reads ``file:line: what is wrong``."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


class TargetError(ValueError):
    """Targets on the command line that name nothing in the inventory."""


def _last_set(vars: dict[str, Any], *names: str) -> Any:
    """The value of the last of ``names`` that is set, as Ansible's ssh plugin picks among a
    variable and its aliases (``ansible_host`` then ``ansible_ssh_host``: the alias wins)."""
    value = None
    for name in names:
        if vars.get(name) is not None:
            value = vars[name]
    return value


@dataclass(frozen=True)
class Host:
    name: str
    vars: dict[str, Any]
    groups: tuple[str, ...]
    where: str  # file:line of the (first) definition

    @property
    def address(self) -> str:
        return _last_set(self.vars, "ansible_host", "ansible_ssh_host") or self.name

    @property
    def port(self) -> int | None:
        port = _last_set(self.vars, "ansible_port", "ansible_ssh_port")
        return None if port is None else int(port)  # checked on loading: a number or a string of digits

    @property
    def user(self) -> str | None:
        return _last_set(self.vars, "ansible_user", "ansible_ssh_user")

    @property
    def key_file(self) -> str | None:
        return _last_set(self.vars, "ansible_private_key_file", "ansible_ssh_private_key_file")

    @property
    def connection(self) -> str:
        return self.vars.get("ansible_connection") or "ssh"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port, "user": self.user,
                "connection": self.connection, "groups": list(self.groups), "vars": self.vars}


@dataclass
class Inventory:
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group -> every host in it, children included
    sources: list[str]

    def select(self, targets: Iterable[str] = (), exclude: Iterable[str] = ()) -> list[Host]:
        """Hosts named by targets (hosts, groups, ranges, globs), minus ``exclude``.

        No targets means every host. A target that names nothing is an error:
        a typo must not silently shrink the set of hosts a command reaches.
        """
        chosen = self._resolve(list(targets) or ["all"])
        dropped = set(self._resolve(list(exclude)))
        return [self.hosts[n] for n in chosen if n not in dropped]

    def _resolve(self, targets: list[str]) -> list[str]:
        names: dict[str, None] = {}
        for target in targets:
            for pattern in split_patterns(target):
                names.update(dict.fromkeys(self._resolve_one(pattern)))
        return list(names)

    def _resolve_one(self, pattern: str) -> list[str]:
        if pattern in self.groups:
            return self.groups[pattern]
        if pattern in self.hosts:
            return [pattern]
        if any(c in pattern for c in "*?"):
            hits = [h for h in self.hosts if fnmatchcase(h, pattern)]
            for g in self.groups:
                if fnmatchcase(g, pattern):
                    hits.extend(self.groups[g])
            if hits:
                return hits
            raise TargetError(f"{pattern!r} matches no host or group")
        try:
            names = expand(pattern)
        except HostPatternError as e:
            raise TargetError(str(e)) from None
        unknown = [n for n in names if n not in self.hosts]
        if unknown:
            hint = difflib.get_close_matches(unknown[0], list(self.hosts) + list(self.groups), n=1)
            more = f" (did you mean {hint[0]!r}?)" if hint else ""
            src = ", ".join(self.sources) or "the inventory"
            raise TargetError(f"{unknown[0]!r} is not a host or group in {src}{more}")
        return names
