"""Runs into the store and out of it: saving a run (its manifest, then its catalog rows), finding
one by its id, and the catalog's lists (reports, a playbook's metric history, two runs' kernels)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from . import private
from .catalog import catalog, index_manifest, opened, sqlite_problem
from .errors import CatalogDamaged, CatalogError, CatalogLocked, StoreWriteError
from .layout import MANIFEST, _inside, check_run_id, run_dir
from .manifest import RunManifest
from .manifest_io import read_manifest, write_manifest


def save(store: Path, manifest: RunManifest) -> Path:
    """Write a run's manifest into its folder and catalogue it; the folder back. The store and its
    catalog are checked first: a store fleet will not use (UnsafeStore), or a catalog damaged or
    locked (StoreWriteError), stops it before anything is written."""
    directory = run_dir(store, manifest.site, manifest.run_id)
    db, problem = _catalog_to_save_in(store, manifest.run_id)
    try:
        path = write_manifest(directory, manifest, store)
        try:
            if problem is not None:
                raise problem
            with db:
                index_manifest(db, path)
        # the manifest is the truth: `reindex` catches up
        except (sqlite3.Error, CatalogError) as e:
            raise StoreWriteError(f"run {manifest.run_id} is saved in {directory}, but the catalog "
                                  f"could not be updated ({e}); run `fleet reports reindex` once "
                                  + ("there is room"
                                     if "full" in str(e) else "that is put right")) from None
    finally:
        if db is not None:
            db.close()
    return directory


def _catalog_to_save_in(store: Path, run_id: str) -> tuple[sqlite3.Connection | None,
                                                           CatalogError | None]:
    """The catalog, open; or why not, when the manifest may still be written (a full disk: its
    write then says so). A damaged or locked catalog stops the save before anything is written."""
    try:
        return catalog(store), None
    except sqlite3.Error as e:
        problem = sqlite_problem(store / private.CATALOG_NAME, e)
        if isinstance(problem, (CatalogDamaged, CatalogLocked)):
            raise StoreWriteError(f"run {run_id} could not be saved: {problem}") from None
        return None, problem


def load_run(store: Path, run_id: str) -> RunManifest:
    return read_manifest(manifest_of(store, run_id))


def _has_catalog(store: Path) -> bool:
    """Whether the store has a catalog to read (checking the store when it exists): a store with
    none yet has nothing to read, and none is made for a read."""
    if not store.exists():
        return False
    private.check_store(store)
    return (store / private.CATALOG_NAME).exists()


def reports(store: Path, *, host: str | None = None, since: str | None = None,
            tool: str | None = None, status: str | None = None) -> list[dict]:
    where, args = [], []
    for column, value in (("host", host), ("tool", tool), ("status", status)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if since:
        where.append("started >= ?")
        args.append(since)
    sql = "SELECT * FROM reports" + (" WHERE " + " AND ".join(where) if where
                                     else "") + " ORDER BY started, host, path"
    if not _has_catalog(store):
        return []
    with opened(store) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute(sql, args)]


def metric_history(store: Path, playbook: str, since: str | None = None) -> list[dict]:
    """Every catalogued value of a playbook's metrics, oldest first."""
    if not _has_catalog(store):
        return []
    with opened(store) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM metrics WHERE playbook = ? AND started "
                          ">= ? ORDER BY started, run_id",
                          (playbook, since or "")).fetchall()
    return [dict(r, flags=_flags(r["flags"])) for r in rows]


def _flags(text: str | None) -> list:
    try:
        flags = json.loads(text or "[]")
    except ValueError:
        return []
    return flags if isinstance(flags, list) else []


def manifest_of(store: Path, run_id: str) -> Path:
    """The manifest of run ``run_id`` (exactly that id), found through the catalog (or, failing
    that, on disk); a LookupError for an id that is not one, or names no run in this store."""
    check_run_id(run_id)
    row = None
    if _has_catalog(store):
        try:
            with opened(store) as db:
                row = db.execute("SELECT manifest FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        except (CatalogDamaged, CatalogLocked):
            row = None  # a damaged or locked catalog is only a hint gone: the folders still say
    # A catalog row is only a hint: the manifest must be in this store, in a folder named by the id.
    # (The id was checked: it holds no glob character, so the pattern below matches it exactly.)
    candidates = ([Path(row[0])] if row and isinstance(row[0], str) else []) + \
        sorted(store.glob(f"*/*/{run_id}/{MANIFEST}"))
    for path in candidates:
        if path.parent.name == run_id and _inside(store, path) and path.is_file():
            return path
    raise LookupError(f"no run {run_id!r} in {store}")


def compare(store: Path, a: str, b: str) -> list[dict]:
    """Kernels of runs A and B (summed over hosts), those whose total time changed most first."""
    with opened(store) as db:
        totals: dict[str, dict[str, int]] = {}
        for run in (a, b):
            for name, total in db.execute("SELECT name, SUM(total_ns) FROM kernels "
                                          "WHERE run_id = ? GROUP BY name",
                                          (run,)):
                totals.setdefault(name, {})[run] = total
    return kernel_changes(totals, a, b)


def kernel_changes(totals: dict[str, dict[str, int]], a: str, b: str) -> list[dict]:
    """Each kernel's total in run A and run B (``totals[kernel][run]``), those that changed most
    first; one rule for the embedded catalog and the team catalog."""
    rows = [{"kernel": name, "a_ns": t.get(a, 0), "b_ns": t.get(b, 0),
             "change_ns": t.get(b, 0) - t.get(a, 0),
             "change": (t.get(b, 0) - t.get(a, 0)) / t[a] if t.get(a) else None}
            for name, t in totals.items()]
    return sorted(rows, key=lambda r: -abs(r["change_ns"]))

