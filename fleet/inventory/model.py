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
    # Without an inventory every name that is not this machine is an SSH host (as for ssh and
    # clush -w); with one, a bare name must be in it and only user@host or host:port reach past it.
    bare_names_are_hosts: bool = False

    def select(self, targets: Iterable[str] = (), exclude: Iterable[str] = ()) -> list[Host]:
        """Hosts named by targets (hosts, groups, ranges, globs, ad-hoc hosts), minus ``exclude``.

        No targets means every host. A target that names nothing is an error:
        a typo must not silently shrink the set of hosts a command reaches.
        """
        chosen = self._resolve(list(targets) or ["all"], {})
        dropped = self._resolve(list(exclude), chosen)
        return [h for n, h in chosen.items() if n not in dropped]

    def _resolve(self, targets: list[str], chosen: dict[str, Host]) -> dict[str, Host]:
        """Each target's hosts by name; ``chosen``: hosts already picked, which an exclusion may
        name although the inventory lacks them (``-x gpu03`` after ``gpu[01-04]:2222``)."""
        found: dict[str, Host] = {}
        for target in targets:
            for pattern in split_patterns(target):
                for host in self._resolve_one(pattern, chosen):
                    if (seen := found.get(host.name)) is not None and seen != host:
                        raise TargetError(f"{host.name!r} is named twice with different users or ports; "
                                          "its reports would share one folder: name it once")
                    found[host.name] = host
        return found

    def _resolve_one(self, pattern: str, chosen: dict[str, Host]) -> list[Host]:
        from . import adhoc  # it builds Hosts: imported here, where model is complete

        if pattern in self.groups:
            return [self.hosts[n] for n in self.groups[pattern]]
        if pattern in self.hosts:
            return [self.hosts[pattern]]
        if pattern in chosen:
            return [chosen[pattern]]
        if any(c in pattern for c in "*?"):
            hits = [h for h in self.hosts if fnmatchcase(h, pattern)]
            for g in self.groups:
                if fnmatchcase(g, pattern):
                    hits.extend(self.groups[g])
            if hits:
                return [self.hosts[n] for n in hits]
            if self.bare_names_are_hosts:
                raise TargetError(f"{pattern!r}: without an inventory, patterns match nothing; name the hosts "
                                  "(user@host:port, gpu[01-04]) or give one with -i")
            raise TargetError(f"{pattern!r} matches no host or group")
        if self.bare_names_are_hosts or adhoc.says_how_to_connect(pattern):
            return adhoc.hosts(adhoc.parse(pattern), self.hosts)
        try:
            names = expand(pattern)
        except HostPatternError as e:
            raise TargetError(str(e)) from None
        unknown = [n for n in names if n not in self.hosts and n not in chosen]
        if unknown:
            hint = difflib.get_close_matches(unknown[0], list(self.hosts) + list(self.groups), n=1)
            more = (f" (did you mean {hint[0]!r}?)" if hint
                    else f" (a host outside it is named with its user or port: user@{unknown[0]})")
            src = ", ".join(self.sources) or "the inventory"
            raise TargetError(f"{unknown[0]!r} is not a host or group in {src}{more}")
        return [self.hosts[n] if n in self.hosts else chosen[n] for n in names]
