"""Runs out of the store: ``fleet reports rm`` (a run's folder and its catalog rows, together)
and ``fleet reports pull`` (copies of its reports, checked against their sha256)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .. import safenames
from . import private
from .catalog import TABLES, forget, opened
from .errors import CatalogError
from .manifest_io import UNFINISHED as STILL_RUNNING
from .manifest_io import read_manifest
from .queries import load_run, manifest_of


class StillRunning(CatalogError):
    """``fleet reports rm`` of a run whose manifest says it has not ended: its fleet would write it
    back when it saves the run next (the run would come back whole after "removed")."""


@dataclass
class Removal:
    """What ``remove_run`` removed (or, for a dry run, would remove)."""
    run_id: str
    directory: Path
    files: int
    catalog_rows: int


def remove_run(store: Path, run_id: str, *, dry_run: bool = False, force: bool = False) -> Removal:
    """Delete run ``run_id``'s folder and every catalog row of it, together: the rows go in a
    transaction committed only once the folder is gone, so a folder that cannot be removed keeps
    its rows (CatalogError says so). A run still running is refused
    (StillRunning) unless ``force``."""
    path = manifest_of(store, run_id)
    directory = path.parent
    private.check_folder(directory, store)
    if not force:
        try:
            status = read_manifest(path).status
        except CatalogError:
            # a manifest that cannot be read says nothing of a run going on: it may go
            status = None
        if status in STILL_RUNNING:
            raise StillRunning(
                f"run {run_id} is still {status} (so its manifest says): its fleet would put it "
                f"back when it next saves it. Wait for it to end (or `fleet gather {run_id}` a run "
                f"whose fleet was stopped); `--force` removes it anyway")
    files = sum(1 for p in directory.rglob("*") if not p.is_dir())
    with opened(store) as db:
        rows = sum(db.execute(f"SELECT COUNT(*) FROM {table} WHERE run_id = ?",
                              (run_id,)).fetchone()[0]
                   for table in TABLES)
        if dry_run:
            return Removal(run_id, directory, files, rows)
        try:
            with db:
                # its kernels and metrics too: compare and the nightly trends forget it
                forget(db, run_id)
                shutil.rmtree(directory)
        except OSError as e:
            raise CatalogError(f"could not remove run {run_id} ({directory}): {e.strerror or e}; "
                               "its catalog rows are kept (`fleet reports reindex` "
                               "matches them to what is left)") \
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
    (it would land outside ``dest``). The copies are private as the store's are: each ``dest/HOST``
    a folder of the user's, 0700, in folders no other account can swap; files 0600, written under
    a new name and renamed into place."""
    from ..collection.fetch import sha256_of

    done = []
    for h in load_run(store, run_id).hosts:
        for r in h.reports:
            if r.status == "missing":
                continue
            name = Path(r.stored).name
            # a summary that did not come home: the run's reports are still whole
            if not r.verified:
                done.append(Pulled(h.host, name, None, f"{name} is not in the store ({r.error})",
                                   missing=True))
                continue
            problem = (safenames.component_problem(h.host, "the host name")
                       or safenames.component_problem(name, "the report's file name"))
            if problem:
                done.append(Pulled(h.host, name, None, f"{name!r} not copied: {problem}"))
                continue
            target = dest / h.host / name
            try:
                # dest is the user's: not narrowed
                private.check_folder(target.parent, target.parent)
                private.copy_file(Path(r.stored), target)
            except (OSError, CatalogError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                done.append(Pulled(h.host, name, None, f"{name} could not be copied: {why}"))
                continue
            ok = sha256_of(target) == r.sha256
            done.append(Pulled(h.host, name, target, None if ok
                               else "SHA256 MISMATCH: the stored copy is damaged"))
    return done
