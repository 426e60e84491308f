"""A SQLite file fleet did not write, opened as hostile input: an nsys export is written where the
job runs (on Slurm every workload can write its run folder), so its schema and its values are an
attacker's.

The rules the node's summaries share (read-only, the schema untrusted, stored tables only, one
deadline) are in :mod:`fleet.agent.sqlitefile`; what only the controller adds is here.

- It is opened read-only and immutable (``mode=ro&immutable=1``) on the store's own copy: fleet
  collected it into a folder that is the user's alone, checked its sha256, and nothing changes it
  under the reader. A journal or WAL file planted beside it is never read.
- A table read must be a plain table: a view (an endless recursive query), a virtual table, a
  generated column or a trigger among the tables read is refused, so every row read is a row
  stored in the file.
- The reader sorts and joins in Python, not in SQL: no sorter, no temporary b-tree. Should SQLite
  still want temporary space, it is memory (``temp_store=MEMORY``) under a heap limit, never the
  controller's disk.
- Rows a table may give, bytes a value may hold, and the time a file may take are bounded (the
  progress handler); past a bound the file is refused with one line.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..agent import sqlitefile
from ..errors import FleetError

# rows one table may give (a long real trace has a few million kernels)
MAX_ROWS = 20_000_000
# a string or blob (SQLite's length limit; nsys's longest names are kilobytes)
MAX_VALUE_BYTES = 1 << 20
# SQLite's own heap, this process (a process-wide limit: it only ever lowers)
HEAP_BYTES = 256 << 20
READ_S = 120.0                 # one file, all its queries


class UntrustedFileError(FleetError, ValueError):
    """A SQLite file refused or failed; the message is one line, without the file's name (the
    caller says which file)."""


@contextmanager
def opened(path: str | Path, read_s: float = READ_S) -> Iterator[sqlite3.Connection]:
    """A read-only connection to ``path`` bounded in time, value size and memory; SQLite's errors
    (a damaged file, a bound reached) become :class:`UntrustedFileError`."""
    path = Path(path).absolute()  # the same string checked and opened
    db = None
    try:
        sqlitefile.check_regular_file(path)
        db = sqlitefile.untrusted(sqlite3.connect(sqlitefile.uri(path), uri=True,
                                                  isolation_level=None))
        db.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        for pragma in ("temp_store = MEMORY", f"hard_heap_limit = {HEAP_BYTES}"):
            db.execute(f"PRAGMA {pragma}")
        sqlitefile.deadline(db, time.monotonic() + read_s)
        db.execute("SELECT count(*) FROM sqlite_master").fetchall()
        yield db
    except sqlite3.OperationalError as e:
        raise UntrustedFileError(f"read for longer than {read_s:.0f} s: refused"
                                 if sqlitefile.interrupted(e)
                                 else f"SQLite: {e}") from None
    except sqlite3.DataError:  # SQLITE_TOOBIG: past the length limit lowered above
        raise UntrustedFileError("a value is longer than "
                                 f"{MAX_VALUE_BYTES >> 20} MiB: refused") from None
    except sqlite3.DatabaseError as e:
        raise UntrustedFileError(f"not a SQLite file nsys wrote ({e})") from None
    except MemoryError:
        raise UntrustedFileError(f"needed more than {HEAP_BYTES >> 20} "
                                 "MiB to read: refused") from None
    except sqlitefile.Refused as e:
        raise UntrustedFileError(str(e)) from None
    finally:
        if db is not None:
            db.close()


def plain_tables(db: sqlite3.Connection, tables: tuple[str, ...]) -> set[str]:
    """Which of ``tables`` the file has, each checked to be a stored table
    (:func:`fleet.agent.sqlitefile.plain_tables`)."""
    try:
        return sqlitefile.plain_tables(db, tables)
    except sqlitefile.Refused as e:
        raise UntrustedFileError(str(e)) from None


def rows(db: sqlite3.Connection, table: str, sql: str, args=()) -> Iterator[tuple]:
    """The rows of ``sql`` (a query of ``table``), at most :data:`MAX_ROWS`."""
    for n, row in enumerate(db.execute(sql, args)):
        if n >= MAX_ROWS:
            raise UntrustedFileError(f"{table} has more than {MAX_ROWS} rows: refused")
        yield row


def whole(value, table: str, column: str) -> int:
    """An integer column's value, or the error naming the table and column."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    shown = "NULL" if value is None else f"{type(value).__name__} {value!r}"
    shown = shown if len(shown) <= 48 else shown[:45] + "..."
    raise UntrustedFileError(f"{table}.{column} holds {shown}, not an integer")


def text(value) -> str | None:
    """A text column's value as text (NULL stays None)."""
    if value is None or isinstance(value, str):
        return value
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
