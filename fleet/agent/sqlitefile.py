"""A SQLite file fleet did not write (an nsys export), opened as hostile input: the one home of the
rules both the node's summaries (:mod:`summaries`) and the controller's reader
(:mod:`fleet.analysis.untrusted_sqlite`) hold it to.

Runs ON THE NODE too (standard library, Python 3.8). On Slurm the job owns its run folder, so the
workload can put a file of its own where nsys wrote the export: its schema is an attacker's.

- A plain file, reached without a symbolic link at its last step: never a named pipe, whose
  open would block for ever.
- Opened read-only and immutable (``mode=ro&immutable=1``: the file is finished, so no journal or
  WAL planted beside it is read and no lock is taken), the schema untrusted (``trusted_schema=OFF``:
  no function with side effects in a view or a trigger), no write at all (``query_only``), each
  page's cells checked (``cell_size_check``).
- A table read must be a stored table: a view (an endless recursive query), a virtual table, a
  generated column or a trigger among the tables read is refused, so every row read is a row
  stored in the file and every query over it ends. Names are compared as SQLite compares them,
  without regard to case: a view ``stringids`` is the table ``StringIds`` to a query.
- Every query of one file shares one deadline (the progress handler): past it, SQLite interrupts.
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
import urllib.parse

STEPS_BETWEEN_CHECKS = 20000  # SQLite virtual machine steps between two looks at the clock


class Refused(ValueError):
    """The file, or a table fleet reads in it, refused; the message is one line without the
    file's name (the caller says which file)."""


def check_regular_file(path):
    """``path`` a plain file, reached without a symbolic link at its last step (opened without
    waiting: a named pipe is refused, not waited on); Refused else."""
    try:
        fd = os.open(str(path), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        raise Refused("cannot open it (%s)" % (e.strerror or e))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Refused("it is not a plain file")
    finally:
        os.close(fd)


def uri(path):
    """The read-only, immutable URI of ``path``, made absolute as it is written (never with a
    '..' resolved as text, which could name another file than the one checked), its characters
    quoted: a '?' or '#' in a folder's name is no URI parameter."""
    path = str(path)
    absolute = path if os.path.isabs(path) else os.path.join(os.getcwd(), path)
    return "file:%s?mode=ro&immutable=1" % urllib.parse.quote(absolute)


def untrusted(db):
    """``db`` made to distrust its schema and to write nothing."""
    for pragma in ("trusted_schema = OFF", "query_only = ON", "cell_size_check = ON"):
        db.execute("PRAGMA " + pragma)  # an older SQLite ignores a pragma it does not know
    return db


def deadline(db, at):
    """Every query of ``db`` interrupted once ``time.monotonic()`` passes ``at``."""
    db.set_progress_handler(lambda: time.monotonic() > at, STEPS_BETWEEN_CHECKS)


def interrupted(error):
    """Whether a SQLite error is the deadline's interruption."""
    return isinstance(error, sqlite3.OperationalError) and "interrupt" in str(error)


def plain_tables(db, tables):
    """Which of ``tables`` the file has (by the names given), each checked to be a stored table: a
    view, a virtual table, a generated column or a trigger on one of them, under any case of its
    name, raises :class:`Refused`."""
    wanted = dict((t.lower(), t) for t in tables)
    found = set()
    for kind, name, on, sql in db.execute("SELECT type, name, tbl_name, sql FROM sqlite_master"):
        if kind == "trigger" and str(on).lower() in wanted:
            raise Refused("a trigger on %s (%s): an export has none; refused" % (on, name))
        if str(name).lower() not in wanted:
            continue
        if kind == "view":
            raise Refused("%s is a view, not a table: an export's tables "
                          "are stored rows; refused" % name)
        if kind == "table" and str(sql or "").lstrip().upper().startswith("CREATE VIRTUAL"):
            raise Refused("%s is a virtual table: an export's tables "
                          "are stored rows; refused" % name)
        if kind == "table":
            found.add(wanted[str(name).lower()])
    for name in sorted(found):
        generated = [row[1] for row in db.execute("PRAGMA table_xinfo('%s')" % name)
                     if row[6] in (2, 3)]
        if generated:
            raise Refused("%s.%s is a generated column: an export stores its values; "
                          "refused" % (name, generated[0]))
    return found
