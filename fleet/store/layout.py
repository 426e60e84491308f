"""Where things are in the store: ``ROOT/<site>/<YYYY-MM-DD>/<run-id>/<host>/<report>``, one
``manifest.json`` per run folder, and ``ROOT/catalog.sqlite``. Pure path arithmetic: nothing
here reads or writes (:mod:`fleet.store.private` checks the folders)."""

from __future__ import annotations

import os
from pathlib import Path

from .. import safenames

DEFAULT_ROOT = Path(os.environ.get("XDG_DATA_HOME")
                    or Path.home() / ".local" / "share") / "fleet" / "store"
MANIFEST = "manifest.json"


def root(explicit: str | os.PathLike | None = None) -> Path:
    return Path(explicit or os.environ.get("FLEET_STORE") or DEFAULT_ROOT)


def run_dir(store: Path, site: str, run_id: str) -> Path:
    """``<site>/<YYYY-MM-DD>/<run-id>``: the day comes from the run id (YYYYMMDD-HHMMSS-xxxx).
    A site or run id that is not one path component is :class:`safenames.UnsafeName`."""
    safenames.check_component(site, "the site")
    safenames.check_component(run_id, "the run id")
    # slices of a safe component, joined by '-': one too
    day = f"{run_id[0:4]}-{run_id[4:6]}-{run_id[6:8]}"
    return store / site / day / run_id


def manifests(store: Path) -> list[Path]:
    """Every run's manifest under the store, in order."""
    return sorted(store.glob(f"*/*/*/{MANIFEST}"))


def check_run_id(run_id: str) -> str:
    """A run id as a user typed it: exact, one path component, never a pattern (the rule has
    no '*', '?' or '['), else a LookupError that says so."""
    if not safenames.is_component(run_id):
        raise LookupError(f"{safenames.component_problem(run_id, 'the run id')} (run "
                          "ids are exact, never patterns)")
    return run_id


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
    if not below or ".." in below or (path.exists()
                                      and not path.resolve().is_relative_to(run.resolve())):
        return None
    return str(path)


def _inside(store: Path, path: Path) -> bool:
    try:
        return path.resolve().is_relative_to(store.resolve())
    except OSError:
        return False
