"""What goes wrong with the store, as the command line says it: each a one-line message."""

from __future__ import annotations

from .. import exitcodes
from ..errors import FleetError


class CatalogError(FleetError):
    """A catalog this fleet cannot use (written by a newer one, damaged, locked), or a manifest in
    the store it cannot read."""


class CatalogDamaged(CatalogError):
    """The catalog's file is not a database SQLite can read; ``fleet reports
    reindex`` makes a new one."""


class CatalogLocked(CatalogError):
    """Another process held the catalog past the wait (a long transaction, a stuck writer)."""


class UnsafeStore(CatalogError):
    """A store folder or file fleet will not use: another account could swap or read it. The
    message names it and why; nothing was written."""


class StoreWriteError(FleetError, OSError):
    """The store could not be written (full, read-only); the message names the run and
    where its reports are."""

    exit_status = exitcodes.FAILED

    def __str__(self):
        return self.args[0] if self.args else super().__str__()
