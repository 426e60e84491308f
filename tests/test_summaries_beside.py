"""A report's summaries made from exports of their own tables, beside the whole export: the same
files as from the whole export, nothing left beside the report, and the whole export still the one
to fall back on where nsys cannot export a table alone. The stand-in nsys exports as the real one
did (tests/fixtures/nsys-export-tables-h100)."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fleet.agent import node, reports, summaries
from tests.harness.sshd import STANDINS

pytestmark = pytest.mark.services  # it runs the stand-in nsys

RECORDED = Path(__file__).parent / "fixtures" / "nsys-export-tables-h100" / "transcript.txt"
# a workload with two NVTX ranges, as the stand-in reads them
WORKLOAD = "import os; open(os.environ['STANDIN_NVTX_LOG'], 'a').write('step\\nstep\\n')"


def report(tmp_path: Path) -> dict:
    """A report the stand-in nsys made, with kernels, API calls and NVTX ranges in it."""
    tmp_path.mkdir(exist_ok=True)
    nvtx = tmp_path / "nvtx.log"
    subprocess.run([str(STANDINS / "nsys"), "profile", "-o", str(tmp_path / "h01-1"), sys.executable, "-c",
                    WORKLOAD], check=True, capture_output=True, env={**os.environ, "STANDIN_NVTX_LOG": str(nvtx)})
    return reports.hashed(str(tmp_path / "h01-1.nsys-rep"))


def wrapped_nsys(tmp_path: Path, cases: str) -> Path:
    """The stand-in nsys behind a shell `case` of its arguments: ``cases`` first (a failure, say),
    anything else passed on."""
    nsys = tmp_path / "nsys"
    nsys.write_text(f"#!/bin/sh\ncase \"$*\" in {cases} esac\nexec {STANDINS / 'nsys'} \"$@\"\n")
    nsys.chmod(0o755)
    return nsys


def made(rep: dict, beside: bool) -> dict[str, bytes]:
    entries, notes = reports.summarize_one(str(STANDINS / "nsys"), rep, beside)
    assert notes == [], notes
    return {e["summary"]: Path(e["path"]).read_bytes() for e in entries if e["summary"] != reports.EXPORT}


def test_summaries_made_beside_the_export_are_those_made_from_it(tmp_path):
    rep = report(tmp_path / "a")
    (tmp_path / "b").mkdir()
    again = dict(rep, path=str(tmp_path / "b" / "h01-1.nsys-rep"))
    shutil.copyfile(rep["path"], again["path"])
    beside, after = made(rep, True), made(again, False)
    assert set(beside) == set(reports.SUMMARIES) and beside == after
    assert b"Name" in beside["cuda_gpu_kern_sum"] and beside["cuda_api_sum"] and beside["nvtx_sum"]
    left = {p.name for p in (tmp_path / "a").iterdir()} - {"nvtx.log"}  # the side exports are gone
    assert left == {"h01-1.nsys-rep", "h01-1.sqlite", *(f"h01-1_{n}.csv" for n in reports.SUMMARIES)}


def test_a_summary_nsys_cannot_export_alone_is_made_from_the_whole_export(tmp_path):
    """An nsys that refuses --tables (older releases): each summary from the whole export, as before."""
    nsys = wrapped_nsys(tmp_path, "*--tables=*) echo 'unknown option' >&2; exit 1;;")
    rep = report(tmp_path / "r")
    entries, notes = reports.summarize_one(str(nsys), rep, True)
    assert notes == [] and {e["summary"] for e in entries} == {*reports.SUMMARIES, reports.EXPORT}
    assert not [p for p in (tmp_path / "r").iterdir() if p.name.startswith(".fleet-summaries-")]


def test_each_summary_is_exported_with_the_tables_it_reads_and_no_other(tmp_path):
    rep = report(tmp_path)
    for name in reports.SUMMARIES:
        out = tmp_path / f"{name}.sqlite"
        part = reports.Export(str(STANDINS / "nsys"), rep["path"], str(out), summaries.summary_tables(name))
        assert part.finished([]) == str(out)
        with sqlite3.connect(out) as db:
            tables = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == set(summaries.summary_tables(name))


def test_the_stand_in_exports_tables_as_the_recorded_nsys_did(tmp_path):
    """Each --tables case of the recording: the tables it gave, of those the stand-in's export has."""
    rep = report(tmp_path)
    whole = tmp_path / "whole.sqlite"
    assert reports.Export(str(STANDINS / "nsys"), rep["path"], str(whole)).finished([]) == str(whole)
    with sqlite3.connect(whole) as db:
        ours = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    cases = recorded_cases()
    assert set(cases) == {"stringids", "KERNEL", "CUPTI_ACTIVITY_KIND_.*", "NO_SUCH_TABLE"}
    for pattern, tables in cases.items():
        out = tmp_path / "part.sqlite"
        assert reports.Export(str(STANDINS / "nsys"), rep["path"], str(out), (pattern,)).finished([]) == str(out)
        with sqlite3.connect(out) as db:
            got = {n for (n,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert got == tables & ours, pattern
        assert (out.stat().st_size == 0) == (not tables), pattern


def recorded_cases() -> dict[str, set[str]]:
    """{pattern: the tables the real nsys's export of one pattern held}, from the transcript."""
    cases, pattern = {}, None
    for line in RECORDED.read_text().splitlines():
        m = re.search(r"--tables=(\S+) -o \S+/(pat|case|re|none)\.sqlite", line)
        if m:
            pattern = m.group(1)
            cases[pattern] = set()
        elif pattern and re.match(r"^  \S+ +\d+$", line):
            cases[pattern].add(line.split()[0])
        elif pattern and not line.endswith("bytes"):
            pattern = None
    return cases


def test_only_a_large_report_on_a_disk_with_room_has_its_summaries_made_beside_its_export(tmp_path, monkeypatch):
    """/bin/true's report (74 KB) is summarized in milliseconds after its export: three more exports,
    each loading the report again, would only cost. A second export needs room, and never in memory."""
    small, big = tmp_path / "small.nsys-rep", tmp_path / "big.nsys-rep"
    small.write_bytes(b"x" * 75_000)
    with open(big, "wb") as f:
        f.truncate(reports.SIDE_EXPORT_BYTES)
    on_disk = node.mount_type(str(tmp_path.resolve())) not in node.MEMORY_FS
    assert not reports.worth_beside(str(small)) and reports.worth_beside(str(big)) == on_disk
    assert not reports.worth_beside(str(tmp_path / "gone"))
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:  # tmpfs: the export would be held in memory
        in_memory = Path(shm) / "big.nsys-rep"
        with open(in_memory, "wb") as f:
            f.truncate(reports.SIDE_EXPORT_BYTES)
        assert not reports.worth_beside(str(in_memory))
    monkeypatch.setattr(reports, "SIDE_EXPORT_ROOM", 1 << 40)  # no disk has that much free
    assert not reports.worth_beside(str(big))


def test_summaries_made_beside_are_kept_when_the_whole_export_fails(tmp_path):
    """The whole export failing (its disk full, say) cost the summaries already made beside it."""
    nsys = wrapped_nsys(tmp_path, "*--tables=*) ;; *export*) echo 'disk full' >&2; exit 1;;")
    rep = report(tmp_path / "r")
    entries, notes = reports.summarize_one(str(nsys), rep, True)
    assert {e["summary"] for e in entries} == set(reports.SUMMARIES)
    assert len(notes) == 1 and "nsys export wrote no SQLite export" in notes[0] and "disk full" in notes[0]


def test_a_folder_for_the_exports_beside_that_cannot_be_made_leaves_the_whole_export(tmp_path, monkeypatch):
    def refused(*args, **kwargs):
        raise OSError(122, "Disk quota exceeded")
    rep = report(tmp_path / "r")
    monkeypatch.setattr(reports.tempfile, "mkdtemp", refused)
    entries, notes = reports.summarize_one(str(STANDINS / "nsys"), rep, True)
    assert notes == [] and {e["summary"] for e in entries} == {*reports.SUMMARIES, reports.EXPORT}


def test_an_exports_time_limit_counts_from_its_start(tmp_path, monkeypatch):
    """The whole export was asked for its end only once the exports beside it were done: its limit
    then ran from there, twice the time in all."""
    nsys = tmp_path / "nsys"
    nsys.write_text("#!/bin/sh\nexec sleep 30\n")
    nsys.chmod(0o755)
    monkeypatch.setattr(reports, "STATS_TIMEOUT", 1.0)
    hung = reports.Export(str(nsys), str(tmp_path / "r.nsys-rep"), str(tmp_path / "r.sqlite"))
    time.sleep(1.2)
    started, notes = time.monotonic(), []
    assert hung.finished(notes) is None and time.monotonic() - started < 0.5
    assert "timed out" in notes[0]
