"""Exports are hostile input: a rank's ``.sqlite`` is written where the job (any workload on a
Slurm node) can write, so ``fleet reports ranks`` reads it as an attacker's file. A view over an
endless recursive query, a trigger or a virtual table among the tables read, and a value of the
wrong type each fail that one rank with one line naming it and why; the other ranks are analysed,
the command ends, and the controller's temporary space does not grow. The node's summaries, made
from the export where the job can put another file in its place, hold it to the same rules."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from contextlib import closing
from pathlib import Path

from fleet.agent import reports, summaries
from tests.conftest import REPO
from tests.harness import nsys_export as nx
from tests.harness.rank_plants import eight
from tests.harness.rank_store import RUN, file_run

ENDLESS_VIEW = """CREATE VIEW NVTX_EVENTS AS WITH RECURSIVE r(start, end, eventType, globalTid, text, textId) AS
 (SELECT 1, 2, 59, 0, 'x', NULL UNION ALL SELECT start + 1, end + 1, 59, globalTid, hex(randomblob(512)), NULL FROM r)
 SELECT * FROM r"""


def export_of(root: Path, rank: int) -> Path:
    return next(root.rglob(f"rank{rank}.sqlite"))


def plant(path: Path, *statements: str) -> None:
    with closing(sqlite3.connect(path)) as db, db:
        for sql in statements:
            db.execute(sql)


def temp_bytes(pid: int, folder: Path) -> int:
    """Bytes of the files the process holds open in ``folder``, deleted ones included (SQLite
    unlinks its temporary files as soon as it opens them)."""
    total = 0
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    for fd in fds:
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(str(folder)):
                total += os.stat(f"/proc/{pid}/fd/{fd}").st_size
        except OSError:
            continue
    return total


def ranks_watched(root: Path, tmp: Path, limit_s: float = 10):
    """``fleet reports ranks`` run as a user would, its temporary files pointed into ``tmp`` and
    measured while it runs; killed (by its pid) when it has not ended after ``limit_s``: the
    acceptance's generous bound. Returns (returncode or None, stdout, stderr, most temp bytes)."""
    tmp.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(TMPDIR=str(tmp), SQLITE_TMPDIR=str(tmp))
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "reports", "ranks", RUN, "--sync-range", "sync",
                             "--store", str(root)], env=env, cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    most, end = 0, time.monotonic() + limit_s
    while proc.poll() is None and time.monotonic() < end:
        most = max(most, temp_bytes(proc.pid, tmp))
        time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    return (None if proc.returncode < 0 else proc.returncode), out, err, most


def test_an_endless_recursive_view_fails_its_rank_in_one_line_and_the_temp_space_stays_small(tmp_path):
    root = file_run(tmp_path, nx.Scenario(eight()))
    plant(export_of(root, 1), "DROP TABLE NVTX_EVENTS", ENDLESS_VIEW)
    code, out, err, temp = ranks_watched(root, tmp_path / "tmp")
    assert code == 0, (out, err)
    assert temp < 64 << 20, temp
    assert re.search(r"^no export: rank 1 \(.*rank1\.sqlite: NVTX_EVENTS is a view", out, re.M), out
    assert re.search(r"^run \S+: 7 ranks", out, re.M) and "Traceback" not in err


def test_triggers_and_virtual_tables_among_the_tables_read_are_refused(tmp_path):
    root = file_run(tmp_path, nx.Scenario(eight()))
    plant(export_of(root, 2), "CREATE TRIGGER t AFTER INSERT ON StringIds BEGIN SELECT 1; END")
    plant(export_of(root, 3), "DROP TABLE PROCESSES",
          "CREATE VIRTUAL TABLE PROCESSES USING rtree(globalPid, pid, name)")
    code, out, err, _ = ranks_watched(root, tmp_path / "tmp")
    assert code == 0, (out, err)
    assert re.search(r"^no export: rank 2 \(.*rank2\.sqlite: a trigger on StringIds", out, re.M), out
    assert re.search(r"^no export: rank 3 \(.*rank3\.sqlite: PROCESSES is a virtual table", out, re.M), out
    assert re.search(r"^run \S+: 6 ranks", out, re.M)


def test_a_value_of_the_wrong_type_fails_that_rank_naming_file_table_and_column(tmp_path):
    root = file_run(tmp_path, nx.Scenario(eight()))
    plant(export_of(root, 2), "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 3")
    plant(export_of(root, 4), "UPDATE TARGET_INFO_SESSION_START_TIME SET utcEpochNs = 'yesterday'")
    plant(export_of(root, 6), "DROP TABLE NVTX_EVENTS",
          "CREATE TABLE NVTX_EVENTS (start, end, eventType, globalTid, text, textId)",
          "INSERT INTO NVTX_EVENTS VALUES (NULL, 5, 59, 0, 'sync', NULL)")
    code, out, err, _ = ranks_watched(root, tmp_path / "tmp")
    assert code == 0 and "Traceback" not in err, (out, err)
    for rank, table, column in ((2, "CUPTI_ACTIVITY_KIND_KERNEL", "start"),
                                (4, "TARGET_INFO_SESSION_START_TIME", "utcEpochNs"), (6, "NVTX_EVENTS", "start")):
        assert re.search(rf"^no export: rank {rank} \(.*rank{rank}\.sqlite: {table}\.{column} holds ", out, re.M), out
    assert re.search(r"^run \S+: 5 ranks", out, re.M), out


RECORDED_RANK = REPO / "tests" / "fixtures" / "ranks-h200" / "recorded" / "rank0.sqlite"
ENDLESS_STRINGS = """CREATE VIEW StringIds AS WITH RECURSIVE r(id, value) AS
 (SELECT 1, 'x' UNION ALL SELECT id + 1, hex(randomblob(512)) FROM r) SELECT * FROM r"""


def summarized(export: Path, out: Path) -> dict:
    """The node's summaries of ``export`` (as the agent makes them, into ``out``), what kept each
    from being made; made in a thread, waited for at most 120 s: an endless query fails the test
    rather than hanging it."""
    out.mkdir()
    failed = {}
    worker = threading.Thread(target=lambda: failed.update(
        summaries.write(str(export), reports.SUMMARIES, lambda name: str(out / f"{name}.csv"))), daemon=True)
    worker.start()
    worker.join(120)
    assert not worker.is_alive(), "the summaries did not end"
    return {name: str(e) for name, e in failed.items()}


def test_the_nodes_summaries_refuse_a_view_in_place_of_a_table_and_make_the_others(tmp_path):
    export = tmp_path / "rank0.sqlite"
    shutil.copyfile(RECORDED_RANK, export)
    plant(export, "DROP TABLE NVTX_EVENTS", ENDLESS_VIEW)
    failed = summarized(export, tmp_path / "out")
    assert list(failed) == ["nvtx_sum"] and "NVTX_EVENTS is a view, not a table" in failed["nvtx_sum"], failed
    for name in ("cuda_gpu_kern_sum", "cuda_api_sum"):  # made, as nsys stats made them from the real export
        assert (tmp_path / "out" / f"{name}.csv").read_bytes() == \
            RECORDED_RANK.with_name(f"rank0_{name}.csv").read_bytes()
    assert not (tmp_path / "out" / "nvtx_sum.csv").exists()


def test_the_nodes_summaries_refuse_an_endless_view_of_the_names_and_end(tmp_path):
    export = tmp_path / "rank0.sqlite"
    shutil.copyfile(RECORDED_RANK, export)
    plant(export, "DROP TABLE StringIds", ENDLESS_STRINGS)
    failed = summarized(export, tmp_path / "out")
    assert sorted(failed) == sorted(reports.SUMMARIES)
    assert all("StringIds is a view, not a table" in why for why in failed.values()), failed
    assert not list((tmp_path / "out").iterdir())


def test_the_nodes_summaries_of_one_export_stop_at_their_deadline_each_said(tmp_path, monkeypatch):
    """A plain table too large to sort in the time given (here none at all): each summary is
    stopped and said so, none waits on."""
    export = tmp_path / "big.sqlite"
    plant(export, "CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)",
          "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER, end INTEGER, demangledName INTEGER)",
          "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n "
          "WHERE i < 200000) SELECT i, i + i % 977, i % 13 FROM n")
    monkeypatch.setattr(summaries, "READ_S", 0.0)
    failed = summarized(export, tmp_path / "out")
    assert failed == {"cuda_gpu_kern_sum": "read for longer than 0 s: stopped"}


def test_the_nodes_summaries_refuse_a_view_whose_name_differs_from_the_tables_only_in_case(tmp_path):
    """SQLite finds a view `stringids` for a query of `StringIds`: it is that table to the summaries."""
    export = tmp_path / "rank0.sqlite"
    shutil.copyfile(RECORDED_RANK, export)
    plant(export, "DROP TABLE StringIds", ENDLESS_STRINGS.replace("VIEW StringIds", "VIEW stringids"))
    failed = summarized(export, tmp_path / "out")
    assert sorted(failed) == sorted(reports.SUMMARIES)
    assert all("stringids is a view, not a table" in why for why in failed.values()), failed


def test_a_named_pipe_in_place_of_the_export_or_a_report_is_refused_not_waited_on(tmp_path):
    """Opening a named pipe for reading waits for a writer that never comes: the job would be held
    until its time limit. Each is refused as no plain file."""
    from fleet.agent import files

    pipe = tmp_path / "rank0.sqlite"
    os.mkfifo(pipe)
    failed = summarized(pipe, tmp_path / "out")
    assert sorted(failed) == sorted(reports.SUMMARIES)
    assert all(why == "it is not a plain file" for why in failed.values()), failed
    worker = threading.Thread(target=lambda: refused.append(_refused(files.open_report, str(pipe))), daemon=True)
    refused: list = []
    worker.start()
    worker.join(60)
    assert not worker.is_alive() and refused == [True]


def _refused(call, *args) -> bool:
    from fleet.agent.files import UnsafePath

    try:
        call(*args).close()
    except UnsafePath:
        return True
    return False


def test_a_value_past_its_bound_fails_that_rank_in_one_line(tmp_path):
    """A 2 MiB kernel name: SQLite's length limit is lowered to the bound, so it is never read whole."""
    root = file_run(tmp_path, nx.Scenario(eight()))
    plant(export_of(root, 5), "UPDATE StringIds SET value = hex(zeroblob(1048576)) WHERE id = 1")
    code, out, err, _ = ranks_watched(root, tmp_path / "tmp")
    assert code == 0 and "Traceback" not in err, (out, err)
    assert re.search(r"^no export: rank 5 \(.*rank5\.sqlite: a value is longer than 1 MiB: refused\)$", out, re.M), out
    assert re.search(r"^run \S+: 7 ranks", out, re.M), out


def test_a_table_past_its_rows_and_a_file_past_its_time_are_refused_in_one_line(tmp_path, monkeypatch):
    """The reader's bounds, lowered so that a small file reaches them: rows a table may give, and
    the time one file may take (SQLite's progress handler interrupts a query mid-step)."""
    from fleet.analysis import untrusted_sqlite as u

    path = tmp_path / "x.sqlite"
    plant(path, "CREATE TABLE t (v)",
          "WITH RECURSIVE r(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM r LIMIT 50) INSERT INTO t SELECT v FROM r")
    monkeypatch.setattr(u, "MAX_ROWS", 10)
    with u.opened(path) as db:
        try:
            list(u.rows(db, "t", "SELECT v FROM t"))
        except u.UntrustedFileError as e:
            assert str(e) == "t has more than 10 rows: refused"
        else:
            raise AssertionError("50 rows read past a bound of 10")
    endless = "WITH RECURSIVE r(v) AS (SELECT 1 UNION ALL SELECT v + 1 FROM r) SELECT max(v) FROM r"
    started = time.monotonic()
    try:
        with u.opened(path, read_s=0.5) as db:
            db.execute(endless).fetchall()
    except u.UntrustedFileError as e:
        assert str(e) == "read for longer than 0 s: refused", e  # 0.5 s, said to the second
    else:
        raise AssertionError("an endless query ended")
    assert time.monotonic() - started < 60  # a generous bound: the query itself would never end


def test_the_nodes_summaries_refuse_a_start_that_is_not_a_whole_number_and_make_the_others(tmp_path):
    """SQLite takes 'soon' as 0 in ``end - start``: the kernel summary was made, its longest kernel
    a duration the file never held. Now that summary is not made, naming the table; the others are."""
    export = tmp_path / "rank0.sqlite"
    shutil.copy(RECORDED_RANK, export)
    plant(export, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = 'soon' WHERE rowid = 3")
    failed = summarized(export, tmp_path / "out")
    assert failed == {"cuda_gpu_kern_sum": "CUPTI_ACTIVITY_KIND_KERNEL: a start or end that is not an integer"}, failed
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cuda_api_sum.csv", "nvtx_sum.csv"]
