"""Ansible inventories as Ansible reads them: INI, YAML, the JSON ansible-inventory writes,
``group_vars/`` and ``host_vars/`` beside them, merged with Ansible's precedence.

Errors name the file and the line, and nothing is half-loaded: either the whole inventory
is valid or loading raises :class:`InventoryError`. fleet's own variables are documented in
``docs/inventory.md``; their names and types are checked (see ``VARIABLES``). What fleet
leaves out of Ansible (vault, inventory plugins and scripts, templates) is refused where it
would matter, and listed in that document.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Iterable

from .model import Host, Inventory, InventoryError, TargetError
from .variables import VARIABLES

__all__ = ["Host", "Inventory", "InventoryError", "TargetError", "load", "local_inventory",
           "read_yaml", "VARIABLES"]


def __getattr__(name: str):
    # The readers (PyYAML above all) load on first use: a command without an
    # inventory never needs them.
    if name == "read_yaml":
        from .yaml_source import read_yaml

        return read_yaml
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

# What Ansible skips in a directory given as the inventory: hidden files, the vars directories,
# and its INVENTORY_IGNORE_EXTS (REJECT_EXTS and .orig, .cfg, .retry).
_IGNORED = re.compile(r"^\.|^host_vars$|^group_vars$|^vars_plugins$"
                      r"|(\.pyc|\.pyo|\.swp|\.bak|~|\.rpm|\.md|\.txt|\.rst|\.orig|\.cfg|\.retry)$")


def _files(path: Path) -> list[Path]:
    """The inventory files of a source: itself, or every file under a directory, in name order."""
    if path.is_dir():
        out: list[Path] = []
        for entry in sorted(path.iterdir(), key=lambda p: p.name):
            if not _IGNORED.search(entry.name):
                out.extend(_files(entry) if entry.is_dir() else [entry] if entry.is_file() else [])
        return out
    if not path.exists():
        raise InventoryError(str(path), "no such inventory file or directory")
    return [path]


def _read_source(file: Path, builder) -> None:
    from . import ini_source, yaml_source

    text = yaml_source.read_text(file)
    if text.startswith("#!"):
        raise InventoryError(f"{file}:1",
                             "an inventory script: fleet does not run it; give fleet what "
                                          f"`{file.name} --list` (or `ansible-inventory "
                                          f"-i {file.name} --list`) writes")
    suffix = file.suffix.lower()
    if suffix == ".toml":
        raise InventoryError(str(file),
                             "TOML inventories are not read: write it as YAML or INI, or give "
                                        "fleet what `ansible-inventory -i FILE --list` writes")
    if suffix == ".ini" or suffix not in (".yml", ".yaml",
                                          ".json") and ini_source.looks_like_ini(text):
        ini_source.read_inventory(text, str(file), builder)
        return
    doc = yaml_source.parse_yaml(text, file)
    if yaml_source.is_mapping(doc) and "_meta" in doc:
        yaml_source.read_listing(doc, str(file), builder)
    else:
        yaml_source.read_inventory(doc, str(file), builder)


def load(paths: Iterable[str | os.PathLike]) -> Inventory:
    """Load one or more inventory files or directories, as ``ansible-inventory -i P -i Q`` would."""
    from .builder import Builder
    from .vars_dirs import VarsDirs

    builder = Builder()
    given = [Path(p) for p in paths]
    sources: list[str] = []
    for path in given:
        for file in _files(path):
            sources.append(str(file))
            _read_source(file, builder)
    vars_dirs = VarsDirs(given)
    vars_dirs.warnings = builder.warnings  # one list, in the order the files are read
    for group in builder.groups:  # read and check every vars file now, not only those a host uses
        vars_dirs.vars_of("group_vars", [group])
    return builder.build(sources, vars_dirs.vars_of)


def local_inventory() -> Inventory:
    """The embedded default: this machine, reached without SSH, as ``localhost``, ``local``, ``all``
    or its host name; any other target is an ad-hoc SSH host (see ``adhoc``)."""
    name = socket.gethostname() or "localhost"
    host = Host(name, {"ansible_connection": "local"}, (), "(this machine)")
    return Inventory({name: host}, {"all": [name], "local": [name], "localhost": [name]},
                     ["(this machine)"], bare_names_are_hosts=True)
