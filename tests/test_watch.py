"""The run watch, through the agent: real processes, the stand-in profilers replaying what the
real ones did on an H200, the simulated NVML following its scenario live. Before, the GPU was
looked at once, before the profiler started: a tenant arriving 10 s into an ncu run was profiled
beside for 33 s and the run said ok; a workload that exited 3 or died by SIGSEGV was ok too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet.agent import locks, run, wire
from tests.harness import fakenvml
from tests.harness.sshd import ensure_user
from tests.harness.procs import TENANT_USER, spawn, stop

STANDINS = Path(__file__).parent / "standins"
WORKLOAD_MEM = 900 << 20

# Probe, plan and run the agent in one process of its own: it loads NVML (the fake, through
# LD_LIBRARY_PATH) and installs signal handlers.
AGENT = """
import json, sys
from fleet.agent import node, run
from fleet.plan import LabPart, ProfileRequest, plan
from fleet.policy import NodeState
a = json.loads(sys.argv[1])
state = NodeState.read(node.probe({"tools": a["tools"], "report_dir": a["report_dir"], "environment_check": False}))
p = plan("h01", state, ProfileRequest(tool=a["tool"], command=tuple(a["command"]), run_id="r", lab=LabPart(gpus=(0,)),
         allow_own=a.get("allow_own", False), gpu_metrics=a.get("gpu_metrics", False)))
if p.status != "ok":
    print("PLAN REFUSED", p.reasons); sys.exit(2)
sys.exit(run.main({"plan": p.to_json()}))
"""


class Node:
    """A node of one simulated H200 whose scenario a test rewrites while the agent runs."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path
        self.scenario = tmp_path / "gpus.txt"
        self.gpu: dict = {"index": 0}
        self.write()
        self.env = {**os.environ, **fakenvml.env(fakenvml.build(tmp_path / "lib"), self.scenario),
                    "PATH": f"{STANDINS}:{os.environ['PATH']}"}

    def write(self, **changes):
        self.gpu.update(changes)
        fakenvml.write_scenario(self.scenario, {"gpus": [self.gpu]})

    def start(self, tool: str, seconds: float, **request) -> tuple[subprocess.Popen, int]:
        """The agent profiling a workload that sleeps ``seconds``; its pid, once it runs (the
        workload is then on the GPU, as on a real one: listed, holding memory)."""
        pidfile = self.dir / "workload.pid"
        args = {"tool": tool, "report_dir": str(self.dir / "reports"),
                "tools": {"nsys": str(STANDINS / "nsys"), "ncu": str(STANDINS / "ncu")},
                "command": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep {seconds}"], **request}
        agent = subprocess.Popen([sys.executable, "-c", AGENT, json.dumps(args)], env=self.env, cwd=self.dir,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text().strip():
                pid = int(pidfile.read_text())
                self.write(processes=[{"pid": pid, "mem": WORKLOAD_MEM, "sm": 0}])
                return agent, pid
            assert agent.poll() is None, agent.communicate()
            time.sleep(0.05)
        raise AssertionError("the workload never started")

    def result(self, agent: subprocess.Popen, timeout: float = 60) -> tuple[dict, str]:
        out, err = agent.communicate(timeout=timeout)
        [result] = wire.answers(out, "profile")
        return result, out + err


@pytest.fixture
def node(tmp_path):
    return Node(tmp_path)


@pytest.fixture
def tenant():
    ensure_user(TENANT_USER)
    proc = spawn(TENANT_USER, ["sleep", "300"])
    yield proc
    stop([proc])


def arrive(node: Node, workload: int, *others: dict) -> float:
    node.write(processes=[{"pid": workload, "mem": WORKLOAD_MEM, "sm": 0}, *others])
    return time.monotonic()


def test_ncu_yields_to_another_users_process_arriving_mid_run(node, tenant):
    agent, workload = node.start("ncu", 60)
    time.sleep(1.5)  # the watch has seen the GPU with the workload alone on it
    arrived = arrive(node, workload, {"pid": tenant.pid, "mem": 1_100 << 20, "sm": 0})
    result, said = node.result(agent)
    ended = time.monotonic()
    assert result["status"] == "yielded", said
    n = result["newcomer"]
    assert (n["pid"], n["user"], n["used_memory"], n["unseen"], n["gpu"]) == (tenant.pid, TENANT_USER, 1_100 << 20,
                                                                           False, 0)
    assert 1.0 < n["appeared_s"] and n["last_clear_s"] < n["appeared_s"] <= n["released_s"]
    assert n["overlap_s"] == pytest.approx(n["released_s"] - n["appeared_s"], abs=0.01) and n["overlap_s"] < 2.0
    assert ended - arrived < 10  # not the workload's 60 s: ncu was stopped
    assert "SIGINT" in n["action"] and "report kept" in n["action"]
    assert "SIGKILL" not in n["action"]
    # ncu's group SIGINT, as recorded through the agent: ncu ends by it, what was profiled kept;
    # of the workload nothing is known then (ncu, not the workload, ended by the signal)
    assert result["reports"] and result["reports"][0]["path"].endswith(".ncu-rep")
    assert result["workload"] == {"exit_status": None, "signal": None} and result["exit_status"] < 0
    assert result["stopped"] is True
    seen = {p["pid"]: p for s in result["conditions"]["samples"] for p in s["processes"]}
    assert workload in seen, (workload, result["conditions"])
    assert tenant.pid in seen, result["conditions"]
    assert seen[workload]["own"] is True and seen[tenant.pid]["own"] is False
    assert seen[tenant.pid]["user"] == TENANT_USER


def test_ncu_yields_to_memory_no_listed_process_explains(node):
    agent, workload = node.start("ncu", 60)
    time.sleep(1.5)
    node.write(mem_used=WORKLOAD_MEM + (1_500 << 20))  # someone the lists hide (another PID namespace)
    result, said = node.result(agent)
    assert result["status"] == "yielded", said
    n = result["newcomer"]
    assert n["unseen"] is True and n["pid"] is None and n["used_memory"] == 1_500 << 20
    assert "not visible from here" in n["why"] and n["overlap_s"] < 2.0


def test_the_users_own_process_under_allow_own_is_no_newcomer(node):
    own = spawn(None, ["sleep", "300"])  # the same user, not the workload's
    try:
        agent, workload = node.start("ncu", 4, allow_own=True)
        time.sleep(1.5)
        arrive(node, workload, {"pid": own.pid, "mem": 600 << 20, "sm": 0})
        result, said = node.result(agent)
    finally:
        stop([own])
    assert result["status"] == "ok" and result["newcomer"] is None, said
    assert result["workload"] == {"exit_status": 0, "signal": None} and result["profiler_errors"] == []
    seen = {p["pid"]: p["own"] for s in result["conditions"]["samples"] for p in s["processes"]}
    assert seen == {workload: True, own.pid: False}


def test_the_users_own_process_without_allow_own_is_a_newcomer(node):
    own = spawn(None, ["sleep", "300"])
    try:
        agent, workload = node.start("ncu", 60)
        time.sleep(1.5)
        arrive(node, workload, {"pid": own.pid, "mem": 600 << 20, "sm": 0})
        result, said = node.result(agent)
    finally:
        stop([own])
    assert result["status"] == "yielded" and result["newcomer"]["pid"] == own.pid, said
    assert "--allow-own" in result["newcomer"]["why"]


def test_nsys_with_gpu_metrics_yields_through_its_session_and_the_workload_goes_on(node, tenant):
    """As nsys 2025.3 did on an H100 test machine (tests/fixtures/nsys-sessions-h100): `nsys stop
    --session` ends the collection alone, the report keeps the kernels until then, and the
    workload runs to its own end; SIGTERM, as before, ended it and lost every kernel."""
    node.env["STANDIN_IMPORT_SECONDS"] = "5"  # the stop writes the report for 5 s: the collection ended before
    agent, workload = node.start("nsys", 9, gpu_metrics=True)
    time.sleep(1.5)
    lock = locks.GPULock("GPU-fa4e0000-0000-0000-0000-000000000000", os.environ["FLEET_LOCK_DIR"])
    assert not lock_is_free(lock)  # the run holds the GPU's counter lock while nsys samples its metrics
    arrived = arrive(node, workload, {"pid": tenant.pid, "mem": 1_100 << 20, "sm": 0})
    deadline = arrived + 6.0  # the yield's own time is the result's to say (overlap_s), not this wait's
    while not lock_is_free(lock) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agent.poll() is None and lock_is_free(lock)  # given back at the yield, the workload running on
    result, said = node.result(agent)
    ended = time.monotonic()
    assert result["status"] == "yielded", said
    n = result["newcomer"]
    assert (n["pid"], n["user"]) == (tenant.pid, TENANT_USER)
    # Given back when nsys said the collection was over (its session's state), not when the stop returned.
    assert n["appeared_s"] <= n["released_s"] and n["overlap_s"] < 5.0, n
    assert "session" in n["action"] and "went on" in n["action"] and "SIGTERM" not in n["action"], n["action"]
    # The workload was not stopped: it ran its 9 s and exited 0, nsys with it.
    assert result["stopped"] is False and result["workload"] == {"exit_status": 0, "signal": None}, said
    assert ended - arrived > 3.0
    assert not [note for note in result["notes"] if "SIGTERM" in note], result["notes"]
    [report] = [r for r in result["reports"] if r["path"].endswith(".nsys-rep")]
    written = json.loads(Path(report["path"]).read_text())
    assert written["kernels"] and written["stopped_by_session"], written  # the kernels until the stop are kept
    assert written["duration"] < 9.0
    assert "Generated:" in said  # what `nsys stop` printed, relayed


def lock_is_free(lock: locks.GPULock) -> bool:
    if lock.acquire():
        lock.release()
        return True
    return False


def test_a_session_stop_that_fails_falls_back_to_sigterm_and_says_so(node, tenant, tmp_path):
    """An nsys whose `stop` stops nothing (exit 0, nothing said, as the real one answered for a name
    it did not have): fleet sends SIGTERM after all, and the result says why."""
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "nsys").write_text(f"#!/bin/sh\n[ \"$1\" = stop ] && exit 0\nexec {STANDINS / 'nsys'} \"$@\"\n")
    (shim / "nsys").chmod(0o755)
    agent, workload = node.start("nsys", 30, gpu_metrics=True, tools={"nsys": str(shim / "nsys"),
                                                                         "ncu": str(STANDINS / "ncu")})
    time.sleep(1.5)
    arrive(node, workload, {"pid": tenant.pid, "mem": 1_100 << 20, "sm": 0})
    result, said = node.result(agent)
    assert result["status"] == "yielded", said
    assert "SIGTERM" in result["newcomer"]["action"] and result["stopped"] is True
    [note] = [n for n in result["notes"] if "nsys stop --session" in n]
    assert "exit status 0 and no report written" in note and "SIGTERM instead" in note


def test_nsys_trace_is_not_stopped_and_notes_the_newcomer(node, tenant):
    agent, workload = node.start("nsys", 4)
    time.sleep(1.5)
    arrive(node, workload, {"pid": tenant.pid, "mem": 1_100 << 20, "sm": 0})
    result, said = node.result(agent)
    assert result["status"] == "ok" and result["newcomer"] is None and result["stopped"] is False, said
    assert result["workload"] == {"exit_status": 0, "signal": None}
    [note] = [n for n in result["notes"] if "newcomer" in n]
    assert f"pid {tenant.pid} ({TENANT_USER}" in note and "shared" in note
    users = {p["user"] for s in result["conditions"]["samples"] for p in s["processes"]}
    assert TENANT_USER in users


def test_conditions_are_recorded_through_the_run(node):
    node.write(power=None, sm_clock=1500, reasons=0)  # as under ncu's --clock-control base; no power figure
    agent, _ = node.start("ncu", 3)
    result, said = node.result(agent)
    c = result["conditions"]
    assert c["gpus"] == [{"index": 0, "uuid": "GPU-fa4e0000-0000-0000-0000-000000000000", "name": "NVIDIA H200",
                          "pci_bus_id": "00000000:19:00.0"}]
    assert 3 <= len(c["samples"]) <= 8 and c["interval_s"] == 1.0, c
    first, last = c["samples"][0], c["samples"][-1]
    assert first["t"] < 0.5 and last["t"] > 2.5
    assert {k: first[k] for k in ("sm_clock_mhz", "mem_clock_mhz", "throttle", "temperature_c")} == {
        "sm_clock_mhz": 1500, "mem_clock_mhz": 3201, "throttle": [], "temperature_c": 36}
    assert "power_w" not in first  # NOT_SUPPORTED is left out, never fatal


@pytest.mark.parametrize("tool,ends,workload,error", [
    ("ncu", "exit 3", {"exit_status": 3, "signal": None}, "==ERROR== The application returned an error code (3)."),
    ("ncu", "kill -SEGV $$", {"exit_status": 11, "signal": None},
     "==ERROR== The application returned an error code (11)."),
    ("nsys", "exit 3", {"exit_status": 3, "signal": None}, None),
    ("nsys", "kill -SEGV $$", {"exit_status": None, "signal": "SIGSEGV"}, None),
])
def test_the_workloads_own_end_and_the_profilers_errors_are_recorded(tmp_path, tool, ends, workload, error):
    node = Node(tmp_path)
    agent = subprocess.Popen([sys.executable, "-c", AGENT, json.dumps({
        "tool": tool, "report_dir": str(tmp_path / "reports"), "command": ["sh", "-c", f"sleep 0.3; {ends}"],
        "tools": {"nsys": str(STANDINS / "nsys"), "ncu": str(STANDINS / "ncu")}})],
        env=node.env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    result, said = node.result(agent)
    assert result["workload"] == workload, said
    assert result["profiler_errors"] == ([error] if error else [])
    assert result["reports"]  # kept, whatever became of the workload
    if tool == "nsys" and workload["signal"]:
        assert any("killed by SIGSEGV" in n and "died with the process" in n for n in result["notes"]), result["notes"]
