"""``group_vars/`` and ``host_vars/`` beside each inventory source, found as Ansible finds them.

For a group or host NAME, Ansible's host_group_vars plugin (through DataLoader.find_vars_files)
tries ``NAME``, ``NAME.yml``, ``NAME.yaml``, ``NAME.json`` in that order and takes the first that
exists: a file is read; a directory gives every file under it, in name order, descending into
subdirectories without an extension, skipping hidden files, backups (``~``) and files with an
extension not in that list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .host import InventoryError
from .variables import check_variable
from .yaml_source import is_mapping, read_yaml

EXTENSIONS = (".yml", ".yaml", ".json")


def _dir_files(path: Path) -> list[Path]:
    found: list[Path] = []
    for entry in sorted(path.iterdir(), key=lambda p: p.name):
        if entry.name.startswith(".") or entry.name.endswith("~"):
            continue
        if entry.is_dir() and not entry.suffix:
            found.extend(_dir_files(entry))
        elif entry.is_file() and (not entry.suffix or entry.suffix in EXTENSIONS):
            found.append(entry)
    return found


def files_for(vars_dir: Path, name: str) -> list[Path]:
    """The vars files for one group or host in one ``group_vars`` or ``host_vars`` directory."""
    if name.startswith("/"):  # Ansible skips such names ('chroot' hosts)
        return []
    for ext in ("",) + EXTENSIONS:
        path = vars_dir / (name + ext)
        if path.is_dir():
            return _dir_files(path)
        if path.exists():
            return [path]
    return []


class VarsDirs:
    """The vars directories of the inventory's sources; each file is read and checked once."""

    def __init__(self, sources: list[Path]):
        self.bases = list(dict.fromkeys(p if p.is_dir() else p.parent for p in sources))
        self._read: dict[Path, dict[str, Any]] = {}
        self.warnings: list[str] = []

    def vars_of(self, kind: str, names: list[str]) -> dict[str, Any]:
        """The merged variables of the vars files for ``names`` (groups from weakest to strongest,
        or one host), source by source, as Ansible's VariableManager merges them."""
        merged: dict[str, Any] = {}
        for base in self.bases:
            vars_dir = base / kind
            if not vars_dir.is_dir():
                continue
            for name in names:
                for file in files_for(vars_dir, name):
                    merged.update(self._variables(file))
        return merged

    def files(self) -> list[Path]:
        """Every vars file read so far."""
        return list(self._read)

    def _variables(self, file: Path) -> dict[str, Any]:
        if file not in self._read:
            doc = read_yaml(file)
            if doc is None or doc == "":  # Ansible skips empty files
                doc = {}
            elif not is_mapping(doc):
                raise InventoryError(f"{file}:1",
                                     "a vars file is a mapping of variable names to values")
            for key, value in doc.items():
                where = f"{file}:{doc.line_of(key)}"
                if warning := check_variable(key, value, where):
                    self.warnings.append(f"{where}: {warning}")
            self._read[file] = dict(doc)
        return self._read[file]
