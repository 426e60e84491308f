"""The summaries a node wrote, read from the store within bounds: ``nsys stats --format csv``'s
reports (name, total time, count) and ncu's raw page (``ncu --import --page raw --csv``: a header
row, a units row, one row per profiled kernel launch). The column names are those nsys 2025.3 and
ncu 2025.3 write; a file without them is a ValueError naming what it has."""

from __future__ import annotations

import csv
from pathlib import Path

from . import numbers

NSYS_TOTAL = "Total Time (ns)"
NCU_NAME = "Kernel Name"
NCU_DURATION = "gpu__time_duration.sum"
NS_PER = {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9,
          "second": 1e9}


def _number(text: str, column: str) -> float:
    return numbers.real(text, column)  # bounded: a total of 1e400 is a ValueError, not infinity


def nsys_rows(path: Path, name_col: str, count_col: str) -> dict[str, tuple[float, int]]:
    """name -> (total ns, count) of one ``nsys stats --format csv`` report; {} for an empty file."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:  # 0 bytes: nothing of its kind was recorded
            return {}
        missing = [c for c in (NSYS_TOTAL, name_col, count_col) if c not in reader.fieldnames]
        if missing:
            raise ValueError(f"no column {', '.join(map(repr, missing))} (it has "
                             f"{', '.join(reader.fieldnames)})")
        out: dict[str, tuple[float, int]] = {}
        for row in reader:
            total, count = out.get(row[name_col], (0.0, 0))
            out[row[name_col]] = (total + _number(row[NSYS_TOTAL], NSYS_TOTAL),
                                  count + int(_number(row[count_col], count_col)))
        return out


def ncu_rows(path: Path) -> dict[str, tuple[float, int]]:
    """Kernel name -> (total ns, launches) from ncu's raw page, its duration converted by the
    unit its second row gives."""
    name_col = NCU_NAME
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if reader.fieldnames is None:
            return {}
        missing = [c for c in (name_col, NCU_DURATION) if c not in reader.fieldnames]
        if missing:
            raise ValueError(f"no column {', '.join(map(repr, missing))} (run ncu with the section "
                             f"that collects {NCU_DURATION})")
        units = next(reader, None)
        unit = (units or {}).get(NCU_DURATION, "")
        if unit not in NS_PER:
            raise ValueError(f"{NCU_DURATION} is in {unit!r}, not a unit of time fleet knows")
        out: dict[str, tuple[float, int]] = {}
        for row in reader:
            if not (row.get(NCU_DURATION) or "").strip():
                continue
            total, count = out.get(row[name_col], (0.0, 0))
            out[row[name_col]] = (total + _number(row[NCU_DURATION], NCU_DURATION) * NS_PER[unit],
                                  count + 1)
        return out


def kernel_rows(csv_path: Path) -> list[tuple[str, int, int]]:
    """(name, total ns, instances) from an ``nsys stats`` cuda_gpu_kern_sum CSV; rows whose numbers
    are out of bounds are left out (see :func:`checked_kernel_rows`)."""
    return checked_kernel_rows(csv_path)[0]


def checked_kernel_rows(csv_path: Path) -> tuple[list[tuple[str, int, int]], list[str]]:
    """The rows, and why each row left out was (a total of ``1e400`` fits no INTEGER)."""
    rows, bad = [], []
    try:
        with open(csv_path, newline="") as f:
            for r in csv.DictReader(f):
                if not r.get("Name"):
                    continue
                try:
                    rows.append((r["Name"], numbers.count(r["Total Time (ns)"], "Total Time (ns)"),
                                 numbers.count(r["Instances"], "Instances")))
                except (KeyError, ValueError) as e:
                    bad.append(f"kernel {r['Name'][:60]!r} ({e})")
    except (OSError, csv.Error, UnicodeDecodeError):
        return [], []
    return rows, bad
