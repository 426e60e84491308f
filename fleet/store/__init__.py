"""The central report store: a directory people can read, and a SQLite catalog over it.

Layout: ``ROOT/<site>/<YYYY-MM-DD>/<run-id>/<host>/<report>`` and one
``manifest.json`` per run (request, plans, node states, tool versions, tenants
seen, flags given up, every report with its sha256, what is missing and why).
The manifests are the truth (read and written through :mod:`fleet.store.manifest`);
the catalog (``ROOT/catalog.sqlite``) is an index that ``fleet reports reindex``
rebuilds from them. The catalog carries its version (``PRAGMA user_version``):
one an older fleet wrote is rebuilt from the manifests when first opened, and
one a newer fleet wrote is refused.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from .. import safenames
from .manifest import ManifestError, RunManifest

DEFAULT_ROOT = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share") / "fleet" / "store"

# PRAGMA user_version of the catalog. 0: written before the catalog had a version (its
# rows may include the kernels and metrics of removed runs); it is rebuilt from the manifests.
CATALOG_VERSION = 1

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
    gpu TEXT, driver TEXT, tool_version TEXT, started TEXT,
    PRIMARY KEY (run_id, host, path))""",
]
TABLES = ("runs", "reports", "kernels", "metrics")


class CatalogError(Exception):
    """A catalog this fleet cannot use (written by a newer one), or a manifest in the store it cannot read."""


class StoreWriteError(OSError):
    """The store could not be written (full, read-only); the message names the run and where its reports are."""


def root(explicit: str | os.PathLike | None = None) -> Path:
    return Path(explicit or os.environ.get("FLEET_STORE") or DEFAULT_ROOT)


def run_dir(store: Path, site: str, run_id: str) -> Path:
    """``<site>/<YYYY-MM-DD>/<run-id>``: the day comes from the run id (YYYYMMDD-HHMMSS-xxxx).
    A site or run id that is not one path component is :class:`safenames.UnsafeName`."""
    safenames.check_component(site, "the site")
    safenames.check_component(run_id, "the run id")
    day = f"{run_id[0:4]}-{run_id[4:6]}-{run_id[6:8]}"  # slices of a safe component, joined by '-': one too
    return store / site / day / run_id


def check_run_id(run_id: str) -> str:
    """A run id as a user typed it: exact, one path component, never a pattern (the rule has
    no '*', '?' or '['), else a LookupError that says so."""
    if not safenames.is_component(run_id):
        raise LookupError(f"{safenames.component_problem(run_id, 'the run id')} (run ids are exact, never patterns)")
    return run_id


def write_manifest(directory: Path, manifest: RunManifest) -> Path:
    """Atomically, so a reader never sees half a manifest: the one before stays whole when the
    write fails (a full store), and the half-written copy goes."""
    path = directory / "manifest.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with open(tmp, "w") as f:
            f.write(json.dumps(manifest.to_json(), indent=1, default=str))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        kept = "its reports so far, and its last manifest, are" if path.exists() else "its reports (if any) are"
        raise StoreWriteError(f"could not write the manifest of run {manifest.run_id} ({e.strerror or e}); "
                              f"{kept} in {directory}") from None
    return path


def read_manifest(path: Path) -> RunManifest:
    """A run's manifest, each stored file's path as it is now (``here``): every reader of the
    store (catalog, stats, open, pull, nightly) reads the files where they are."""
    try:
        m = RunManifest.from_json(json.loads(path.read_text()))
    except (ManifestError, json.JSONDecodeError) as e:
        raise CatalogError(f"{path}: {e}") from None
    entries = [rep for h in m.hosts for rep in h.reports] + ([m.slurm.log] if m.slurm and m.slurm.log else [])
    for rep in entries:
        rep.stored = here(path, rep.stored) or ""
    return m


def save(store: Path, manifest: RunManifest) -> Path:
    """Write a run's manifest into its folder and catalogue it; the folder back."""
    directory = run_dir(store, manifest.site, manifest.run_id)
    path = write_manifest(directory, manifest)
    try:
        record(store, path)
    except (OSError, sqlite3.Error) as e:  # the manifest is the truth: `fleet reports reindex` catches up
        raise StoreWriteError(f"run {manifest.run_id} is saved in {directory}, but the catalog could not be "
                              f"updated ({e}); run `fleet reports reindex` once there is room") from None
    return directory


def load_run(store: Path, run_id: str) -> RunManifest:
    return read_manifest(manifest_of(store, run_id))


def catalog(store: Path) -> sqlite3.Connection:
    """The catalog, created or brought to this fleet's version; a newer one is refused."""
    store.mkdir(parents=True, exist_ok=True)
    db = sqlite3.connect(store / "catalog.sqlite")
    try:
        version = _version(db)
        if version > CATALOG_VERSION:
            raise CatalogError(f"{store / 'catalog.sqlite'} is version {version}, newer than this fleet's "
                               f"({CATALOG_VERSION}): upgrade fleet, or remove it to have it rebuilt from the "
                               f"manifests")
        if version < CATALOG_VERSION:
            db.execute("BEGIN IMMEDIATE")  # one process migrates; the others wait, then find it done
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
    """From an unversioned catalog (or none): the tables, then every row again from the
    manifests, which are the truth; rows of runs removed before are gone with them."""
    for statement in SCHEMA:
        db.execute(statement)
    _rebuild(db, store)
    db.execute(f"PRAGMA user_version = {CATALOG_VERSION}")


def _rebuild(db: sqlite3.Connection, store: Path) -> tuple[int, list[str]]:
    """Every row again from the manifests; one that cannot be read (cut short, from a newer
    fleet) is left out and named, and keeps no other run out of the catalog."""
    indexed, skipped = 0, []
    for table in TABLES:
        db.execute(f"DELETE FROM {table}")
    for path in sorted(store.glob("*/*/*/manifest.json")):
        try:
            index_manifest(db, path)
            indexed += 1
        except CatalogError as e:
            skipped.append(str(e))
    return indexed, skipped


def _forget(db: sqlite3.Connection, run_id: str) -> None:
    for table in TABLES:
        db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))


def here(manifest_path: Path, stored: str | None) -> str | None:
    """A stored file's path as the store is now: below its run's folder (the manifest's), where
    fleet put it. A manifest records the absolute path the file had, so a store copied, moved or
    mounted elsewhere since finds it again at the same place below the run's folder. None for a
    path that does not lead there (``..``, or a link out of the run's folder)."""
    if not stored:
        return stored
    run = manifest_path.parent
    parts = Path(stored).parts
    if run.name not in parts:
        return None
    below = parts[len(parts) - parts[::-1].index(run.name):]
    path = run.joinpath(*below)
    if not below or ".." in below or (path.exists() and not path.resolve().is_relative_to(run.resolve())):
        return None
    return str(path)


def index_manifest(db: sqlite3.Connection, path: Path) -> None:
    """Put one run's manifest into the catalog (replacing what was there for that run)."""
    m = read_manifest(path)
    _forget(db, m.run_id)
    tool = m.request.get("tool")
    pb = m.playbook or {}
    db.executemany("INSERT INTO metrics VALUES (?,?,?,?,?,?,?)",
                   [(m.run_id, pb.get("name"), r["metric"], r["device"], r["value"], json.dumps(r["flags"]),
                     m.started) for r in pb.get("metrics") or []])
    db.execute("INSERT OR REPLACE INTO runs VALUES (?,?,?,?,?,?,?,?,?)",
               (m.run_id, m.site, m.day, m.started, m.user, tool, json.dumps(m.request.get("command")), m.status,
                str(path)))
    for host in m.hosts:
        for rep in host.reports:
            if rep.summary == "cuda_gpu_kern_sum" and rep.verified:
                db.executemany("INSERT INTO kernels VALUES (?,?,?,?,?)",
                               [(m.run_id, host.host, *k) for k in kernel_rows(Path(rep.stored))])
            db.execute("INSERT OR REPLACE INTO reports VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (m.run_id, host.host, rep.stored or rep.remote, tool, rep.status, rep.sha256, rep.size,
                        host.gpu, host.driver, host.tool_version, m.started))
        if not host.reports:
            status = ("running" if m.status in ("running", "submitted") else
                      "refused" if host.status == "refused" else "missing")
            placeholder = "" if host.rank is None else f"(rank {host.rank})"  # Slurm: one row a rank
            db.execute("INSERT OR REPLACE INTO reports VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (m.run_id, host.host, placeholder, tool, status, None, None,
                        host.gpu, host.driver, host.tool_version, m.started))


def record(store: Path, manifest_path: Path) -> None:
    with closing(catalog(store)) as db, db:
        index_manifest(db, manifest_path)


def reindex(store: Path) -> tuple[int, list[str]]:
    """Rebuild the catalog from every manifest under the store: the runs catalogued, and why
    each manifest left out was."""
    with closing(catalog(store)) as db, db:
        return _rebuild(db, store)


def reports(store: Path, *, host: str | None = None, since: str | None = None, tool: str | None = None,
            status: str | None = None) -> list[dict]:
    where, args = [], []
    for column, value in (("host", host), ("tool", tool), ("status", status)):
        if value:
            where.append(f"{column} = ?")
            args.append(value)
    if since:
        where.append("started >= ?")
        args.append(since)
    sql = "SELECT * FROM reports" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY started, host, path"
    if not (store / "catalog.sqlite").exists():  # a store with no catalog yet: nothing to read, nothing made
        return []
    with closing(catalog(store)) as db:
        db.row_factory = sqlite3.Row
        return [dict(r) for r in db.execute(sql, args)]


def metric_history(store: Path, playbook: str, since: str | None = None) -> list[dict]:
    """Every catalogued value of a playbook's metrics, oldest first."""
    if not (store / "catalog.sqlite").exists():
        return []
    with closing(catalog(store)) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT * FROM metrics WHERE playbook = ? AND started >= ? ORDER BY started, run_id",
                          (playbook, since or "")).fetchall()
    return [dict(r, flags=json.loads(r["flags"])) for r in rows]


def manifest_of(store: Path, run_id: str) -> Path:
    """The manifest of run ``run_id`` (exactly that id), found through the catalog (or, failing
    that, on disk); a LookupError for an id that is not one, or names no run in this store."""
    check_run_id(run_id)
    row = None
    if (store / "catalog.sqlite").exists():
        with closing(catalog(store)) as db:
            row = db.execute("SELECT manifest FROM runs WHERE run_id = ?", (run_id,)).fetchone()
    # A catalog row is only a hint: the manifest must be in this store, in a folder named by the id.
    # (The id was checked: it holds no glob character, so the pattern below matches it exactly.)
    candidates = ([Path(row[0])] if row else []) + sorted(store.glob(f"*/*/{run_id}/manifest.json"))
    for path in candidates:
        if path.parent.name == run_id and _inside(store, path) and path.is_file():
            return path
    raise LookupError(f"no run {run_id!r} in {store}")


def _inside(store: Path, path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(store.resolve())
    except OSError:
        return False


@dataclass
class Removal:
    """What ``remove_run`` removed (or, for a dry run, would remove)."""
    run_id: str
    directory: Path
    files: int
    catalog_rows: int


def remove_run(store: Path, run_id: str, *, dry_run: bool = False) -> Removal:
    """Delete run ``run_id``'s folder and every catalog row of it, together: the rows go in a
    transaction committed only once the folder is gone, so a folder that cannot be removed keeps
    its rows (CatalogError says so)."""
    directory = manifest_of(store, run_id).parent
    files = sum(1 for p in directory.rglob("*") if not p.is_dir())
    with closing(catalog(store)) as db:
        rows = sum(db.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?", (run_id,)).fetchone()[0]
                   for table in TABLES)
        if dry_run:
            return Removal(run_id, directory, files, rows)
        try:
            with db:
                _forget(db, run_id)  # its kernels and metrics too: compare and the nightly trends forget it
                shutil.rmtree(directory)
        except OSError as e:
            raise CatalogError(f"could not remove run {run_id} ({directory}): {e.strerror or e}; "
                               f"its catalog rows are kept (`fleet reports reindex` matches them to what is left)") \
                from None
    return Removal(run_id, directory, files, rows)


@dataclass
class Pulled:
    """One report of ``pull``: where its copy went (None: not copied), and what went wrong.
    ``missing``: the run never brought it home (said, and fails nothing)."""
    host: str
    name: str
    target: Path | None
    problem: str | None = None
    missing: bool = False


def pull(store: Path, run_id: str, dest: Path) -> list[Pulled]:
    """Copy run ``run_id``'s reports out of the store into ``dest/HOST/``, each checked against
    its sha256. A host or file name in the manifest that is not one path component is not copied
    (it would land outside ``dest``)."""
    from .collect import sha256_of

    done = []
    for h in load_run(store, run_id).hosts:
        for r in h.reports:
            if r.status == "missing":
                continue
            name = Path(r.stored).name
            if not r.verified:  # a summary that did not come home: the run's reports are still whole
                done.append(Pulled(h.host, name, None, f"{name} is not in the store ({r.error})", missing=True))
                continue
            problem = (safenames.component_problem(h.host, "the host name")
                       or safenames.component_problem(name, "the report's file name"))
            if problem:
                done.append(Pulled(h.host, name, None, f"{name!r} not copied: {problem}"))
                continue
            target = dest / h.host / name
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(r.stored, target)
            except OSError as e:
                done.append(Pulled(h.host, name, None, f"{name} could not be copied: {e.strerror or e}"))
                continue
            ok = sha256_of(target) == r.sha256
            done.append(Pulled(h.host, name, target, None if ok else "SHA256 MISMATCH: the stored copy is damaged"))
    return done


def kernel_rows(csv_path: Path) -> list[tuple[str, int, int]]:
    """(name, total ns, instances) from an ``nsys stats`` cuda_gpu_kern_sum CSV."""
    import csv

    try:
        with open(csv_path, newline="") as f:
            return [(r["Name"], int(float(r["Total Time (ns)"])), int(float(r["Instances"])))
                    for r in csv.DictReader(f) if r.get("Name")]
    except (OSError, KeyError, ValueError):
        return []


def compare(store: Path, a: str, b: str) -> list[dict]:
    """Kernels of runs A and B (summed over hosts), those whose total time changed most first."""
    with closing(catalog(store)) as db:
        totals: dict[str, dict[str, int]] = {}
        for run in (a, b):
            for name, total in db.execute("SELECT name, SUM(total_ns) FROM kernels WHERE run_id = ? GROUP BY name",
                                          (run,)):
                totals.setdefault(name, {})[run] = total
    rows = [{"kernel": name, "a_ns": t.get(a, 0), "b_ns": t.get(b, 0), "change_ns": t.get(b, 0) - t.get(a, 0),
             "change": (t.get(b, 0) - t.get(a, 0)) / t[a] if t.get(a) else None} for name, t in totals.items()]
    return sorted(rows, key=lambda r: -abs(r["change_ns"]))
