"""Groups, hosts and variables as the sources declare them, merged as Ansible merges them.

The readers of each format (``yaml_source``, ``ini_source``, ``listing_source``) call the
same few methods, so the rules that do not depend on the format live here once: names,
host patterns, variable checks, cycles, depth and precedence.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import safenames
from ..hostlist import HostPatternError, expand
from .model import Host, Inventory, InventoryError
from .variables import check_variable, group_priority, usable

# A name fleet may connect to when no ansible_host is set.
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._:-]*[A-Za-z0-9_])?$")
_GROUP_NAME = re.compile(r"[A-Za-z0-9_.-]+")
# `[2001:db8::1]:2222`: an IPv6 address in brackets with a port.
_IPV6_PORT = re.compile(r"\[([0-9A-Fa-f:.]+)\]:(\d+)")



def split_port(pattern: str) -> tuple[str, int | None]:
    """``host:port`` as Ansible's parse_address splits it; the port applies to every expanded name.

    A colon inside brackets belongs to a range (``gx-[01:03]``); several colons outside
    them make an IPv6 address, which has no port unless it is written ``[addr]:port``.
    """
    if m := _IPV6_PORT.fullmatch(pattern):
        return m[1], int(m[2])
    depth, colons = 0, []
    for i, ch in enumerate(pattern):
        depth += (ch == "[") - (ch == "]")
        if ch == ":" and depth == 0:
            colons.append(i)
    if len(colons) == 1:
        head, tail = pattern[:colons[0]], pattern[colons[0] + 1:]
        if tail.isascii() and tail.isdigit():
            return head, int(tail)
    return pattern, None


@dataclass
class _Group:
    name: str
    where: str
    hosts: dict[str, str] = field(default_factory=dict)     # host -> file:line
    children: dict[str, str] = field(default_factory=dict)  # group -> file:line
    vars: dict[str, Any] = field(default_factory=dict)
    priority: int = 1


class Builder:
    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {"all": _Group("all", ""),
                                          "ungrouped": _Group("ungrouped", "")}
        self.host_vars: dict[str, dict[str, Any]] = {}
        self.host_where: dict[str, str] = {}
        self.warnings: list[str] = []  # file:line: what fleet keeps but will not use

    # --- what the readers call ---

    def group(self, name: Any, where: str) -> _Group:
        if not isinstance(name, str) or not _GROUP_NAME.fullmatch(name):
            raise InventoryError(where, f"bad group name {name!r}")
        group = self.groups.setdefault(name, _Group(name, where))
        group.where = group.where or where
        return group

    def child(self, parent: str, child: str, where: str) -> None:
        self.group(child, where)
        self.groups[parent].children.setdefault(child, where)

    def hosts(self, group: str, pattern: Any, where: str, literal: bool = False) -> list[str]:
        """Add the hosts a pattern (``gx-[01:03]:2201``) stands for to a group; their names.
        ``literal``: the pattern is one host's name, as in what ansible-inventory writes."""
        if not isinstance(pattern, str) or not pattern:
            raise InventoryError(where, f"bad host name {pattern!r}")
        names, port = [pattern], None
        if not literal:
            if pattern.endswith(":"):
                raise InventoryError(where, f"host {pattern!r} ends in ':' with no port after it")
            name_pattern, port = split_port(pattern)
            try:
                names = expand(name_pattern)
            except HostPatternError as e:
                raise InventoryError(where, str(e)) from None
        for name in names:
            # Its name becomes folders and files (the store, the node's report and result): refused
            # here, where the line can be named, also when ansible_host gives it an address.
            if (problem := safenames.component_problem(name, "host name")):
                raise InventoryError(where, problem)
            self.groups[group].hosts.setdefault(name, where)
            self.host_vars.setdefault(name, {})
            self.host_where.setdefault(name, where)
            if port is not None:  # as Ansible does: the port becomes the host's ansible_port
                self.host_vars[name]["ansible_port"] = port
        return names

    def group_var(self, group: str, key: Any, value: Any, where: str) -> None:
        # Ansible keeps it as the group's priority, not a variable
        if key == "ansible_group_priority":
            self.groups[group].priority = group_priority(value, where)
            return
        self.warn(where, check_variable(key, value, where))
        self.groups[group].vars[key] = value

    def host_var(self, host: str, key: Any, value: Any, where: str) -> None:
        self.warn(where, check_variable(key, value, where))
        self.host_vars[host][key] = value

    def warn(self, where: str, warning: str | None) -> None:
        if warning and (line := f"{where}: {warning}") not in self.warnings:
            self.warnings.append(line)

    # --- the merge ---

    def build(self, sources: list[str],
              vars_of: Callable[[str, list[str]], dict[str, Any]]) -> Inventory:
        """The inventory; ``vars_of(kind, names)`` merges the vars files of groups or of a host
        (``kind`` is 'group_vars' or 'host_vars') in the order Ansible reads them."""
        self._check_cycles()
        self._attach_to_all()
        depth = self._depths()
        self._settle_ungrouped()
        members = {g: self._members(g) for g in self.groups}
        hosts: dict[str, Host] = {}
        for name in self.host_vars:
            in_groups = sorted((g for g in self.groups if g != "all" and name in members[g]),
                               key=lambda g: (depth[g], self.groups[g].priority, g))
            hosts[name] = self._host(name, in_groups, vars_of)
        return Inventory(hosts, {g: self._ansible_order(g) for g in self.groups}, sources,
                         warnings=self.warnings)

    def _attach_to_all(self) -> None:
        """'ungrouped' first among the children of 'all', then every top-level group."""
        # 'ungrouped' is the first child of 'all' in Ansible (it is made with the inventory)
        children = self.groups["all"].children
        self.groups["all"].children = {"ungrouped": children.pop("ungrouped", ""), **children}
        for group in self.groups.values():  # top-level groups are children of all
            if group.name != "all" and not any(group.name in g.children
                                               for g in self.groups.values()):
                self.groups["all"].children.setdefault(group.name, group.where)

    def _settle_ungrouped(self) -> None:
        """As Ansible: a host in no group but all is in 'ungrouped', and only such a host."""
        members = {g: self._members(g) for g in self.groups}
        for name in self.host_vars:
            in_any = any(name in members[g] for g in self.groups if g not in ("all", "ungrouped"))
            if in_any:
                self.groups["ungrouped"].hosts.pop(name, None)
            else:
                self.groups["ungrouped"].hosts.setdefault(name, self.host_where[name])

    def _host(self, name: str, in_groups: list[str],
              vars_of: Callable[[str, list[str]], dict[str, Any]]) -> Host:
        """One host with its variables merged; ``in_groups`` weakest first."""
        merged: dict[str, Any] = {}
        # Weakest first, in the order of Ansible's VariableManager.get_vars and its default
        # VARIABLE_PRECEDENCE: the inventory's vars of all, then of each group (by depth,
        # priority, name); then the vars files: group_vars/all, then each group's; then the
        # host's own vars and its host_vars files. So group_vars/all beats an inline [gpu:vars].
        # Every value was checked where it was set, and merging replaces whole values.
        merged.update(self.groups["all"].vars)
        for g in in_groups:
            merged.update(self.groups[g].vars)
        merged.update(vars_of("group_vars", ["all"]))
        merged.update(vars_of("group_vars", in_groups))
        merged.update(self.host_vars[name])
        merged.update(vars_of("host_vars", [name]))
        address = merged.get("ansible_ssh_host") or merged.get("ansible_host")
        if not address and not _HOSTNAME.match(name):
            raise InventoryError(self.host_where[name],
                                 f"host {name!r} has no address: its name is not a host name "
                                 "and no ansible_host is set")
        unused = {k: v for k, v in merged.items() if not usable(k, v)}  # warned where they were set
        used = {k: v for k, v in merged.items() if k not in unused}
        return Host(name, used, tuple(in_groups), self.host_where[name], unused)

    def _ansible_order(self, name: str) -> list[str]:
        """A group's hosts in the order Ansible's Group.get_hosts gives them (the order its
        subscripts count in): its own, then its children's, breadth first, each host once.
        Past the children Ansible walks a set, so its order of grandchildren from several parents
        is not fixed; fleet takes them parent by parent."""
        order, seen, level = [name], {name}, [name]
        while level:
            nxt = [c for g in level for c in self.groups[g].children if c not in seen]
            nxt = list(dict.fromkeys(nxt))
            seen.update(nxt)
            order += nxt
            level = nxt
        return list(dict.fromkeys(h for g in order for h in self.groups[g].hosts))

    def _members(self, name: str) -> set[str]:
        group = self.groups[name]
        out = set(group.hosts)
        for child in group.children:
            out |= self._members(child)
        return out

    def _check_cycles(self) -> None:
        state: dict[str, int] = {}  # 1: on the current path, 2: done

        def visit(name: str, path: list[str]) -> None:
            state[name] = 1
            for child, where in self.groups[name].children.items():
                if state.get(child) == 1:
                    cycle = (" -> ".join(path[path.index(child):] + [name, child]) if child in path
                             else f"{name} -> {child}")
                    raise InventoryError(where, f"groups form a cycle: {cycle}")
                if state.get(child) is None:
                    visit(child, path + [name])
            state[name] = 2

        for name in self.groups:
            if state.get(name) is None:
                visit(name, [])

    def _depths(self) -> dict[str, int]:
        depth = {"all": 0}
        frontier = ["all"]
        # longest path from all, as Ansible's group depth; the graph is acyclic by now
        while frontier:
            nxt = []
            for g in frontier:
                for child in self.groups[g].children:
                    if depth.get(child, -1) < depth[g] + 1:
                        depth[child] = depth[g] + 1
                        nxt.append(child)
            frontier = nxt
        return depth
