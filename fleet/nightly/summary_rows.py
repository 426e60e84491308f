"""The rows of a run's summaries that a playbook's metrics are read from, each read once into its
type: an ``nsys stats --format csv`` report's (``SummaryRow``: a kernel's or an NVTX range's name
and total time) and ncu's raw page's (``NcuPage`` of ``NcuRow``s: each kernel launch's value of
the one metric asked for). They are files a node wrote, read back from the store: a cell is text
or absent (a row shorter than its header, a column the file lacks), never another type."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..policy.readers import str_of


def csv_rows(csv_path: Path) -> list[dict]:
    """A CSV file's rows, each a mapping of its header's names to its cells."""
    with open(csv_path, newline="") as f:
        return list(csv.DictReader(f))


@dataclass(frozen=True)
class SummaryRow:
    """A row of an ``nsys stats`` report: its ``Name`` (a kernel's, or an NVTX range's where the
    report has no ``Range``), its ``Range`` and its total time, as text."""
    name: str | None = None
    range: str | None = None
    total: str | None = None    # Total Time (ns), or where empty an older nsys's Total Time

    @classmethod
    def read(cls, row: Any) -> "SummaryRow":
        row = row if isinstance(row, dict) else {}
        return cls(str_of(row.get("Name")), str_of(row.get("Range")),
                   str_of(row.get("Total Time (ns)")) or str_of(row.get("Total Time")))

    @property
    def total_ns(self) -> float:
        """Its total time; 0 where it says none. Read when the metric asks for it: text that is
        no number is a ValueError then, as ``float`` says."""
        return float(self.total or 0)

    @property
    def range_name(self) -> str:
        """The NVTX range it stands for: its ``Range``, else its ``Name``."""
        return self.range if self.range is not None else self.name or ""


def summary_rows(csv_path: Path) -> list[SummaryRow]:
    """The rows of an ``nsys stats --format csv`` report."""
    return [SummaryRow.read(row) for row in csv_rows(csv_path)]


@dataclass(frozen=True)
class NcuRow:
    """A row of ncu's raw page: its kernel's name and its cell of one metric, as text."""
    kernel: str | None = None
    value: str | None = None

    @classmethod
    def read(cls, row: Any, metric: str | None) -> "NcuRow":
        row = row if isinstance(row, dict) else {}
        return cls(str_of(row.get("Kernel Name")), str_of(row.get(metric)))


@dataclass(frozen=True)
class NcuPage:
    """ncu's raw page (``ncu --import --page raw --csv``) as one metric reads it: the unit its
    second row gives the metric, and a row per kernel launch."""
    unit: str | None
    launches: tuple[NcuRow, ...]

    @classmethod
    def read(cls, rows: list[dict], metric: str | None) -> "NcuPage | None":
        """None where the page has no row, or no column ``metric``."""
        if not rows or metric not in rows[0]:
            return None
        units, *launches = (NcuRow.read(row, metric) for row in rows)
        return cls(units.value, tuple(launches))
