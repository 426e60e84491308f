"""The catalog: a SQLite index over the store's manifests (``ROOT/catalog.sqlite``).

The manifests are the truth; the catalog is rebuilt from them by ``fleet reports reindex``, and
from scratch when it is damaged. It carries its version (``PRAGMA user_version``): one an older
fleet wrote is rebuilt from the manifests when first opened, and one a newer fleet wrote is
refused. Every failure of SQLite (a damaged file, a lock held past the timeout) is one
:class:`CatalogError` line that says what to do, never a traceback.
"""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Iterator

from ..statuses import HostStatus
from . import private
from .summary_csv import checked_kernel_rows
from .errors import CatalogDamaged, CatalogError, CatalogLocked
from .layout import manifests
from .manifest import WHOSE
from .manifest_io import UNFINISHED, read_manifest

# PRAGMA user_version of the catalog. 0: written before the catalog had a version (its
# rows may include the kernels and metrics of removed runs); it is rebuilt from the manifests.
# 1: unversioned rows again from the manifests. 2: each report row names its Ray worker
# (``worker``), and a Ray worker's whose file is no row of its own.
CATALOG_VERSION = 2
# how long one waits for another fleet's transaction (SQLite's default; 8 clients on one store hold)
LOCK_WAIT_S = 5.0

SCHEMA = [
    """CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, site TEXT, day TEXT, started TEXT, user TEXT, tool TEXT,
    command TEXT, status TEXT, manifest TEXT)""",
    """CREATE TABLE IF NOT EXISTS kernels (
    run_id TEXT, host TEXT, name TEXT, total_ns INTEGER, instances INTEGER)""",
    """CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT, playbook TEXT, metric TEXT, device TEXT, value REAL, flags TEXT, started TEXT)""",
    """CREATE TABLE IF NOT EXISTS reports (
    run_id TEXT, host TEXT, path TEXT, tool TEXT, status TEXT, sha256 TEXT, size INTEGER,
    gpu TEXT, driver TEXT, tool_version TEXT, started TEXT, worker TEXT,
    PRIMARY KEY (run_id, host, path))""",
]
TABLES = ("runs", "reports", "kernels", "metrics")


def sqlite_problem(path: Path, e: sqlite3.Error) -> CatalogError:
    """What a failure of SQLite on the catalog means to its user, in one line."""
    text = str(e)
    if "locked" in text or "busy" in text:
        return CatalogLocked(f"the catalog {path} is locked by another process ({text}); try again "
                             "once it is done, then `fleet reports reindex` if a run is missing "
                             "from it")
    if (not isinstance(e, sqlite3.OperationalError) and isinstance(e, sqlite3.DatabaseError)
            or "malformed" in text):
        return CatalogDamaged(f"the catalog {path} is damaged ({text}); `fleet reports reindex` "
                              f"rebuilds it from the manifests")
    return CatalogError(f"the catalog {path} could not be used ({text})")


@contextmanager
def opened(store: Path) -> Iterator[sqlite3.Connection]:
    """The catalog, open; any failure of SQLite inside is a CatalogError line (see
    sqlite_problem)."""
    path = store / private.CATALOG_NAME
    try:
        with closing(catalog(store)) as db:
            yield db
    except sqlite3.Error as e:
        raise sqlite_problem(path, e) from None


def catalog(store: Path) -> sqlite3.Connection:
    """The catalog, created or brought to this fleet's version; a newer one is refused. The store's
    folder and the catalog's file are checked first (:func:`private.catalog_file`)."""
    db = sqlite3.connect(private.catalog_file(store), timeout=LOCK_WAIT_S)
    try:
        version = _version(db)
        if version > CATALOG_VERSION:
            raise CatalogError(f"{store / private.CATALOG_NAME} is version {version}, newer than "
                               f"this fleet's ({CATALOG_VERSION}): upgrade fleet, or remove it to "
                               f"have it rebuilt from the manifests")
        if version < CATALOG_VERSION:
            # one process migrates; the others wait, then find it done
            db.execute("BEGIN IMMEDIATE")
            if _version(db) < CATALOG_VERSION:
                _migrate(db, store)
            db.commit()
    except BaseException:
        db.close()
        raise
    return db


def _version(db: sqlite3.Connection) -> int:
    return db.execute("PRAGMA user_version").fetchone()[0]


def _migrate(db: sqlite3.Connection, store: Path) -> None:
    """From an older catalog (or none): the tables made anew in this version's shape, then every
    row again from the manifests, which are the truth; rows of runs removed before are gone with
    them."""
    for table in TABLES:
        db.execute(f"DROP TABLE IF EXISTS {table}")
    for statement in SCHEMA:
        db.execute(statement)
    _rebuild(db, store)
    db.execute(f"PRAGMA user_version = {CATALOG_VERSION}")


def _rebuild(db: sqlite3.Connection, store: Path) -> tuple[int, list[str]]:
    """Every row again from the manifests; one that cannot be read (cut short, from a newer
    fleet, a field of the wrong type) is left out and named, and keeps no other run out of the
    catalog. Parts of a run left out (a number out of bounds) are named too."""
    indexed, skipped = 0, []
    for table in TABLES:
        db.execute(f"DELETE FROM {table}")
    for path in manifests(store):
        try:
            skipped += [f"part of {path}: {note}" for note in index_manifest(db, path)]
            indexed += 1
        except CatalogError as e:
            skipped.append(str(e))
    return indexed, skipped


def forget(db: sqlite3.Connection, run_id: str) -> None:
    for table in TABLES:
        db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))


def index_manifest(db: sqlite3.Connection, path: Path) -> list[str]:
    """Put one run's manifest into the catalog (replacing what was there for that run); what of
    it was left out (a metric or kernel row whose number is out of bounds) back, said."""
    m = read_manifest(path)
    forget(db, m.run_id)
    tool = m.asked.tool
    metrics, notes = _metric_rows(m)
    db.executemany("INSERT INTO metrics VALUES (?,?,?,?,?,?,?)", metrics)
    db.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
               (m.run_id, m.site, m.day, m.started, m.user, tool,
                m.asked.command_json(), m.status, str(path)))
    for host in m.hosts:
        for rep in host.reports:
            # whose a Ray worker's report is: its row names the worker itself
            if rep.summary == WHOSE:
                continue
            if rep.summary == "cuda_gpu_kern_sum" and rep.verified:
                rows, bad = checked_kernel_rows(Path(rep.stored))
                # the kernels of one summary
                notes += [f"{Path(rep.stored).name}: {why}" for why in bad]
                db.executemany("INSERT INTO kernels VALUES (?,?,?,?,?)",
                               [(m.run_id, host.host, *k) for k in rows])
            db.execute("INSERT OR REPLACE INTO reports VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (m.run_id, host.host, rep.stored or rep.remote, tool, rep.status, rep.sha256,
                        rep.size, host.gpu, host.driver, host.tool_version, m.started, host.worker))
        if not host.reports:
            status = ("running" if m.status in UNFINISHED else
                      "refused" if host.status == HostStatus.REFUSED else "missing")
            # Slurm: one row a rank
            placeholder = "" if host.rank is None else f"(rank {host.rank})"
            db.execute("INSERT OR REPLACE INTO reports VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (m.run_id, host.host, placeholder, tool, status, None, None,
                        host.gpu, host.driver, host.tool_version, m.started, host.worker))
    return notes


def _metric_rows(m) -> tuple[list[tuple], list[str]]:
    """The playbook's metrics of run ``m`` as rows; one not of its shape, or whose value is out
    of bounds (a summary's ``1e400``), is left out and said."""
    kept = m.playbook_run
    rows = [(m.run_id, kept.name, r.metric, r.device, r.value, json.dumps(list(r.flags)), m.started)
            for r in kept.metrics]
    return rows, list(kept.refused)


def record(store: Path, manifest_path: Path) -> None:
    with opened(store) as db, db:
        index_manifest(db, manifest_path)


def reindex(store: Path) -> tuple[int, list[str]]:
    """Rebuild the catalog from every manifest under the store: the runs catalogued, and why
    each manifest (or part of one) left out was. A damaged catalog is replaced by a new one."""
    try:
        with opened(store) as db, db:
            return _rebuild(db, store)
    except CatalogDamaged as e:
        return _rebuild_afresh(store, str(e))


def _rebuild_afresh(store: Path, why: str) -> tuple[int, list[str]]:
    """A new catalog built beside the damaged one, then renamed over it (with the damaged one's
    journal gone: SQLite would replay it into the new file)."""
    path = store / private.CATALOG_NAME
    fresh = path.with_name(f"{path.name}.{os.getpid()}.new")
    fresh.unlink(missing_ok=True)
    try:
        with closing(sqlite3.connect(private.new_file(fresh))) as db, db:
            for statement in SCHEMA:
                db.execute(statement)
            found = _rebuild(db, store)
            db.execute(f"PRAGMA user_version = {CATALOG_VERSION}")
        for leftover in ("-journal", "-wal", "-shm"):
            path.with_name(path.name + leftover).unlink(missing_ok=True)
        private.rename_into_place(fresh, path)
    except sqlite3.Error as e:
        raise sqlite_problem(fresh, e) from None
    finally:
        fresh.unlink(missing_ok=True)
    damage = why.split(" (", 1)[-1].split(")", 1)[0]
    return (found[0],
            [f"the damaged catalog {path} ({damage}): a new one was built from the manifests",
             *found[1]])
