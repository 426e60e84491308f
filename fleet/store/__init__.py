"""The central report store: a directory people can read, and a SQLite catalog over it.

Layout: ``ROOT/<site>/<YYYY-MM-DD>/<run-id>/<host>/<report>`` and one
``manifest.json`` per run (request, plans, node states, tool versions, tenants
seen, flags given up, every report with its sha256, what is missing and why).
The manifests are the truth (their classes in :mod:`fleet.store.manifest`, read
and written by :mod:`fleet.store.manifest_io`); the catalog (``ROOT/catalog.sqlite``,
:mod:`fleet.store.catalog`) is an index that ``fleet reports reindex`` rebuilds from them.

The store is the user's and checked every time (:mod:`fleet.store.private`): folders 0700,
files 0600, written under new names and renamed into place; a store another account could
swap or read is refused, naming the folder.

One concern a module, each importing only those before it:
``errors``, ``numbers``, ``layout``, ``private`` -> ``manifest_io`` -> ``catalog`` ->
``queries`` -> ``removal``; ``stats`` and ``viewer`` read what these keep. Bringing reports
home into it is collection's (:mod:`fleet.collection`). Every name below is importable from
``fleet.store``.
"""

from __future__ import annotations

from .catalog import CATALOG_VERSION, SCHEMA, TABLES, catalog, index_manifest, record, reindex
from .catalog import forget as _forget
from .errors import CatalogDamaged, CatalogError, CatalogLocked, StoreWriteError, UnsafeStore
from .layout import DEFAULT_ROOT, _inside, check_run_id, here, root, run_dir
from .manifest_io import UNFINISHED, may_be_unfinished, read_manifest, write_manifest
from .queries import compare, load_run, manifest_of, metric_history, reports, save
from .removal import Pulled, Removal, StillRunning, pull, remove_run
from .summary_csv import kernel_rows

__all__ = ["CATALOG_VERSION", "SCHEMA", "TABLES", "CatalogDamaged", "CatalogError", "CatalogLocked",
           "DEFAULT_ROOT", "Pulled", "Removal",
           "StillRunning", "StoreWriteError", "UNFINISHED", "UnsafeStore", "catalog",
           "check_run_id", "compare", "here",
           "index_manifest", "kernel_rows", "load_run", "manifest_of", "may_be_unfinished",
           "metric_history", "pull",
           "read_manifest", "record", "reindex", "remove_run", "reports", "root", "run_dir", "save",
           "write_manifest"]
