"""YAML inventories (``all:``, ``hosts``, ``children``, ``vars``), and YAML read with line numbers.

``read_yaml`` also serves vars files, the JSON ansible-inventory writes (JSON is YAML) and
fleet's playbooks: every mapping remembers the line of each key, so an error names it.
"""

from __future__ import annotations

import difflib
import os
import stat
from pathlib import Path
from typing import Any

import yaml

from .builder import Builder
from .host import InventoryError

_GROUP_KEYS = ("hosts", "children", "vars")
VAULT_HEADER = "$ANSIBLE_VAULT"


class _Map(dict):
    """A YAML mapping that remembers the line of itself and of each key."""

    line: int = 0
    lines: dict

    def line_of(self, key: Any) -> int:
        return self.lines.get(key, self.line)


class _Loader(yaml.SafeLoader):
    pass


def _construct_map(loader: _Loader, node: yaml.MappingNode) -> _Map:
    explicit = sum(1 for key, _ in node.value if key.tag != "tag:yaml.org,2002:merge")
    # the pairs of `<<: *anchor` come first, the mapping's own after them
    loader.flatten_mapping(node)
    merged = len(node.value) - explicit
    out = _Map()
    out.line, out.lines = node.start_mark.line + 1, {}
    own: set = set()
    for i, (key_node, value_node) in enumerate(node.value):
        key = loader.construct_object(key_node, deep=True)
        if i >= merged:  # a key of the mapping's own overrides a merged one, as in Ansible
            if key in own:
                raise InventoryError(f"{loader.name}:{key_node.start_mark.line + 1}",
                                     f"{key!r} is given twice in one mapping")
            own.add(key)
        out[key] = loader.construct_object(value_node, deep=True)
        out.lines[key] = key_node.start_mark.line + 1
    return out


def _timestamp(loader: _Loader, node: yaml.ScalarNode) -> str:
    # Ansible writes a YAML date or time as ISO 8601 (isoformat), and fleet uses none as a date
    return loader.construct_yaml_timestamp(node).isoformat()


def _refuse_vault(loader: _Loader, node: yaml.Node) -> None:
    raise InventoryError(f"{loader.name}:{node.start_mark.line + 1}",
                         "a vault-encrypted value (!vault): fleet does not decrypt Ansible Vault "
                         "(see 'What fleet leaves out' in docs/inventory.md)")


def _unsafe(loader: _Loader, node: yaml.Node) -> Any:
    # Ansible's !unsafe only keeps a value from being templated; fleet templates nothing.
    if isinstance(node, yaml.ScalarNode):
        return loader.construct_scalar(node)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return _construct_map(loader, node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_map)
_Loader.add_constructor("!vault", _refuse_vault)
_Loader.add_constructor("!unsafe", _unsafe)
_Loader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)

MAX_BYTES = 16 << 20   # one inventory or vars file; a real site's largest is far smaller
MAX_VALUES = 100_000   # values of one file once its aliases are expanded: a YAML bomb is refused


def read_text(file: Path) -> str:
    """A file's text; a vault-encrypted file, a NUL byte and anything but a regular file (a FIFO,
    /dev/zero) are refused here, whatever its format, before more than MAX_BYTES are read."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InventoryError(str(file),
                                     "not a regular file (a FIFO, a "
                                     "device?): fleet reads only files")
            with os.fdopen(fd, "rb", closefd=False) as f:
                data = f.read(MAX_BYTES + 1)
        finally:
            os.close(fd)
        if len(data) > MAX_BYTES:
            raise InventoryError(str(file),
                                 f"larger than {MAX_BYTES >> 20} MiB: not an inventory fleet reads")
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(str(file), f"cannot read: {e}") from None
    if "\0" in text:
        line = text.count("\n", 0, text.index("\0")) + 1
        raise InventoryError(f"{file}:{line}", "a NUL byte: this is not a text file")
    if text.startswith(VAULT_HEADER):
        raise InventoryError(f"{file}:1",
                             "a vault-encrypted file: fleet does not decrypt Ansible Vault "
                                          "(see 'What fleet leaves out' in docs/inventory.md)")
    return text


def _expanded_size(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values a node stands for with its aliases expanded (each alias counts whole)."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a recursive alias counts once: PyYAML refuses it when constructing
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expanded_size(n, sizes) for n in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expanded_size(k, sizes) + _expanded_size(v, sizes) for k, v in node.value)
    sizes[id(node)] = min(size, MAX_VALUES + 1)
    return sizes[id(node)]


def parse_yaml(text: str, file: Path) -> Any:
    loader = _Loader(text)
    loader.name = str(file)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _expanded_size(node, {}) > MAX_VALUES:
            raise InventoryError(str(file),
                                 f"its YAML aliases expand to more than {MAX_VALUES:,} values "
                                            "(a YAML bomb?): fleet refuses it")
        return loader.construct_document(node)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        line = mark.line + 1 if mark else 0
        raise InventoryError(f"{file}:{line}", f"not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise InventoryError(str(file), f"not valid YAML: {e}") from None
    except RecursionError:
        raise InventoryError(str(file), "nested too deeply to read") from None
    finally:
        loader.dispose()


def read_yaml(file: Path) -> Any:
    """A YAML file whose mappings remember their lines (``_Map``); errors name file and line."""
    return parse_yaml(read_text(file), file)


def is_mapping(doc: Any) -> bool:
    return isinstance(doc, _Map)


def read_inventory(doc: Any, file: str, builder: Builder) -> None:
    """A YAML inventory: a mapping of groups."""
    if doc is None:
        return
    if not isinstance(doc, _Map):
        raise InventoryError(f"{file}:1", "an inventory is a mapping of groups (usually 'all:')")
    if "plugin" in doc:
        raise InventoryError(f"{file}:{doc.line_of('plugin')}",
                             f"the configuration of the inventory plugin {doc['plugin']!r}: fleet "
                             "does not run inventory plugins; give it what "
                             "`ansible-inventory -i FILE --list` writes")
    for name, body in doc.items():
        _group(builder, name, body, file, doc.line_of(name))


def _group(builder: Builder, name: Any, body: Any, file: str, line: int) -> None:
    where = f"{file}:{line}"
    builder.group(name, where)
    if body is None:
        return
    if not isinstance(body, _Map):
        raise InventoryError(where, f"group {name!r} must be a mapping of {', '.join(_GROUP_KEYS)}")
    _check_group_keys(body, name, file)
    _check_group_sections(body, name, file)
    variables = body.get("vars") or _Map()
    for key, value in variables.items():
        builder.group_var(name, key, value, f"{file}:{variables.line_of(key)}")
    _group_hosts(builder, name, body.get("hosts") or _Map(), file)
    children = body.get("children") or _Map()
    for child, child_body in children.items():
        cline = children.line_of(child)
        _group(builder, child, child_body, file, cline)
        builder.child(name, child, f"{file}:{cline}")


def _check_group_keys(body: _Map, name: Any, file: str) -> None:
    """Refuse a key of a group other than hosts, children and vars, with the one it likely meant."""
    for key in body:
        if key not in _GROUP_KEYS:
            hint = difflib.get_close_matches(str(key), _GROUP_KEYS, n=1)
            more = f"; did you mean {hint[0]!r}?" if hint else ""
            raise InventoryError(f"{file}:{body.line_of(key)}",
                                 f"unknown key {key!r} in group {name!r} (expected "
                                 f"{', '.join(_GROUP_KEYS)}){more}")


def _check_group_sections(body: _Map, name: Any, file: str) -> None:
    """Each of a group's hosts, children and vars is a mapping (or nothing); ``hosts: h1`` and
    ``children: g1`` are made one-key mappings in place, as Ansible reads them."""
    for key in _GROUP_KEYS:
        value = body.get(key)
        if isinstance(value, str) and key != "vars":  # Ansible reads `hosts: h1` as one host
            body[key] = value = _Map({value: None})
            value.line, value.lines = body.line_of(key), {}
        if value is not None and not isinstance(value, _Map):
            raise InventoryError(f"{file}:{body.line_of(key)}",
                                 f"'{key}' of group {name!r} must be a mapping")


def _group_hosts(builder: Builder, name: Any, hosts: _Map, file: str) -> None:
    """The hosts of a group's ``hosts:``, each pattern with the variables it maps to."""
    for pattern, hvars in hosts.items():
        hwhere = f"{file}:{hosts.line_of(pattern)}"
        if hvars is not None and not isinstance(hvars, _Map):
            raise InventoryError(hwhere, f"host {pattern!r} must map to its variables (or nothing)")
        for host in builder.hosts(name, pattern, hwhere):
            for key, value in (hvars or _Map()).items():
                builder.host_var(host, key, value, f"{file}:{hvars.line_of(key)}")


def read_listing(doc: _Map, file: str, builder: Builder) -> None:
    """What ``ansible-inventory --list`` writes (with or without ``--export``), read as Ansible's
    script plugin reads it: groups list their hosts and children,
    ``_meta.hostvars`` the variables."""
    hostvars = _listing_hostvars(doc, file)
    seen: dict[str, None] = {}
    for name, body in doc.items():
        if name == "_meta":
            continue
        where = f"{file}:{doc.line_of(name)}"
        seen.update(dict.fromkeys(_listing_group(builder, name, body, file, where)))
    for host in seen:
        variables = (hostvars or {}).get(host) or _Map()
        if not isinstance(variables, _Map):
            raise InventoryError(f"{file}:{hostvars.line_of(host)}",
                                 f"the variables of {host!r} must be a mapping")
        for key, value in variables.items():
            builder.host_var(host, key, value, f"{file}:{variables.line_of(key)}")


def _listing_hostvars(doc: _Map, file: str) -> _Map | None:
    """The listing's ``_meta.hostvars``, or None where it gives none."""
    meta = doc.get("_meta")
    hostvars = meta.get("hostvars") if isinstance(meta, _Map) else None
    if hostvars is not None and not isinstance(hostvars, _Map):
        raise InventoryError(f"{file}:{meta.line_of('hostvars')}",
                             "'_meta.hostvars' must be a mapping")
    return hostvars


def _listing_group(builder: Builder, name: Any, body: Any, file: str, where: str) -> list[str]:
    """One group of a listing (a mapping, or a list of its hosts); the hosts it names."""
    builder.group(name, where)
    if isinstance(body, list):
        body = {"hosts": body}
    if not isinstance(body, dict):
        raise InventoryError(where, f"group {name!r} must be a mapping of hosts, children, vars")
    _check_listing_sections(body, name, file, where)
    at = (lambda key: f"{file}:{body.line_of(key)}") if isinstance(body,
                                                                   _Map) else (lambda key: where)
    hosts: list[str] = []
    for host in body.get("hosts") or []:
        hosts += builder.hosts(name, host, at("hosts"), literal=True)
    for key, value in (body.get("vars") or _Map()).items():
        builder.group_var(name, key, value, f"{file}:{body['vars'].line_of(key)}")
    for child in body.get("children") or []:
        builder.child(name, child, at("children"))
    return hosts


def _check_listing_sections(body: dict, name: Any, file: str, where: str) -> None:
    """A listing's group lists its hosts and children and maps its vars."""
    for key, kind in (("hosts", list), ("children", list), ("vars", dict)):
        if body.get(key) is not None and not isinstance(body[key], kind):
            at = f"{file}:{body.line_of(key)}" if isinstance(body, _Map) else where
            raise InventoryError(at, f"'{key}' of group {name!r} must be a {kind.__name__}")
