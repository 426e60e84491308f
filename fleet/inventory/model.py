"""What an inventory is once read: hosts with their merged variables and groups, and
how targets select them.

This module knows nothing of file formats; ``load`` (in ``__init__``) builds an
:class:`Inventory` from whatever sources it was given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..hostlist import split_patterns
from . import adhoc, patterns
from .host import Host, InventoryError, TargetError

# Host and the errors live in host.py
__all__ = ["Host", "Inventory", "InventoryError", "TargetError"]


@dataclass
class Inventory:
    hosts: dict[str, Host]
    groups: dict[str, list[str]]  # group -> every host in it, children included
    sources: list[str]
    # Without an inventory every name that is not this machine is an SSH host (as for ssh and
    # clush -w); with one, a bare name must be in it and only user@host or host:port reach past it.
    bare_names_are_hosts: bool = False
    warnings: list[str] = field(default_factory=list)  # file:line: kept, shown, not used by fleet

    def select(self, targets: Iterable[str] = (), exclude: Iterable[str] = ()) -> list[Host]:
        """Hosts named by targets (Ansible's host patterns, and hosts named with a user or a port),
        minus ``exclude``, in Ansible's order.

        No targets means every host. A pattern that names nothing is an error: a typo must not
        silently shrink the set of hosts a command reaches (Ansible warns and goes on).
        """
        chosen = self._resolve(list(targets) or ["all"], {})
        dropped = self._resolve(list(exclude), chosen)
        return [h for n, h in chosen.items() if n not in dropped]

    def _resolve(self, targets: list[str], chosen: dict[str, Host]) -> dict[str, Host]:
        """Each target's hosts by name; ``chosen``: hosts already picked, which an exclusion may
        name although the inventory lacks them (``-x gpu03`` after ``alice@gpu[01-04]``)."""
        found: dict[str, Host] = {}
        for target in targets:
            for host in self._resolve_target(target, chosen):
                if (seen := found.get(host.name)) is not None and seen != host:
                    raise TargetError(f"{host.name!r} is named twice with different users or "
                                      "ports; its reports would share one folder: name it once")
                found[host.name] = host
        return found

    def _resolve_target(self, target: str, chosen: dict[str, Host]) -> list[Host]:
        if self.bare_names_are_hosts:
            return [h for p in split_patterns(target) for h in self._without_inventory(p, chosen)]
        extra = {n: h for n, h in chosen.items() if n not in self.hosts}
        known = {**self.hosts, **extra}
        out: list[Host] = []
        words = []
        for word in split_patterns(target):  # on the commas outside brackets: alice@gpu[01-04,07]
            if adhoc.is_connect_target(word):
                out += adhoc.hosts(adhoc.parse(word), self.hosts)
            else:
                words.append(word)
        if words:
            # Ansible splits on every comma when there is one (gpu[1,2] is two patterns there)
            split = [p.strip() for w in words for p in w.split(",")] if "," in target else None
            groups = {**self.groups, "all": self.groups.get("all", []) + list(extra)}
            matcher = patterns.Matcher(list(known), groups,
                                       ", ".join(self.sources) or "the inventory")
            patterns.range_reading(",".join(words), matcher)
            out += [known[n] for n in matcher.select(",".join(words), split)]
        return out

    def _without_inventory(self, pattern: str, chosen: dict[str, Host]) -> list[Host]:
        """Without an inventory every name is a host to reach, as for ssh and clush -w."""
        if pattern in self.groups:
            return [self.hosts[n] for n in self.groups[pattern]]
        if pattern in self.hosts:
            return [self.hosts[pattern]]
        if pattern in chosen:
            return [chosen[pattern]]
        if any(c in pattern for c in "*?"):
            raise TargetError(f"{pattern!r}: without an inventory, patterns match nothing; name "
                              "the hosts (user@host:port, gpu[01-04]) or give one with -i")
        return adhoc.hosts(adhoc.parse(pattern), self.hosts)
