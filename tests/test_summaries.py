"""The kernel, CUDA API and NVTX summaries fleet makes from a report's SQLite export, against what
``nsys stats --format csv`` wrote from the same export on an H200 test machine; and how the agent
makes them, once per report, without a failing summary costing the report."""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

import pytest

from fleet.agent import reports, summaries

FIXTURES = Path(__file__).parent / "fixtures"
STANDIN = Path(__file__).parent / "standins" / "nsys"


def recorded_pairs():
    """Every recorded export that has the three CSV files nsys stats wrote from it beside it
    (EXPORT.sqlite and EXPORT_<summary>.csv)."""
    return sorted(p for p in FIXTURES.rglob("*.sqlite")
                  if all(p.with_name(f"{p.stem}_{name}.csv").exists() for name in reports.SUMMARIES))


def test_the_recorded_exports_with_nsys_stats_output_are_there():
    """Without them the comparison below would pass on nothing."""
    names = {p.relative_to(FIXTURES).as_posix() for p in recorded_pairs()}
    assert {"ranks-h200/recorded/rank0.sqlite", "ranks-h200/recorded/rank1.sqlite"} <= names
    assert any(n.startswith("summaries-h200/") for n in names)


@pytest.mark.parametrize("export", recorded_pairs(), ids=lambda p: p.relative_to(FIXTURES).as_posix())
@pytest.mark.parametrize("name", reports.SUMMARIES)
@pytest.mark.parametrize("span_rows", [summaries.SPAN_ROWS, 7], ids=["whole", "in-spans"])
def test_a_summary_is_what_nsys_stats_wrote_from_the_same_export_byte_for_byte(export, name, span_rows, tmp_path,
                                                                              monkeypatch):
    """Also with each table cut into spans of 7 rows, sorted in threads apart and added up: the
    recorded exports are small, and the spans are what a large one is summarized in."""
    monkeypatch.setattr(summaries, "SPAN_ROWS", span_rows)
    monkeypatch.setattr(summaries, "cpus", lambda: 16)
    failed = summaries.write(str(export), [name], lambda n: str(tmp_path / f"{n}.csv"))
    assert failed == {}
    assert (tmp_path / f"{name}.csv").read_bytes() == export.with_name(f"{export.stem}_{name}.csv").read_bytes()


def logged_nsys(tmp_path: Path, body: str) -> tuple[Path, Path]:
    """An nsys that logs each subcommand it is given, then runs ``body`` (sh) with "$@"."""
    log, nsys = tmp_path / "calls", tmp_path / "nsys"
    nsys.write_text(f'#!/bin/sh\necho "$1" >> {log}\n{body}\n')
    nsys.chmod(0o755)
    return nsys, log


@pytest.mark.services  # runs the stand-in nsys's export
def test_each_report_is_exported_once_and_its_summaries_are_made_from_that_export(tmp_path):
    """No nsys stats (which would export the report again): nsys export alone, once per report,
    over an export an earlier run of the same name left; the summaries beside it, private."""
    nsys, log = logged_nsys(tmp_path, f'exec {sys.executable} {STANDIN} "$@"')
    report = tmp_path / "r.nsys-rep"
    report.write_text('{"pid": 42, "kernels": [{"name": "k", "instances": 3, "time_ns": 300}], '
                      '"nvtx": [{"name": "step", "time_ns": 50}]}')
    (tmp_path / "r.sqlite").write_text("an earlier run's export")
    notes = []
    got = reports.summarize(str(nsys), [{"path": str(report)}], notes)
    assert notes == [] and log.read_text().split() == ["export"]
    assert [(g["summary"], g.get("kind")) for g in got] == [(n, None) for n in reports.SUMMARIES] + [("sqlite", "export")]
    for entry in got:
        data = Path(entry["path"]).read_bytes()
        assert entry["sha256"] == hashlib.sha256(data).hexdigest() and entry["report"] == str(report)
        assert stat.S_IMODE(os.stat(entry["path"]).st_mode) == 0o600
    kernels = Path(got[0]["path"]).read_text().splitlines()
    assert kernels[0] == summaries.HEADERS["cuda_gpu_kern_sum"] and kernels[1].endswith(",300,3,100.0,100.0,100,100,0.0,k")
    assert Path(got[2]["path"]).read_text().splitlines()[1].endswith(",PushPop,:step")


@pytest.mark.services  # runs the stand-in nsys's export
def test_a_report_nsys_cannot_export_has_no_summaries_and_a_note(tmp_path):
    nsys, log = logged_nsys(tmp_path, "echo 'cannot read the report'; exit 1")
    report = tmp_path / "r.nsys-rep"
    report.write_text("{}")
    notes = []
    assert reports.summarize(str(nsys), [{"path": str(report)}], notes) == []
    assert notes == [f"nsys export wrote no SQLite export of {report} (exit 1): cannot read the report"]
    assert report.read_text() == "{}"


@pytest.mark.services  # runs the stand-in nsys's export
def test_the_reports_of_one_run_are_exported_side_by_side_and_listed_in_their_order(tmp_path):
    """Ranks of one launcher on one node: one export each, made at the same time (each nsys waits
    until all have started, so one at a time would never end), entries and notes in report order."""
    reps = []
    for i in range(5):
        rep = tmp_path / f"rank{i}.nsys-rep"
        rep.write_text('{"pid": %d, "kernels": [{"name": "k%d", "instances": 1, "time_ns": 10}]}' % (i, i))
        reps.append({"path": str(rep)})
    (tmp_path / "rank3.nsys-rep").write_text("not a report of the stand-in")
    started = tmp_path / "started"
    started.mkdir()
    nsys, log = logged_nsys(tmp_path, f'touch {started}/$$; i=0\n'
                            f'while [ $(ls {started} | wc -l) -lt {reports.EXPORTS_AT_ONCE} ] && [ $i -lt 100 ]; do '
                            f'sleep 0.1; i=$((i+1)); done\n[ $i -lt 100 ] || exit 7\nexec {sys.executable} {STANDIN} "$@"')
    notes = []
    got = reports.summarize(str(nsys), reps, notes)
    assert [g["report"] for g in got if g.get("kind") == "export"] == [r["path"] for i, r in enumerate(reps) if i != 3]
    assert [g["report"] for g in got][:4] == [reps[0]["path"]] * 4
    assert len(notes) == 1 and str(tmp_path / "rank3.nsys-rep") in notes[0]
    assert log.read_text().split() == ["export"] * 5


@pytest.mark.services  # runs the stand-in nsys's export
def test_an_export_fleet_cannot_read_costs_its_summaries_and_nothing_else(tmp_path):
    """A summary that fails is a note: the export is still listed, hashed, for the trip home."""
    nsys, _ = logged_nsys(tmp_path, 'while [ "$1" != --output ]; do shift; done; echo not-sqlite > "$2"')
    report = tmp_path / "r.nsys-rep"
    report.write_text("{}")
    notes = []
    got = reports.summarize(str(nsys), [{"path": str(report)}], notes)
    assert [(g["summary"], g["size"]) for g in got] == [("sqlite", 11)]
    assert len(notes) == 3 and all(f"summary of {report} could not be made from its export" in n for n in notes)
    assert not list(tmp_path.glob("*.csv"))


def test_an_export_without_a_kind_of_data_has_an_empty_summary_of_it(tmp_path):
    """nsys stats writes an empty file, not a header alone, where there is nothing of a kind
    (tests/fixtures/tools-2025.3-h200/nsys-no-kernels-stats); a report made without CUDA traced
    has no kernel table at all."""
    import sqlite3
    export = tmp_path / "r.sqlite"
    with sqlite3.connect(export) as db:
        db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    failed = summaries.write(str(export), reports.SUMMARIES, lambda n: str(tmp_path / f"{n}.csv"))
    assert failed == {} and [(tmp_path / f"{n}.csv").read_bytes() for n in reports.SUMMARIES] == [b"", b"", b""]


def test_a_table_in_spans_is_cut_where_its_rowids_are_and_no_finer_than_asked(tmp_path):
    import sqlite3
    db = sqlite3.connect(tmp_path / "t.sqlite")
    db.execute("CREATE TABLE t (x)")
    assert summaries.spans(db, "t", 8) == []
    db.executemany("INSERT INTO t (rowid, x) VALUES (?, 0)", [(i,) for i in range(5, 5 + 3 * summaries.SPAN_ROWS)])
    assert summaries.spans(db, "t", 1) == [(5, 4 + 3 * summaries.SPAN_ROWS)]
    cut = summaries.spans(db, "t", 8)
    assert len(cut) == 3 and cut[0][0] == 5 and cut[-1][1] == 4 + 3 * summaries.SPAN_ROWS
    assert all(b + 1 == c for (_, b), (c, _) in zip(cut, cut[1:]))


def kernel_export(path, rows, without_rowid=False):
    """An export with the kernel table alone: rows of (rowid, demangledName id, duration); ids 1 and
    2 are both named "k"."""
    import sqlite3
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    db.executemany("INSERT INTO StringIds VALUES (?, 'k')", [(1,), (2,)])
    if without_rowid:
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                   "demangledName INTEGER, PRIMARY KEY (start, demangledName)) WITHOUT ROWID")
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?)",
                       [(i * 100, i * 100 + d, g) for i, g, d in rows])
    else:
        db.execute("CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL, "
                    "demangledName INTEGER)")
        db.executemany("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (rowid, start, end, demangledName) VALUES (?, ?, ?, ?)",
                       [(i, i * 100, i * 100 + d, g) for i, g, d in rows])
    db.commit()
    db.close()


def test_rows_that_tie_in_nsys_stats_order_keep_one_order_however_the_table_is_cut(tmp_path, monkeypatch):
    """Two kernels both named "k", the same total and count, different spreads: nsys's order (total
    down, count up, name) cannot tell them apart, so the order is SQLite's by group; the spans (the
    group of id 2 first in the table) must give that same order, not the order they were seen in."""
    rows = [(1, 2, 2), (2, 2, 2), (1000, 1, 1), (1001, 1, 3)]
    kernel_export(tmp_path / "e.sqlite", rows)
    text = {}
    for span_rows in (summaries.SPAN_ROWS, 1):
        monkeypatch.setattr(summaries, "SPAN_ROWS", span_rows)
        monkeypatch.setattr(summaries, "cpus", lambda: 8)
        assert summaries.write(str(tmp_path / "e.sqlite"), ["cuda_gpu_kern_sum"], lambda n: str(tmp_path / f"{span_rows}.csv")) == {}
        text[span_rows] = (tmp_path / f"{span_rows}.csv").read_text().splitlines()
    assert text[1] == text[summaries.SPAN_ROWS]
    assert [line.split(",")[5:7] for line in text[1][1:]] == [["1", "3"], ["2", "2"]]  # id 1 (min 1, max 3) first


def test_a_table_without_rowids_is_summarized_whole(tmp_path):
    kernel_export(tmp_path / "e.sqlite", [(1, 1, 5), (2, 1, 7)], without_rowid=True)
    assert summaries.write(str(tmp_path / "e.sqlite"), ["cuda_gpu_kern_sum"], lambda n: str(tmp_path / "k.csv")) == {}
    assert (tmp_path / "k.csv").read_text().splitlines()[1] == "100.0,12,2,6.0,6.0,5,7,1.4,k"


def test_an_export_is_read_where_its_path_has_uri_characters_and_is_never_changed(tmp_path):
    """The export is opened as a read-only SQLite URI: a folder named with %, ? or # is still
    that folder, and the file nsys wrote stays byte for byte as it was."""
    recorded = FIXTURES / "ranks-h200" / "recorded" / "rank0.sqlite"
    folder = tmp_path / "run %41?mode=rw#x"
    folder.mkdir()
    export = folder / "rank0.sqlite"
    export.write_bytes(recorded.read_bytes())
    failed = summaries.write(str(export), ["nvtx_sum"], lambda n: str(folder / f"{n}.csv"))
    assert failed == {} and (folder / "nvtx_sum.csv").read_bytes() == recorded.with_name("rank0_nvtx_sum.csv").read_bytes()
    assert export.read_bytes() == recorded.read_bytes()


def test_a_median_across_spans_is_the_one_of_the_whole_table(tmp_path, monkeypatch):
    """A group's runs in several spans are never merged row by row: its median comes from their counts.
    Durations repeated across spans, even and odd counts, a group in one span only, all cut finer and
    finer: each cut gives the CSV of the whole table, whose figures are checked against Python's own."""
    import random
    import statistics
    rng = random.Random(7)
    rows = [(i, 1 if i % 3 else 2, rng.choice([5, 5, 5, 1000] + list(range(10, 90)))) for i in range(1, 200)] + [(500, 3, 4)]
    kernel_export(tmp_path / "e.sqlite", rows)
    monkeypatch.setattr(summaries, "cpus", lambda: 8)
    text = {}
    for span_rows in (summaries.SPAN_ROWS, 50, 7, 1):
        monkeypatch.setattr(summaries, "SPAN_ROWS", span_rows)
        assert summaries.write(str(tmp_path / "e.sqlite"), ["cuda_gpu_kern_sum"], lambda n: str(tmp_path / f"{span_rows}.csv")) == {}
        text[span_rows] = (tmp_path / f"{span_rows}.csv").read_text()
    assert text[1] == text[7] == text[50] == text[summaries.SPAN_ROWS]
    by_total = sorted(([d for _, g, d in rows if g == grp] for grp in (1, 2, 3)), key=lambda ds: (-sum(ds), len(ds)))
    for line, ds in zip(text[1].splitlines()[1:], by_total):
        fields = line.split(",")
        assert [int(fields[1]), int(fields[2]), float(fields[4]), int(fields[5]), int(fields[6])] == \
            [sum(ds), len(ds), statistics.median(ds), min(ds), max(ds)]
