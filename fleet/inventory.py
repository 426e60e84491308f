"""Ansible-style YAML inventories: groups, children, hosts, vars, host ranges.

An Ansible inventory is read unchanged. Errors name the file and the line, and
nothing is half-loaded: either the whole inventory is valid or loading raises
:class:`InventoryError`. fleet's own variables are documented in
``docs/inventory.md``; their names and types are checked here (see ``VARIABLES``).
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from . import safenames
from .hostlist import HostPatternError, expand, split_patterns

__all__ = ["Host", "Inventory", "InventoryError", "TargetError", "load", "local_inventory", "VARIABLES"]


class InventoryError(ValueError):
    """A malformed inventory; ``str()`` reads ``file:line: what is wrong``."""

    def __init__(self, where: str, message: str):
        super().__init__(f"{where}: {message}")
        self.where, self.message = where, message


class TargetError(ValueError):
    """Targets on the command line that name nothing in the inventory."""


# --- variables: name -> (check, description). A check returns an error or None. ---

def _str(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "a non-empty string is needed"


def _port(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 < v < 65536
    return None if ok else "a port number between 1 and 65535 is needed"


def _connection(v: Any) -> str | None:
    return None if v in ("ssh", "local") else "fleet reaches hosts by 'ssh' or 'local'"


_SYSCTL_NAME = re.compile(r"^[a-z0-9_]+(\.[a-z0-9_-]+)+$")


def _sysctls(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "a mapping of sysctl name to the value fleet may set is needed"
    for name, value in v.items():
        if not isinstance(name, str) or not _SYSCTL_NAME.match(name):
            return f"{name!r} is not a sysctl name (like kernel.perf_event_paranoid)"
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            return f"the value for {name} must be a number or a string"
    return None


def _str_list(v: Any) -> str | None:
    ok = isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
    return None if ok else "a list of names is needed"


def _password(v: Any) -> str | None:
    return "passwords do not belong in an inventory: use keys or an ssh agent"


VARIABLES: dict[str, tuple[Callable[[Any], str | None], str]] = {
    "ansible_host": (_str, "address to connect to (default: the host's name)"),
    "ansible_port": (_port, "SSH port"),
    "ansible_user": (_str, "SSH user"),
    "ansible_connection": (_connection, "'ssh' (default) or 'local'"),
    "ansible_python_interpreter": (_str, "python3 on the node that runs fleet's agent"),
    "ansible_ssh_private_key_file": (_str, "private key for this host"),
    "ansible_password": (_password, ""),
    "ansible_ssh_pass": (_password, ""),
    "ansible_become_pass": (_password, ""),
    "nsys_path": (_str, "nsys executable on the node, when it is not found by itself"),
    "ncu_path": (_str, "ncu executable on the node, when it is not found by itself"),
    "report_dir": (_str, "directory on the node where profilers write reports"),
    "owned_sysctls": (_sysctls, "sysctls fleet may set on this node, with the value to set"),
    "shared_report_dir": (_str, "label of a report directory several nodes share (NFS): read through one of them"),
    "remove_gathered_reports": (lambda v: None if isinstance(v, bool) else "true or false is needed",
                                "delete a report on the node once its copy in the store is verified"),
    "docker_seccomp_profile": (_str, "seccomp profile on the node that allows perf_event_open (CPU sampling in Docker)"),
    "slurm_login": (_str, "login host of the Slurm cluster this group describes"),
    "slurm_partitions": (_str_list, "partitions of that cluster fleet may submit to"),
    "slurm_scratch": (_str, "node-local directory the ranks write reports to (copied to the run directory)"),
}

_GROUP_KEYS = ("hosts", "children", "vars")
_HOSTNAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9._:-]*[A-Za-z0-9_])?$")


# --- YAML with line numbers ---

class _Map(dict):
    """A YAML mapping that remembers the line of itself and of each key."""

    line: int = 0
    lines: dict

    def line_of(self, key: Any) -> int:
        return self.lines.get(key, self.line)


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    loader.flatten_mapping(node)
    out = _Map()
    out.line, out.lines = node.start_mark.line + 1, {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if key in out:
            raise InventoryError(f"{loader.name}:{key_node.start_mark.line + 1}",
                                 f"{key!r} is given twice in one mapping")
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)


# --- the model ---

@dataclass(frozen=True)
class Host:
    name: str
    vars: dict[str, Any]
    groups: tuple[str, ...]
    where: str  # file:line of the (first) definition

    @property
    def address(self) -> str:
        return self.vars.get("ansible_host", self.name)

    @property
    def port(self) -> int | None:
        return self.vars.get("ansible_port")

    @property
    def user(self) -> str | None:
        return self.vars.get("ansible_user")

    @property
    def connection(self) -> str:
        return self.vars.get("ansible_connection", "ssh")

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "port": self.port, "user": self.user,
                "connection": self.connection, "groups": list(self.groups), "vars": self.vars}


@dataclass
class _Group:
    name: str
    where: str
    hosts: dict[str, str] = field(default_factory=dict)     # host -> file:line
    children: dict[str, str] = field(default_factory=dict)  # group -> file:line
    vars: dict[str, Any] = field(default_factory=dict)


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


# --- loading ---

class _Builder:
    def __init__(self) -> None:
        self.groups: dict[str, _Group] = {"all": _Group("all", "")}
        self.host_vars: dict[str, dict[str, Any]] = {}
        self.host_where: dict[str, str] = {}

    def group(self, name: Any, body: Any, file: str, line: int) -> None:
        where = f"{file}:{line}"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise InventoryError(where, f"bad group name {name!r}")
        group = self.groups.setdefault(name, _Group(name, where))
        group.where = group.where or where
        if body is None:
            return
        if not isinstance(body, _Map):
            raise InventoryError(where, f"group {name!r} must be a mapping of {', '.join(_GROUP_KEYS)}")
        for key in body:
            if key not in _GROUP_KEYS:
                hint = difflib.get_close_matches(str(key), _GROUP_KEYS, n=1)
                more = f"; did you mean {hint[0]!r}?" if hint else ""
                raise InventoryError(f"{file}:{body.line_of(key)}",
                                     f"unknown key {key!r} in group {name!r} (expected {', '.join(_GROUP_KEYS)}){more}")
        for key in _GROUP_KEYS:
            if body.get(key) is not None and not isinstance(body[key], _Map):
                raise InventoryError(f"{file}:{body.line_of(key)}", f"'{key}' of group {name!r} must be a mapping")
        group.vars.update(_checked_vars(body.get("vars") or _Map(), file))
        hosts = body.get("hosts") or _Map()
        for pattern, hvars in hosts.items():
            self.hosts(group, pattern, hvars, file, hosts.line_of(pattern))
        children = body.get("children") or _Map()
        for child, child_body in children.items():
            cline = children.line_of(child)
            group.children.setdefault(child, f"{file}:{cline}")
            self.group(child, child_body, file, cline)

    def hosts(self, group: _Group, pattern: Any, hvars: Any, file: str, line: int) -> None:
        where = f"{file}:{line}"
        if not isinstance(pattern, str):
            raise InventoryError(where, f"bad host name {pattern!r}")
        if hvars is not None and not isinstance(hvars, _Map):
            raise InventoryError(where, f"host {pattern!r} must map to its variables (or nothing)")
        try:
            names = expand(pattern)
        except HostPatternError as e:
            raise InventoryError(where, str(e)) from None
        checked = _checked_vars(hvars or _Map(), file)
        for name in names:
            group.hosts.setdefault(name, where)
            self.host_vars.setdefault(name, {}).update(checked)
            self.host_where.setdefault(name, where)

    def build(self, sources: list[str]) -> Inventory:
        self._check_cycles()
        for group in self.groups.values():  # top-level groups are children of all
            if group.name != "all" and not any(group.name in g.children for g in self.groups.values()):
                self.groups["all"].children.setdefault(group.name, group.where)
        depth = self._depths()
        members = {g: self._members(g) for g in self.groups}
        hosts: dict[str, Host] = {}
        for name in self.host_vars:
            in_groups = sorted((g for g in self.groups if name in members[g]),
                               key=lambda g: (depth[g], self.groups[g].vars.get("ansible_group_priority", 1), g))
            merged: dict[str, Any] = {}
            for g in in_groups:  # parents first, so children and then the host override
                merged.update(self.groups[g].vars)
            merged.update(self.host_vars[name])
            merged.pop("ansible_group_priority", None)
            if "ansible_host" not in merged and not _HOSTNAME.match(name):
                raise InventoryError(self.host_where[name],
                                     f"host {name!r} has no address: its name is not a host name and no ansible_host is set")
            # Its name becomes folders and files (the store, the node's report and result): refused
            # here, where the line can be named, also when ansible_host gives it an address.
            problem = safenames.component_problem(name, "host name")
            if problem:
                raise InventoryError(self.host_where[name], problem)
            hosts[name] = Host(name, merged, tuple(g for g in in_groups if g != "all"), self.host_where[name])
        return Inventory(hosts, {g: [h for h in hosts if h in members[g]] for g in self.groups}, sources)

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
                    cycle = " -> ".join(path[path.index(child):] + [name, child]) if child in path else f"{name} -> {child}"
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
        while frontier:  # longest path from all; the graph is acyclic by now
            nxt = []
            for g in frontier:
                for child in self.groups[g].children:
                    if depth.get(child, -1) < depth[g] + 1:
                        depth[child] = depth[g] + 1
                        nxt.append(child)
            frontier = nxt
        return depth


def _checked_vars(block: _Map, file: str) -> dict[str, Any]:
    for key, value in block.items():
        where = f"{file}:{block.line_of(key)}"
        if not isinstance(key, str):
            raise InventoryError(where, f"bad variable name {key!r}")
        if key in VARIABLES:
            problem = VARIABLES[key][0](value)
            if problem:
                raise InventoryError(where, f"{key}: {problem}")
        elif key != "ansible_group_priority":
            hint = difflib.get_close_matches(key, VARIABLES, n=1, cutoff=0.8)
            if hint:
                raise InventoryError(where, f"unknown variable {key!r}; did you mean {hint[0]!r}?")
    return dict(block)


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file())
    if not path.exists():
        raise InventoryError(str(path), "no such inventory file or directory")
    return [path]


def read_yaml(file: Path) -> Any:
    """A YAML file whose mappings remember their lines (``_Map``); errors name file and line."""
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(str(file), f"cannot read: {e}") from None
    loader = _Loader(text)
    loader.name = str(file)
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        raise InventoryError(f"{file}:{line}", f"not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise InventoryError(str(file), f"not valid YAML: {e}") from None
    finally:
        loader.dispose()


def load(paths: Iterable[str | os.PathLike]) -> Inventory:
    """Load one or more inventory files or directories (every ``*.yml``/``*.yaml``)."""
    builder = _Builder()
    sources: list[str] = []
    for path in paths:
        for file in _files(Path(path)):
            sources.append(str(file))
            doc = read_yaml(file)
            if doc is None:
                continue
            if not isinstance(doc, _Map):
                raise InventoryError(f"{file}:1", "an inventory is a mapping of groups (usually 'all:')")
            for name, body in doc.items():
                builder.group(name, body, str(file), doc.line_of(name))
    return builder.build(sources)


def local_inventory() -> Inventory:
    """The embedded default: this machine alone, reached without SSH."""
    name = socket.gethostname() or "localhost"
    host = Host(name, {"ansible_connection": "local"}, (), "(this machine)")
    return Inventory({name: host}, {"all": [name], "local": [name], "localhost": [name]}, ["(this machine)"])
