"""A run's manifest on disk: written whole into its checked folder, read back checked.

The classes are :mod:`fleet.store.manifest`'s; this module is where the store reads and writes
them. A manifest is a file anyone with the user's account can edit, and a node or job fills many
of its fields: one read back is checked against the types its classes declare (a number where a
name belongs, a size of ``1e400``) and, when it fails, is a :class:`CatalogError` naming the file
and the field, so that one bad manifest leaves every other run readable.
"""

from __future__ import annotations

import json
from dataclasses import fields, is_dataclass
from pathlib import Path

from .. import statuses
from . import numbers, private
from .errors import CatalogError, StoreWriteError, UnsafeStore
from .layout import MANIFEST, here
from .manifest import ManifestError, RunManifest

# The declared types of the manifest's fields, as its classes spell them (str | None, list[str]).
_TYPES = {"str": (str,), "int": (int,), "bool": (bool,), "dict": (dict,), "list": (list,),
          "float": (int, float)}


def write_manifest(directory: Path, manifest: RunManifest, store: Path | None = None) -> Path:
    """Atomically, so a reader never sees half a manifest: the one before stays whole when the
    write fails (a full store), and the half-written copy goes. The folders from ``store`` (by
    default the one three levels up, as the layout has it) down to ``directory`` are checked
    to be the user's, 0700, first (UnsafeStore)."""
    path = directory / MANIFEST
    private.check_folder(directory, store or directory.parent.parent.parent)
    try:
        private.write_file(path, json.dumps(manifest.to_json(), indent=1, default=str))
    except OSError as e:
        kept = ("its reports so far, and its last manifest, are"
                if path.exists() else "its reports (if any) are")
        raise StoreWriteError(f"could not write the manifest of run {manifest.run_id} "
                              f"({e.strerror or e}); {kept} in {directory}") from None
    return path


def read_manifest(path: Path) -> RunManifest:
    """A run's manifest, each stored file's path as it is now (``here``): every reader of the
    store (catalog, stats, open, pull, nightly) reads the files where they are. One that cannot
    be read, or whose fields are not of their types, is a CatalogError naming it."""
    try:
        m, problem = _checked(json.loads(private.read_text(path)), path)
    except UnsafeStore:
        raise
    except (ManifestError, ValueError, TypeError, AttributeError, RecursionError) as e:
        problem = str(e) or type(e).__name__
    except OSError as e:
        problem = e.strerror or str(e)
    if problem:
        raise CatalogError(f"{path}: {problem}") from None
    return m


def _checked(doc: object, path: Path) -> tuple[RunManifest | None, str | None]:
    """(the run the manifest ``doc`` at ``path`` holds, each stored file's path as it is now; None)
    or (None, the first problem found in it)."""
    problem = _container_problem(doc)
    if problem:
        return None, problem
    m = RunManifest.from_json(doc)
    problem = shape_problem(m) or _request_problem(m.request) or _folder_problem(m, path)
    if problem:
        return None, problem
    for rep in _stored_files(m):
        rep.stored = here(path, rep.stored) or ""
    return m, None


def _stored_files(m: RunManifest) -> list:
    """The files the run's manifest names in the store: each host's reports, and the Slurm log."""
    return [rep for h in m.hosts for rep in h.reports] + ([m.slurm.log] if m.slurm and m.slurm.log
                                                          else [])


# A run whose job may still be in Slurm's hands: `fleet jobs` and `fleet gather` look for these.
UNFINISHED = statuses.UNFINISHED


def may_be_unfinished(path: Path) -> bool:
    """Whether the manifest at ``path`` may be of a run not finished (its job perhaps still in
    Slurm's hands), from its status alone, without building the run: a store of hundreds of
    finished runs is looked through in milliseconds, not a second. A file that cannot be read as a
    JSON object, or whose status is not text, may be: :func:`read_manifest` then says why."""
    try:
        doc = json.loads(private.read_text(path))
    except UnsafeStore:
        raise
    except (OSError, ValueError, RecursionError):
        return True
    status = doc.get("status") if isinstance(doc, dict) else None
    return not isinstance(status, str) or status in UNFINISHED


def shape_problem(record: object, where: str = "") -> str | None:
    """The first field of a manifest (or a record in it) that is not of its declared type, or
    whose number is out of bounds, said as ``hosts[2].reports[0].size is '12'``; None if all are."""
    for f in fields(record):
        value, name = getattr(record, f.name), f"{where}{f.name}"
        if is_dataclass(value):
            problem = shape_problem(value, f"{name}.")
        elif isinstance(value, list) and value and is_dataclass(value[0]):
            problem = next(filter(None, (shape_problem(v, f"{name}[{i}].") if is_dataclass(v) else
                                         f"{name}[{i}] is not a record"
                                         for i, v in enumerate(value))), None)
        else:
            problem = _type_problem(value, str(f.type), name)
        if problem:
            return problem
    return None


def _container_problem(doc: object) -> str | None:
    """The lists and objects the manifest's classes walk through, checked before they do (a host
    list that is a number would be a TypeError there, naming no field)."""
    if not isinstance(doc, dict):
        return None  # from_json says so
    for key, kind in (("hosts", list), ("request", dict), ("slurm", dict), ("playbook", dict)):
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            return f"{key} is {doc[key]!r:.60}, not {'a list' if kind is list else 'an object'}"
    for i, host in enumerate(doc.get("hosts") or []):
        for key in ("reports", "processes_seen", "tenants_seen", "given_up"):
            if isinstance(host, dict) and host.get(key) is not None and not isinstance(host[key],
                                                                                       list):
                return f"hosts[{i}].{key} is {host[key]!r:.60}, not a list"
    return None


def _folder_problem(m: RunManifest, path: Path) -> str | None:
    """A manifest speaks for the run whose folder it is in: its run id is that folder's name (one
    copied or edited into another run's folder would have the catalog file it under another id)."""
    if m.run_id != path.parent.name:
        return f"its run_id {m.run_id!r:.60} is not the name of its folder ({path.parent.name})"
    return None


def _request_problem(request: dict) -> str | None:
    """The request's fields the store shows: its tool (a name) and command (a list of words)."""
    tool, command = request.get("tool"), request.get("command")
    if tool is not None and not isinstance(tool, str):
        return f"request.tool is {tool!r:.60}, not a name"
    if command is not None and not (isinstance(command, list)
                                    and all(isinstance(w, str) for w in command)):
        return f"request.command is {command!r:.60}, not a list of words"
    return None


def _type_problem(value: object, declared: str, name: str) -> str | None:
    """Why ``value`` of the field ``name`` is of none of the types ``declared`` (``int | None``)
    or out of its type's bounds, or None."""
    for option in (o.strip() for o in declared.split("|")):
        if option == "None":
            if value is None:
                return None
            continue
        base, _, inner = option.partition("[")
        if base not in _TYPES:
            return None  # a type the manifest's classes build themselves (a record): checked above
        if not isinstance(value, _TYPES[base]) or (base in ("int", "float")
                                                   and isinstance(value, bool)):
            continue
        return _bounds_problem(value, base, inner, name)
    return f"{name} is {value!r:.60}, not {declared}"


def _bounds_problem(value, base: str, inner: str, name: str) -> str | None:
    """Why ``value``, of the type ``base`` (of ``inner``'s, for a list), is out of bounds: a
    number too large or not finite, a list of words holding something else; or None."""
    if base == "int" and abs(value) > numbers.INTEGER_MAX:
        return f"{name} is {str(value)[:40]}, out of bounds"
    if base == "float":
        try:
            numbers.real(value, name)
        except ValueError as e:
            return str(e)
    if inner.startswith("str") and not all(isinstance(v, str) for v in value):
        return f"{name} holds something other than text"
    return None
