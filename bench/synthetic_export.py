"""An nsys SQLite export of a given size, grown from one recorded on an H200 test machine.

The recorded export (``tests/fixtures/ranks-h200/recorded/rank0.sqlite``: nsys 2025.3.1, rank 0 of a
PyTorch program under torchrun; its README says how it was made) is copied, and its event tables (each one with
a ``start``, and the OSRT call chains) are appended to again and again, each copy's timestamps moved
past the last and its ids past the last copy's, until the file is ``size`` bytes or more. Its
content is the recorded one's, so it compresses as an export does (zstd -1: about 3.2x, the
recorded file 3.5x), where random bytes would not at all.

    .venv/bin/python bench/synthetic_export.py OUT.sqlite 259
"""

from __future__ import annotations

import os
import shutil
import sqlite3
import sys
from pathlib import Path

RECORDED = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "ranks-h200" / "recorded" / "rank0.sqlite"
ID_STEP = 10_000_000  # more than any id of the recorded export


def grow(dest: Path, size: int) -> Path:
    shutil.copy(RECORDED, dest)
    with sqlite3.connect(dest) as db:
        tables = _event_tables(db)
        span = db.execute("SELECT max(end) - min(start) + 1000 FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
        copy = 1
        while os.path.getsize(dest) < size:
            for name, columns in tables.items():
                moved = [f'"{c}" + {copy * span}' if c in ("start", "end") else
                         f'"{c}" + {copy * ID_STEP}' if c in ("correlationId", "id") else f'"{c}"' for c in columns]
                db.execute(f'INSERT INTO "{name}" SELECT {", ".join(moved)} FROM "recorded_{name}"')
            db.commit()
            copy += 1
    return dest


def _event_tables(db: sqlite3.Connection) -> dict[str, list[str]]:
    """Each event table's columns, its recorded rows kept aside in a temporary table to copy from."""
    tables = {}
    for (name,) in list(db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")):
        columns = [row[1] for row in db.execute(f'PRAGMA table_info("{name}")')]
        if "start" in columns or name == "OSRT_CALLCHAINS":
            tables[name] = columns
            db.execute(f'CREATE TEMP TABLE "recorded_{name}" AS SELECT * FROM "{name}"')
    return tables


if __name__ == "__main__":
    out = grow(Path(sys.argv[1]), int(sys.argv[2]) << 20)
    print(f"{out}: {out.stat().st_size} bytes")
