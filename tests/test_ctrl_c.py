"""Ctrl-C's two choices, in a terminal (a pty here): leave the workload running, nsys alone stopping
its collection through its session (its report written, its kernels kept), or end both, as without
a terminal.

fleet runs the agent on this machine (``ansible_connection=local``) with the simulated NVML and the
stand-in nsys, whose `stop --session` replays what nsys 2025.3 did on an H100 test machine
(tests/fixtures/nsys-sessions-h100, profile-stop: the report written by the stop, with the kernels
until then, and the workload running on to its end).
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from fleet.cli.interrupt import QUESTION
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness.agent_node import local_inventory_node

WORKLOAD = "echo workload-started; sleep 4; echo workload-still-here; sleep 1; echo workload-at-its-end"


@pytest.fixture
def node(tmp_path):
    return local_inventory_node(tmp_path)


def _foreground() -> None:
    """In the child: a session of its own, the pty its controlling terminal, itself in the foreground."""
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """fleet profile --json with a pty for stdin and stderr (a user's terminal), stdout a pipe."""

    def __init__(self, node, *args: str, foreground: bool = True):
        self.master, slave = pty.openpty()
        env = {**os.environ, **node["env"], "NO_COLOR": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fleet", "profile", "--hosts", "gpu01", "--store", str(node["store"]), "--json",
             *args], stdin=slave, stderr=slave, stdout=subprocess.PIPE, cwd=REPO, env=env,
            preexec_fn=_foreground if foreground else os.setsid)
        os.close(slave)
        self.seen = b""

    def wait_for(self, text: str, within: float = 30) -> None:
        deadline = time.monotonic() + within
        while text.encode() not in self.seen:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.seen.decode(errors="replace")
            try:
                self.seen += os.read(self.master, 65536)
            except OSError:
                time.sleep(0.05)

    def answer(self, text: str) -> dict:
        os.write(self.master, text.encode() + b"\n")
        out, _ = self.proc.communicate(timeout=60)
        try:
            while chunk := os.read(self.master, 65536):
                self.seen += chunk
        except OSError:
            pass
        os.close(self.master)
        return fleet_json(out.decode())


def kill_left(pids) -> None:
    """The test's own processes, by pid, where the test failed before they ended."""
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def test_leave_stops_the_collection_alone_and_the_workload_runs_on(node):
    run = Terminal(node, "--", "sh", "-c", WORKLOAD)
    pids = []
    try:
        run.wait_for("workload-started")
        os.kill(run.proc.pid, signal.SIGINT)
        run.wait_for(QUESTION.strip())
        doc = run.answer("l")
        assert run.proc.returncode == 0 and doc["status"] == "complete", doc
        [host] = doc["hosts"]
        running = host["result"]["workload"]["running"]
        pids, output = running["pids"], Path(running["output"])
        assert host["status"] == "ok" and all(Path(f"/proc/{pid}").exists() for pid in pids), host
        [report] = [r for r in host["reports"] if r["stored"].endswith(".nsys-rep")]
        written = json.loads(Path(report["stored"]).read_text())
        assert report["verified"] and written["stopped_by_session"] and written["kernels"], written
        [note] = [n for n in host["result"]["notes"] if n.startswith("Ctrl-C:")]
        assert note.startswith("Ctrl-C: nsys stopped collecting (nsys stop of its session) and wrote its report, "
                               f"and the workload runs on: pid {pids[0]} (nsys, the workload below it), its output in ")
        assert output.parent == Path(host["plan"]["report_dir"]) and oct(output.stat().st_mode & 0o777) == "0o600"
        assert b"leaving the workloads running" in run.seen
        deadline = time.monotonic() + 30
        while "workload-at-its-end" not in output.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        lines = output.read_text().splitlines()  # then nsys's own "Collecting data...", at the workload's end
        assert lines.index("workload-still-here") < lines.index("workload-at-its-end"), lines
    finally:
        kill_left(pids)


def test_end_both_stops_nsys_and_the_workload_as_without_a_terminal(node):
    run = Terminal(node, "--", "sh", "-c", WORKLOAD)
    run.wait_for("workload-started")
    os.kill(run.proc.pid, signal.SIGINT)
    run.wait_for(QUESTION.strip())
    doc = run.answer("e")
    [host] = doc["hosts"]
    assert "running" not in (host["result"]["workload"] or {}), host
    assert b"stopping the profilers (SIGTERM)" in run.seen and b"workload-still-here" not in run.seen
    assert not [n for n in host["result"]["notes"] if n.startswith("Ctrl-C:")]


def test_ncu_has_nothing_to_leave_running_so_ctrl_c_does_not_ask(node):
    run = Terminal(node, "--tool", "ncu", "--", "sh", "-c", WORKLOAD)
    run.wait_for("workload-started")
    os.kill(run.proc.pid, signal.SIGINT)
    run.wait_for("stopping the profilers")
    run.answer("")
    assert QUESTION.strip().encode() not in run.seen


def test_the_drainer_reads_to_the_end_whatever_becomes_of_its_file():
    """A full disk under the run's file must not end the workload: its pipe keeps its reader."""
    from fleet.agent.window import DRAIN

    r, w = os.pipe()
    full = os.open("/dev/full", os.O_WRONLY)
    drainer = subprocess.Popen([sys.executable, "-I", "-c", DRAIN, str(full), str(r)], pass_fds=(full, r))
    os.close(full)
    os.close(r)
    for _ in range(64):
        os.write(w, b"x" * 65536)  # BrokenPipeError, had the drainer gone at its first failed write
    os.close(w)
    assert drainer.wait(timeout=30) == 0


def test_a_fleet_not_in_the_foreground_of_a_terminal_does_not_ask(node):
    """Its terminal is not its own (a job in the background, or started by a script): reading it would
    stop fleet (SIGTTIN), so a Ctrl-C ends both, as without a terminal."""
    run = Terminal(node, "--", "sh", "-c", WORKLOAD, foreground=False)
    run.wait_for("workload-started")
    os.kill(run.proc.pid, signal.SIGINT)
    run.wait_for("stopping the profilers")
    run.answer("")
    assert QUESTION.strip().encode() not in run.seen


def test_a_second_ctrl_c_after_leave_still_leaves_and_gather_marks_the_workload(node):
    """The second Ctrl-C leaves the node to finish on its own: it repeats the first one's choice (USR1),
    never a SIGTERM that would end the workload; `fleet gather` later brings the report home, and
    `fleet jobs` then finds the workload still running."""
    run = Terminal(node, "--", "sh", "-c", "echo workload-started; sleep 30")
    pids = []
    try:
        run.wait_for("workload-started")
        os.kill(run.proc.pid, signal.SIGINT)
        run.wait_for(QUESTION.strip())
        os.write(run.master, b"l\n")
        run.wait_for("leaving the workloads running")
        os.kill(run.proc.pid, signal.SIGINT)
        run.proc.communicate(timeout=60)
        assert run.proc.returncode == 130, run.seen.decode(errors="replace")
        [manifest] = node["store"].glob("*/*/*/manifest.json")
        run_id = manifest.parent.name
        deadline = time.monotonic() + 30
        while not list(Path(node["dir"], "reports", run_id).glob("gpu01.result.json")):
            assert time.monotonic() < deadline, "the agent left no result"
            time.sleep(0.2)
        gathered = run_fleet("gather", run_id, "--store", str(node["store"]), env=node["env"])
        assert gathered.returncode == 0, gathered.stdout + gathered.stderr
        jobs = fleet_json(run_fleet("jobs", "--store", str(node["store"]), "--json", env=node["env"]).stdout)
        [left] = jobs["left_running"]
        pids = left["pids"]
        assert (left["run_id"], left["state"]) == (run_id, "running"), left
    finally:
        kill_left(pids)
