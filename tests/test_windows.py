"""Windows of a long job, through the real command line: `--window START:DURATION` has nsys collect
then (its --delay, --duration and --kill none), write its report and exit, and the workload goes on;
fleet stays with it to its end, or with `--detach` leaves it running, its output in the run's folder.

fleet runs the agent on this machine (``ansible_connection=local``) with the simulated NVML and the
stand-in nsys, which replays what nsys 2025.3 did on an H100 test machine for such a window
(tests/fixtures/nsys-sessions-h100/delay-duration: nsys exited at 13.3 s of a 20 s workload, its
report holding the window's kernels, and the workload ran to its end).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import exitcodes
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness import fakenvml
from tests.harness.agent_node import local_inventory_node


@pytest.fixture
def node(tmp_path):
    return local_inventory_node(tmp_path)


def profile(node, *args: str):
    return run_fleet("profile", "--hosts", "gpu01", "--store", str(node["store"]), *args, env=node["env"])


def the_report(host: dict) -> dict:
    """What the stand-in nsys wrote (a JSON document): the kernels it collected, the window's end."""
    [report] = [r for r in host["reports"] if r["stored"].endswith(".nsys-rep")]
    assert report["verified"], report
    return json.loads(Path(report["stored"]).read_text())


def test_a_window_keeps_its_kernels_and_the_workload_runs_on_to_its_own_end(node):
    out = profile(node, "--window", "1:1", "--json", "--", "sh", "-c", "sleep 3; echo after the window; exit 0")
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    assert host["status"] == "ok", host
    written = the_report(host)
    assert written["kernels"] and written["window_ended"] and written["duration"] < 3.0, written
    assert "after the window" in out.stderr  # the workload's own line, after nsys had gone, relayed
    assert host["result"]["workload"] == {"exit_status": 0, "signal": None}
    [note] = [n for n in host["result"]["notes"] if "--window" in n]
    assert note.startswith("nsys collected 1s after 1s (--window) and wrote its report; the workload went on")
    assert note.endswith("and ended by itself (exit status 0)")
    assert "--delay=1" in host["plan"]["argv"] and "--duration=1" in host["plan"]["argv"]
    assert "--kill=none" in host["plan"]["argv"]


def test_a_helper_holding_the_output_after_the_workload_ended_does_not_hold_fleet(node):
    """The workload ends 2 s in, leaving a helper of its own session (setsid) that keeps its output
    open for 60 s: fleet waits for the workload, not for every holder of its pipes."""
    helper = node["dir"] / "helper.pid"
    try:
        out = run_fleet("profile", "--hosts", "gpu01", "--store", str(node["store"]), "--window", "0:1", "--",
                        "sh", "-c", f"setsid sh -c 'echo $$ > {helper}; exec sleep 60' & sleep 2",
                        env=node["env"], timeout=45)
        assert out.returncode == 0, out.stderr
        assert "and ended by itself (exit status 0)" in out.stdout, out.stdout
    finally:
        if helper.exists():
            try:
                os.kill(int(helper.read_text()), signal.SIGKILL)  # the test's own helper, by its pid
            except ProcessLookupError:
                pass


def test_a_workload_that_fails_after_its_window_fails_the_run(node):
    out = profile(node, "--window", "0:1", "--", "sh", "-c", "sleep 2; exit 3")
    assert out.returncode == exitcodes.WORKLOAD_FAILED, out.stdout + out.stderr
    assert "gpu01: workload-failed: the workload exited 3" in out.stderr


def test_a_workload_that_ends_within_its_window_is_said_by_nsys_s_exit_status(node):
    out = profile(node, "--window", "0:5", "--json", "--", "sh", "-c", "sleep 1; exit 3")
    assert out.returncode == exitcodes.WORKLOAD_FAILED, out.stdout + out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    assert host["result"]["workload"] == {"exit_status": 3, "signal": None}
    assert "the workload ended within the window (--window 0:5)" in host["result"]["notes"]


def test_detach_leaves_the_workload_running_with_its_output_in_the_run_s_folder(node):
    out = profile(node, "--window", "0:1", "--detach", "--json", "--",
                  "sh", "-c", "echo its-first-line; sleep 3; echo its-last-line")
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    running = host["result"]["workload"]["running"]
    pids, output = running["pids"], Path(running["output"])
    try:
        assert host["status"] == "ok" and pids and the_report(host)["kernels"], host
        assert all(Path(f"/proc/{pid}").exists() for pid in pids)  # fleet has answered; the workload runs on
        assert output.parent == Path(host["plan"]["report_dir"]) and output.name == "gpu01.workload.out"
        [note] = [n for n in host["result"]["notes"] if "--detach" in n]
        assert re.search(rf"still runs \(--detach\): pid {pids[0]}\b.*its output in {re.escape(str(output))}$", note)
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pids[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert output.read_text().splitlines() == ["its-first-line", "its-last-line"]  # to its end, writing there
        assert "its-first-line" not in (out.stdout + out.stderr).splitlines()  # it went to the file, not through fleet
    finally:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # only if the test failed before it ended: the test's own process
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("args, said", [
    (("--window", "5"), "START:DURATION in whole seconds"),
    (("--window", "5:0"), "the duration more than 0"),
    (("--window", "\u00b2:5"), "START:DURATION in whole seconds"),  # a digit to str.isdigit, not to int()
    (("--window", "-1:5"), "START:DURATION in whole seconds"),
    (("--detach",), "--detach leaves a workload running after a window: give --window"),
    (("--window", "1:2", "--tool", "ncu"), "ncu cannot leave its workload"),
    (("--window", "1:2", "--timeout", "9"), "--timeout ends it: give one"),
    (("--window", "1:2", "-X", "--delay=3"), "-X --delay sets nsys's window too"),
])
def test_a_window_fleet_cannot_plan_is_refused_in_one_line_before_any_host(node, args, said):
    out = profile(node, *args, "--", "touch", str(node["dir"] / "ran"))
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) <= 3 and "Traceback" not in out.stderr  # click's usage lines at most
    assert not (node["dir"] / "ran").exists() and not node["store"].exists()


def test_on_slurm_detach_is_refused_for_now_before_any_job():
    out = run_fleet("profile", "--partition", "gpu", "--window", "1:2", "--detach", "--", "true")
    assert out.returncode == 2 and "--detach is for lab servers yet" in out.stderr, out.stderr


def test_on_slurm_a_window_is_for_srun_s_ranks_yet():
    out = run_fleet("profile", "--partition", "gpu", "--window", "1:2", "--launcher", "torchrun", "--dry-run", "--",
                    "torchrun", "--nproc-per-node", "2", "train.py")
    assert out.returncode == 2 and "--window on Slurm is for srun's ranks yet" in out.stderr, out.stderr


@contextlib.contextmanager
def left_running(node, script: str):
    """A run of ``script`` left running by --window 0:1 --detach: (fleet's answer, its pids), killed after."""
    out = profile(node, "--window", "0:1", "--detach", "--json", "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr
    doc = fleet_json(out.stdout)
    pids = doc["hosts"][0]["result"]["workload"]["running"]["pids"]
    try:
        yield doc, pids
    finally:
        kill_own(pids)


def kill_own(pids) -> None:
    """The test's own processes, by pid, where the test failed before they ended."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _left(node, *args):
    out = run_fleet("jobs", "--store", str(node["store"]), "--json", *args, env=node["env"])
    assert out.returncode == 0, out.stderr
    return fleet_json(out.stdout)["left_running"]


def test_fleet_jobs_shows_a_detached_workload_and_fleet_cancel_ends_it(node):
    with left_running(node, "echo started; sleep 60") as (doc, pids):
        [row] = _left(node)
        assert (row["run_id"], row["host"], row["pids"], row["state"]) == (doc["run_id"], "gpu01", pids, "running")
        table = run_fleet("jobs", "--store", str(node["store"]), env=node["env"])
        assert re.search(rf"{doc['run_id']}\s+gpu01\s+{pids[0]}\s+running\s+\S+gpu01\.workload\.out", table.stdout)
        said = run_fleet("cancel", doc["run_id"], "--store", str(node["store"]), env=node["env"])
        assert said.returncode == 0 and f"SIGTERM to pid {pids[0]}" in said.stdout, said.stdout + said.stderr
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pids[0]}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pids[0]}").exists()
        assert [r["state"] for r in _left(node)] == ["ended"]
        assert _left(node) == []  # a run whose workloads have all ended is no longer looked at


def test_a_pid_that_is_no_longer_the_workload_is_neither_shown_running_nor_stopped(node):
    with left_running(node, "sleep 60") as (doc, pids):
        [manifest] = node["store"].glob(f"*/*/{doc['run_id']}/manifest.json")
        recorded = json.loads(manifest.read_text())
        recorded["hosts"][0]["result"]["workload"]["running"]["started"][0] += 1  # as a later process of that pid
        manifest.write_text(json.dumps(recorded))
        said = run_fleet("cancel", doc["run_id"], "--store", str(node["store"]), env=node["env"])
        assert said.returncode == 0, said.stderr
        time.sleep(1)  # a SIGTERM sent would have ended `sleep` by now
        assert Path(f"/proc/{pids[0]}").exists()  # not that process: never signalled
        assert [r["state"] for r in _left(node)] == ["ended"]


def test_fleet_top_names_the_run_whose_workload_it_left_running(node):
    with left_running(node, "sleep 60") as (doc, pids):
        fakenvml.write_scenario(node["scenario"], {"gpus": [{"index": 0, "processes": [
            {"pid": pids[0], "used_memory": 1 << 30}, {"pid": os.getpid(), "used_memory": 1 << 30}]}]})
        env = {**node["env"], "FLEET_STORE": str(node["store"])}
        look = run_fleet("top", "gpu01", "--once", "--json", env=env)
        assert look.returncode == 0, look.stderr
        [gpu] = fleet_json(look.stdout.splitlines()[0])["gpus"]
        marked = {p["pid"]: p.get("left_running") for p in gpu["processes"]}
        assert marked == {pids[0]: doc["run_id"], os.getpid(): None}, gpu["processes"]
        table = run_fleet("top", "gpu01", "--once", env=env)
        assert f"(fleet run {doc['run_id']}, left running)" in table.stdout, table.stdout


def test_a_stop_after_the_window_is_fleet_s_stop_not_the_workload_s_failure(node):
    """SIGTERM to fleet once nsys has gone after its window: the workload fleet stayed with gets it
    (its process group), and the run says it was stopped, never that the workload failed."""
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--hosts", "gpu01", "--store", str(node["store"]),
                             "--window", "0:1", "--json", "--", "sh", "-c", "echo started; sleep 60"],
                            cwd=REPO, env={**os.environ, **node["env"]}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 30  # the window's report written: nsys gone, the workload followed
        while not list((node["dir"] / "reports").glob("*/gpu01-*.nsys-rep")):
            assert time.monotonic() < deadline and proc.poll() is None, "the window never ended"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    [host] = fleet_json(out)["hosts"]
    assert host["status"] == "ok" and host["result"]["stopped"], (host["status"], host["result"])
    assert host["result"]["workload"] == {"exit_status": None, "signal": "SIGTERM"}
    [note] = [n for n in host["result"]["notes"] if "(--window)" in n]
    assert note.endswith("and was stopped when fleet was told to stop (killed by SIGTERM)"), note
    # The report seen written, nsys may still be exiting when the SIGTERM comes: then fleet stops it
    # and the workload (its group) as for any run, else the workload alone; either is fleet's stop.
    assert re.search(r"the workload was stopped (after its window, )?when told to stop", " ".join(host["result"]["notes"]))
