"""A SQLite file fleet did not write (an nsys export), opened as hostile input: the one home of the
rules both the node's summaries (:mod:`summaries`) and the controller's reader
(:mod:`fleet.analysis.untrusted_sqlite`) hold it to.

Runs ON THE NODE too (standard library, Python 3.8). On Slurm the job owns its run folder, so the
workload can put a file of its own where nsys wrote the export: its schema is an attacker's.

- Opened read-only (``mode=ro``; ``immutable=1`` where nothing can change it under the reader),
  the schema untrusted (``trusted_schema=OFF``: no function with side effects in a view or a
  trigger) and no write at all (``query_only``).
- A table read must be a stored table: a view (an endless recursive query), a virtual table, a
  generated column or a trigger among the tables read is refused, so every row read is a row
  stored in the file and every query over it ends.
- Every query of one file shares one deadline (the progress handler): past it, SQLite interrupts.
"""

from __future__ import annotations

import os
import sqlite3
import time
import urllib.parse

STEPS_BETWEEN_CHECKS = 20000  # SQLite virtual machine steps between two looks at the clock


class NotPlainTable(ValueError):
    """A table fleet reads is not a stored table; the message is one line without the file's name."""


def uri(path, immutable=False):
    """The read-only URI of ``path`` (its characters quoted: a '?' or '#' in a folder's name is
    no URI parameter)."""
    return "file:%s?mode=ro%s" % (urllib.parse.quote(os.path.abspath(str(path))), "&immutable=1" if immutable else "")


def untrusted(db):
    """``db`` made to distrust its schema and to write nothing."""
    for pragma in ("trusted_schema = OFF", "query_only = ON"):
        db.execute("PRAGMA " + pragma)  # an older SQLite ignores a pragma it does not know
    return db


def deadline(db, at):
    """Every query of ``db`` interrupted once ``time.monotonic()`` passes ``at``."""
    db.set_progress_handler(lambda: time.monotonic() > at, STEPS_BETWEEN_CHECKS)


def interrupted(error):
    """Whether a SQLite error is the deadline's interruption."""
    return isinstance(error, sqlite3.OperationalError) and "interrupt" in str(error)


def plain_tables(db, tables):
    """Which of ``tables`` the file has, each checked to be a stored table: a view, a virtual
    table, a generated column or a trigger on one of them raises :class:`NotPlainTable`."""
    found = set()
    for kind, name, on, sql in db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
        if kind == "trigger" and on in tables:
            raise NotPlainTable("a trigger on %s (%s): an export has none; refused" % (on, name))
        if name not in tables:
            continue
        if kind == "view":
            raise NotPlainTable("%s is a view, not a table: an export's tables are stored rows; refused" % name)
        if kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise NotPlainTable("%s is a virtual table: an export's tables are stored rows; refused" % name)
        if kind == "table":
            found.add(name)
    for name in sorted(found):
        generated = [row[1] for row in db.execute("PRAGMA table_xinfo('%s')" % name) if row[6] in (2, 3)]
        if generated:
            raise NotPlainTable("%s.%s is a generated column: an export stores its values; refused"
                                % (name, generated[0]))
    return found
