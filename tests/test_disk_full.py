"""A profiler that says the disk is full is stopped by the agent, never waited on. nsys 2025.3 on an H200,
its TMPDIR on a 64 MiB tmpfs that filled mid-run, threw WriteStreamException ("Is the disk full? ... Free
size to caller: 0 bytes") and never exited (tests/fixtures/launchers-h200/3-disk-full.txt): fleet waited on
it until the check's own timeout. Here the stand-in nsys replays that on a real full tmpfs, and the agent
must end the run itself: profiler-error, the report truncated, every process it started gone."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import completeness, exitcodes, outcome
from fleet.agent.messages import ProfileResult
from fleet.agent import procs, profiler, reports, run, stops, wire, workload
from fleet.store.manifest import HostEntry
from tests.conftest import fleet_json, run_fleet
from tests.harness.agent_node import Node, local_inventory_node

RECORDED = Path(__file__).parent / "fixtures" / "launchers-h200" / "3-disk-full.txt"
# Fills a file on the tmpfs until not one byte more fits, as the recorded check's `dd` did.
FILLER = """
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT, 0o600)
for block in (1 << 16, 4096, 1):
    try:
        while True:
            os.write(fd, b"\\0" * block)
    except OSError:
        pass
"""
AGENT_BOUND = 60  # seconds: the agent's own bound for this case is a few; a wait on nsys is for ever


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie that nobody reaped yet has ended too)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_nsys_disk_full_line_as_recorded_is_found_among_its_error_lines():
    lines = workload.ErrorLines("nsys")
    lines.feed("stderr", RECORDED.read_bytes())
    kept = lines.close()
    assert lines.disk_full.startswith("[QuadDCommon::tag_message*] = Is the disk full? Total size: 67108864 bytes")
    assert lines.disk_full in kept and any("WriteStreamException" in k or "Throw in function" in k for k in kept)
    workload_said = workload.ErrorLines("nsys")
    workload_said.feed("stdout", b"training: Is the disk full? no, 3 GiB free\n")  # not nsys's own line
    assert workload_said.disk_full is None


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (util-linux)")
@pytest.mark.parametrize("variant", ["hangs", "dies-on-sigterm"])
def test_nsys_hanging_on_a_full_disk_is_ended_by_the_agent_with_its_workload(tmp_path, variant):
    """Whether nsys heeds SIGTERM there was not recorded: hanging on, or dying of it while what its
    workload left runs on in a session of its own, the run ends and everything it started is gone."""
    node = Node(tmp_path)
    small = tmp_path / "small"  # a 4 MiB tmpfs, mounted in a mount namespace of the agent's own
    small.mkdir(mode=0o700)
    mount = ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size=4m,mode=0700 fleet-test "$0" && exec "$@"', str(small)]
    (tmp_path / "filler.py").write_text(FILLER)
    nsys_pid, left_pid = tmp_path / "nsys.pid", tmp_path / "left.pid"
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)  # not the agent's: left alone
    # The workload leaves a process of its own running, fills the disk and ends; nsys then hangs. It lives
    # 3 s first, so that the agent has looked at what nsys started (every LOOK_EVERY seconds), even on a
    # machine the suite's other workers load (1 s was not always enough there).
    script = (f"echo $PPID > {nsys_pid}; sleep 600 </dev/null & echo $! > {left_pid}; sleep 3; "
              f"{sys.executable} {tmp_path / 'filler.py'} {small}/filler; exit 0")
    agent, workload_pid = node.start(script, small, prefix=mount, env={"STANDIN_NSYS_FULL_DISK": variant})
    try:
        out, err = agent.communicate(timeout=AGENT_BOUND)
    except subprocess.TimeoutExpired:
        os.killpg(agent.pid, signal.SIGKILL)
        for pid in (int(nsys_pid.read_text()), int(left_pid.read_text())):
            os.kill(pid, signal.SIGKILL)
        bystander.kill()
        raise AssertionError("the agent waited on an nsys that said the disk is full: " + "".join(agent.communicate()))
    started = [int(nsys_pid.read_text()), workload_pid, int(left_pid.read_text())]
    try:
        assert agent.returncode != 0
        [result] = wire.answers(out, "profile")
        assert not wire.problems(result, "profile"), wire.problems(result, "profile")
        assert result["status"] == "profiler-error", (result, err)
        status, why = outcome.of_result(ProfileResult.read(result), [], tool="nsys")
        assert status == outcome.HostStatus.PROFILER_ERROR and "Is the disk full?" in why
        assert "free space" in why and "report_dir" in why
        assert any(e.startswith("[QuadDCommon::tag_message*] = Is the disk full?") for e in result["profiler_errors"])
        assert "Free size to caller: 0 bytes" in err  # the stand-in saw this tmpfs full, as the recording's was
        assert result["reports"] == [] and any("left unfinished" in n for n in result["notes"]), result["notes"]
        entry = HostEntry(host="h01", status=status, missing_why=why, result=result, reports=[])
        assert completeness.classify(entry).cls == completeness.TRUNCATED
        assert outcome.run_status([status]) == "failed" and exitcodes.for_hosts([status]) != exitcodes.OK
        assert all(gone(pid) for pid in started), [(p, gone(p)) for p in started]
        assert not gone(bystander.pid)
    finally:
        for pid in [p for p in started if not gone(p)]:  # what the agent left, should it have
            os.kill(pid, signal.SIGKILL)
        bystander.kill()
        bystander.wait()


@pytest.mark.skipif(not shutil.which("unshare"), reason="needs unshare (util-linux)")
def test_fleet_profile_ends_a_run_whose_disk_filled_and_says_what_to_do(tmp_path):
    """`fleet profile` on this machine, its report folder a 4 MiB tmpfs that the workload fills: the
    run ends by itself, profiler-error, truncated, exit status non-zero; nothing catalogued complete."""
    small = tmp_path / "small"
    small.mkdir(mode=0o700)
    node = local_inventory_node(tmp_path, report_dir=small)
    env, store = node["env"], node["store"]
    (tmp_path / "filler.py").write_text(FILLER)
    nsys_pid = tmp_path / "nsys.pid"
    mount = ("unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs -o size=4m,mode=0700 fleet-test "$0" && exec "$@"', str(small))
    try:
        out = run_fleet("profile", "--hosts", "gpu01", "--store", str(store), "--", "sh", "-c",
                        f"echo $PPID > {nsys_pid}; sleep 1; {sys.executable} {tmp_path / 'filler.py'} {small}/filler",
                        env=env, prefix=mount, timeout=AGENT_BOUND)
    finally:
        if nsys_pid.exists() and not gone(int(nsys_pid.read_text())):  # what fleet left, should it have
            os.kill(int(nsys_pid.read_text()), signal.SIGKILL)
    said = out.stdout + out.stderr
    assert out.returncode == exitcodes.FAILED, said
    assert "gpu01: profiler-error: the profiler said the disk is full ([QuadDCommon::tag_message*] = Is the disk " \
           "full?" in out.stderr, said
    assert "free space where the run's folder" in out.stderr and "reports: 1 truncated" in said
    assert gone(int(nsys_pid.read_text()))
    [run_id] = re.findall(r"^run (\S+) failed: ", out.stdout, re.M)
    shown = fleet_json(run_fleet("reports", "show", "--store", str(store), "--json", run_id).stdout)
    [host] = shown["hosts"]
    assert shown["status"] == "failed" and host["status"] == "profiler-error"
    assert host["reports"] == []  # the unfinished data stays on the node, named in a note, never a report


# A "profiler" that prints nsys's recorded disk-full line and then ignores SIGTERM, as the stand-in does.
HANGS = """
import signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
print([line for line in open(sys.argv[1]) if "Is the disk full?" in line][0], file=sys.stderr, end="", flush=True)
time.sleep(30)  # the test's bound: an agent still waiting then would see it end, and fail
"""


class Plan:
    """The little of a plan that run_profiler reads."""

    def __init__(self, argv, output=""):
        self.env, self.timeout, self.tool, self._argv, self.output, self.launcher = {}, None, "nsys", argv, output, ()
        self.command = self
        self.window, self.session, self.nsys = None, None, None  # no window, no named session

    def argv(self):
        return self._argv

    def stopped_by_nsys(self):
        return False


@pytest.mark.services  # runs the agent and the stand-in nsys as processes
def test_a_profiler_that_outlives_sigkill_is_not_waited_on_for_ever(tmp_path, monkeypatch):
    """A process stuck in the kernel outlives SIGKILL; none can be made here at will, so the kill is
    left unsent (the process stands for one that SIGKILL did not end) and the agent must still return."""
    monkeypatch.setattr(stops, "DISK_FULL_KILL_AFTER", 0.5)
    monkeypatch.setattr(profiler, "KILLED_WAIT", 1.0)
    monkeypatch.setattr(procs.Started, "kill", lambda self, reaped=False: None)
    monkeypatch.setattr(workload, "disk_is_full", lambda *folders: True)  # the disk stands for full
    (tmp_path / "hangs.py").write_text(HANGS)
    relay, pids = profiler.Relay("nsys"), []
    monkeypatch.setattr(procs.Started, "look", lambda self, now: pids.append(self.pid))
    try:
        ran = profiler.run_profiler(Plan([sys.executable, str(tmp_path / "hangs.py"), str(RECORDED)]), relay,
                                    lambda: False)
        assert ran.left and ran.exit_status is None and ran.why_stopped.startswith("after the profiler said the disk")
        assert relay.errors.disk_full and not gone(pids[0])  # it was left running, and the run went on
    finally:
        if pids and not gone(pids[0]):
            os.kill(pids[0], signal.SIGKILL)


@pytest.mark.services  # runs the agent and the stand-in nsys as processes
def test_a_profiler_left_after_sigkill_is_a_profiler_error_said_once(tmp_path, monkeypatch):
    """A profiler that ignored its stops at its time limit and outlived SIGKILL (the kill left unsent, as
    above): its session was cut, so the run is a profiler-error, said in one reason, and its report (none
    here) truncated; never "exited None", never helpers said to hold its output."""
    monkeypatch.setattr(stops, "STOP_GRACE", 0.2)
    monkeypatch.setattr(stops, "KILL_AFTER", 0.5)
    monkeypatch.setattr(profiler, "KILLED_WAIT", 1.0)
    monkeypatch.setattr(procs.Started, "kill", lambda self, reaped=False: None)
    (tmp_path / "hangs.py").write_text(HANGS)
    relay, pids = profiler.Relay("nsys"), []
    monkeypatch.setattr(procs.Started, "look", lambda self, now: pids.append(self.pid))
    plan = Plan([sys.executable, str(tmp_path / "hangs.py"), str(RECORDED)], str(tmp_path / "h01.nsys-rep"))
    plan.timeout, plan.report_dir = 0.5, str(tmp_path)
    try:
        ran = profiler.run_profiler(plan, relay, lambda: False)
        assert ran.left and not ran.lingering and not gone(pids[0])
        assert relay.errors.disk_full is None  # its line, on a disk with room, is not believed
        result = {"notes": [], "reasons": [], "reports": []}
        run.record_run(plan, result, ran, None, relay)
        assert run.settle(plan, result, ran, relay.errors.disk_full) != 0
    finally:
        if pids and not gone(pids[0]):
            os.kill(pids[0], signal.SIGKILL)
    assert result["status"] == "profiler-error" and len(result["reasons"]) == 1, result
    assert "SIGKILL" in result["reasons"][0] and "None" not in result["reasons"][0]
    assert not any("still hold its output" in n for n in result["notes"]), result["notes"]
    entry = HostEntry(host="h01", status="profiler-error", result=result, reports=[])
    assert completeness.classify(entry).cls == completeness.TRUNCATED


@pytest.mark.services  # runs the agent and the stand-in nsys as processes
def test_a_workload_printing_the_disk_full_line_on_a_roomy_disk_is_not_stopped(tmp_path):
    """The workload writes to nsys's pipes: nsys's recorded disk-full line from it, with room on the disk,
    stops nothing; the run goes on to its end, ok, its report whole."""
    node = Node(tmp_path)
    script = f"grep -m1 'Is the disk full?' {RECORDED} >&2; sleep 2; exit 0"
    agent, _ = node.start(script, tmp_path / "reports")
    entry, said = node.entry(agent)
    assert entry.result["status"] == "ok" and entry.result["exit_status"] == 0, said
    assert not entry.result["stopped"], entry.result["notes"]
    [report] = entry.result["reports"]
    assert "truncated" not in report, report
    assert completeness.classify(entry).cls == completeness.COMPLETE


def test_a_profiler_error_with_a_report_on_a_roomy_disk_is_truncated_never_complete(tmp_path):
    """The disk-full line anchored by the Relay marks every report of the run cut, though its folder has
    room now (a quota, or space freed by the kill) and the tail no longer holds the words; and a
    profiler-error is never counted complete, whatever its reports say."""
    line = workload.ErrorLines("nsys")
    line.feed("stderr", RECORDED.read_bytes())
    report = tmp_path / "h01-1.nsys-rep"
    report.write_bytes(b"x" * 100)
    plan = Plan([], str(tmp_path / "h01-%p"))
    plan.nsys = None
    notes = []
    [entry] = reports.collect(plan, b"Generating ...\n", notes, disk_full=line.disk_full)
    assert "Is the disk full?" in entry["truncated"], (entry, notes)
    uncut = dict(entry)
    del uncut["truncated"]
    result = {"status": "profiler-error", "reasons": ["the profiler said the disk is full"], "reports": [uncut]}
    host = HostEntry(host="h01", status="profiler-error", result=result, reports=[])
    assert completeness.classify(host).cls == completeness.TRUNCATED
    assert completeness.run_lines([host])[0] == "reports: 1 truncated"
