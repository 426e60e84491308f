"""Every report says whether it is whole, from real processes through the agent: the stand-in nsys
replaying what nsys 2025.3 did on an H200, the simulated NVML naming who is on the GPU while the
agent runs. Before, a report of a driver whose GPU work ran in a worker it did not start, one of a
workload killed by a signal (no kernels), and one cut by a full disk were all "verified", and the
run "complete"."""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fleet import completeness, outcome
from fleet.agent import reports
from fleet.store.manifest import HostEntry
from tests.harness.agent_node import Node
from tests.harness.procs import spawn, stop

# Fills the disk once the report is being written (the stand-in importer creates it, then writes it
# $STANDIN_IMPORT_SECONDS later), leaving one page free, as a disk filled by someone else would.
FILLER = """
import glob, os, sys, time
run_dir = sys.argv[1]
while not glob.glob(os.path.join(run_dir, "*.nsys-rep")):
    time.sleep(0.02)
fd = os.open(os.path.join(os.path.dirname(run_dir), "filler"), os.O_WRONLY | os.O_CREAT, 0o600)
for block in (1 << 16, 4096):
    try:
        while True:
            os.write(fd, b"\\0" * block)
    except OSError:
        pass
os.ftruncate(fd, os.fstat(fd).st_size - 4096)
"""


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


def test_a_driver_whose_gpu_work_runs_in_a_worker_it_did_not_start_is_launcher_only(node, tmp_path):
    worker = spawn(None, ["sleep", "300"])  # started beforehand, by someone else: as raylet starts Ray's workers
    try:
        agent, driver = node.start("exec sleep 4", tmp_path / "reports")
        time.sleep(1.0)
        node.on_gpu(worker.pid)  # the driver asks it for work: the worker, not the driver, is on the GPU
        entry, said = node.entry(agent)
    finally:
        stop([worker])
    verdict = completeness.classify(entry)
    # verified and kept, but not "ok": the report is of a process that did none of the GPU work
    assert entry.status == "failed" and entry.reports and f"pid {worker.pid} (sleep, GPU 0) did" in entry.missing_why, said
    assert outcome.run_status([entry.status]) == "failed"
    assert verdict.cls == "launcher-only", (verdict, entry.result["conditions"])
    assert f"pid {worker.pid} (sleep, GPU 0)" in verdict.why and str(driver) not in verdict.why
    lines = completeness.run_lines([entry])
    assert lines[0] == "reports: 1 launcher-only"
    assert "profile the worker, not its driver" in lines[1]
    assert any(line.strip().startswith("whole:    launcher-only") for line in outcome.detail_lines(entry))
    assert entry.result["whose"]["user"] == "root" and entry.result["whose"]["host"] == "h01"


def test_the_worker_itself_wrapped_is_complete(node, tmp_path):
    agent, worker = node.start("exec sleep 3", tmp_path / "reports")
    node.on_gpu(worker)
    entry, said = node.entry(agent)
    assert completeness.classify(entry) == completeness.Verdict("complete"), said
    assert completeness.run_lines([entry]) == ["reports: 1 complete"]
    assert not any("whole:" in line for line in outcome.detail_lines(entry))
    phases = entry.result["phases"]  # the run's moments on the node, each after the one before it
    assert list(phases) == ["started", "checked", "profiler_ended", "collected", "summarized", "answered"], phases
    assert sorted(phases.values()) == list(phases.values()) and phases["profiler_ended"] >= 3, phases


def test_a_workload_killed_by_a_signal_on_the_gpu_leaves_an_empty_report(node, tmp_path):
    agent, workload = node.start("sleep 2; kill -SEGV $$", tmp_path / "reports")
    node.on_gpu(workload)
    entry, said = node.entry(agent)
    assert entry.status == "workload-failed" and "SIGSEGV" in entry.missing_why, said
    kernels = [s for s in entry.result["summaries"] if s["summary"] == "cuda_gpu_kern_sum"]
    assert kernels and kernels[0]["size"] == 0  # nsys keeps no kernel of a workload killed by a signal
    verdict = completeness.classify(entry)
    assert verdict.cls == "empty" and f"pid {workload} (sh, GPU 0)" in verdict.why
    lines = completeness.run_lines([entry])
    assert lines[0] == "reports: 1 empty" and "--timeout" in lines[1]


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (util-linux)")
def test_a_report_cut_by_a_full_disk_is_truncated_and_never_complete(node, tmp_path):
    small = tmp_path / "small"  # a 4 MiB tmpfs, mounted in a mount namespace of the agent's own
    small.mkdir(mode=0o700)
    mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size=4m,mode=0700 fleet-test "$0" && exec "$@"', str(small)]
    filler = tmp_path / "filler.py"
    filler.write_text(FILLER)
    pad = "x" * 9000  # the workload's command line is in the report: more than the page left free
    agent, _ = node.start(f"{sys.executable} {filler} {small}/r </dev/null >/dev/null 2>&1 & : {pad}",
                          small, prefix=mount, env={"STANDIN_IMPORT_SECONDS": "1"})
    entry, said = node.entry(agent)
    [report] = entry.result["reports"]
    assert 0 < report["size"] and "the disk filled" in report["truncated"], said
    assert entry.status not in ("ok", "workload-failed"), (entry.status, said)
    verdict = completeness.classify(entry)
    assert verdict.cls == "truncated" and "disk filled" in verdict.why
    assert outcome.run_status([entry.status]) != "complete"
    assert "TRUNCATED" in outcome.report_line(entry.reports[0])
    assert completeness.run_lines([entry])[0] == "reports: 1 truncated"


def test_a_rank_that_left_nothing_is_missing_and_counted_with_the_others(node, tmp_path):
    agent, worker = node.start("exec sleep 2", tmp_path / "reports")
    node.on_gpu(worker)
    whole, _ = node.entry(agent)
    gone = HostEntry(host="(no result)", status="missing", rank=3, missing_why="rank 3 left no result")
    assert completeness.classify(gone) == completeness.Verdict("missing", "rank 3 left no result")
    refused = HostEntry(host="h02", status="refused")
    assert completeness.classify(refused) is None  # nothing ran there: no report to judge
    assert completeness.run_lines([whole, gone, refused]) == ["reports: 1 complete, 1 missing"]



def test_a_failed_ray_driver_is_no_rank_and_never_counted_missing():
    """A Ray program that exits 3: its `(driver)` line says so, but it is not a rank and has no
    report of its own. It was counted `1 missing` beside its workers' complete reports."""
    from fleet.slurm.raygather import driver_entry, driver_failed
    from fleet.store.manifest import ReportEntry, SlurmInfo

    workers = [HostEntry(host="node1", status="ok", worker=f"Trainer trainer-{i} on node1, pid {100 + i}",
                         reports=[ReportEntry(stored=f"/s/worker-node1-{100 + i}.nsys-rep", status="complete",
                                              verified=True)]) for i in range(3)]
    [on_slurm] = driver_entry(SlurmInfo(spec={"launcher": "ray"}, job_exit=3), None)
    submitted = driver_failed("failed (`ray job submit` exited 1)")
    for driver in (on_slurm, submitted):
        assert driver.status == "workload-failed" and completeness.classify(driver) is None
        assert completeness.run_lines(workers + [driver]) == ["reports: 3 complete"]

def test_the_real_nsys_saying_the_disk_is_full_marks_its_report_truncated(tmp_path):
    # nsys 2025.3 on an H200, its run folder on a tmpfs that filled mid-run (it threw WriteStreamException)
    said = (Path(__file__).parent / "fixtures" / "launchers-h200" / "3-disk-full.txt").read_bytes()
    report = tmp_path / "h01-1.nsys-rep"
    report.write_bytes(b"x" * 100)
    assert reports.cut_short(str(report), b"Generating ...\n") is None  # room left, and nothing said
    cut = reports.cut_short(str(report), said)
    assert cut.startswith("the profiler said: ") and "Is the disk full?" in cut


def test_a_rank_whose_report_is_launcher_only_is_never_ok_even_beside_its_users_process_there_from_the_start():
    """On Slurm, an ordinary user's job beside another process of theirs on the GPU, there from the
    watch's first look: the summary said `3 launcher-only` while each rank said `ok`, the run
    `complete`, exit 0. One rule now gives the class and the status."""
    from fleet import exitcodes
    from fleet.slurm.run import rank_entry
    from fleet.store.manifest import ReportEntry

    theirs = {"pid": 4242, "user": "alice", "name": "python3", "own": False}
    samples = [{"gpu": 0, "processes": [theirs]} for _ in range(3)]  # on the GPU before and throughout the run
    entries = []
    for rank in range(3):
        res = {"status": "ok", "rank": rank, "slurm_node": "node1", "node": "node1", "exit_status": 0,
               "workload": {"exit_status": 0, "signal": None}, "whose": {"user": "alice", "rank": rank},
               "reports": [{"path": f"/r/node1/rank{rank}.nsys-rep", "size": 10, "sha256": "0" * 64}],
               "conditions": {"samples": samples}}
        report = ReportEntry(remote=f"/r/node1/rank{rank}.nsys-rep", stored=f"/s/rank{rank}.nsys-rep", size=10,
                             status="complete", verified=True)
        entries.append(rank_entry(res, [report], "nsys"))
    assert completeness.run_lines(entries)[0] == "reports: 3 launcher-only"
    assert [e.status for e in entries] == ["failed"] * 3, [(e.status, e.missing_why) for e in entries]
    assert "pid 4242 (python3, GPU 0) did (launcher-only)" in entries[0].missing_why
    assert outcome.run_status(e.status for e in entries) != "complete"
    assert exitcodes.for_hosts(e.status for e in entries) != exitcodes.OK
    # Under --allow-own (a lab host's plan says it) the user's own process there from the start is
    # theirs, beside a CPU-only workload: neither the class nor the status says launcher-only.
    allowed = replace(entries[0], status="ok", missing_why=None, plan={"watch": {"allow_own": True}})
    assert completeness.classify(allowed).cls == "complete"
    assert outcome.of_result(allowed.answer, allowed.reports, allow_own=completeness.allows_own(allowed.planned)) == \
        ("ok", None)


def test_a_run_without_a_report_is_cut_by_the_agents_unfinished_field_never_by_the_words_of_its_notes():
    """What the agent could not finish it says in the result's ``unfinished``; a note is prose for a
    person, and a note that says "unfinished" (a workload's name, a path) decides nothing."""
    said = "QdstrmImporter could not finish /r/w.qdstrm (exit 2): Qdstrm file is incomplete or invalid."
    answer = {"status": "ok", "reports": [], "notes": [said, "the workload unfinished-job.sh ended"]}
    prose = HostEntry(host="h01", status="failed", result=answer, reports=[])
    assert completeness.classify(prose).cls == completeness.MISSING
    told = HostEntry(host="h01", status="failed", result=dict(answer, unfinished=[said]), reports=[])
    assert completeness.classify(told) == completeness.Verdict(completeness.TRUNCATED, said)
