"""A lab run's agent started ahead of its plan (fleet/lab/ahead.py, BOOTSTRAP_AHEAD in
fleet/agent/bundle.py): it loads while fleet probes and plans, runs nothing until it is sent its
plan, and ends having done nothing when it is sent none, is stopped, or fleet goes away. Real
agent processes on this machine, with the simulated NVML and the stand-in nsys."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import agentcall
from fleet.agent import wire
from fleet.inventory.host import Host
from fleet.transport.local import LocalTransport
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness import fakenvml
from tests.harness.agent_node import STANDINS, local_inventory_node

# The plan the agent is sent: made on this machine as fleet would make it for gpu01, from the
# node's own probe (one simulated GPU, nobody on it).
PLAN = """
import json, sys
from fleet.agent import node
from fleet.plan import LabPart, ProfileRequest, plan
from fleet.policy import NodeState
a = json.loads(sys.argv[1])
state = NodeState.read(node.probe({"tools": {"nsys": a["nsys"]}, "report_dir": a["report_dir"],
                                   "environment_check": False}))
p = plan("gpu01", state, ProfileRequest(tool="nsys", command=tuple(a["command"]), run_id="r1",
                                         lab=LabPart(gpus=(0,))))
print(json.dumps(p.to_json()))
"""


@pytest.fixture
def node(tmp_path):
    scenario = fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [{"index": 0}]})
    env = {**os.environ, **fakenvml.env(fakenvml.build(tmp_path / "lib"), scenario),
           "PATH": f"{STANDINS}:{os.environ['PATH']}"}
    marker = tmp_path / "workload-ran"
    made = subprocess.run([sys.executable, "-c", PLAN, json.dumps({
        "nsys": str(STANDINS / "nsys"), "report_dir": str(tmp_path / "reports"),
        "command": ["sh", "-c", f"echo ran > {marker}"]})], env=env, cwd=REPO, capture_output=True,
        text=True, timeout=60, check=True)
    plan = json.loads(made.stdout)
    assert plan["status"] == "ok", plan
    return {"env": env, "plan": plan, "marker": marker, "dir": tmp_path}


def host(name: str = "gpu01") -> Host:
    return Host(name, {"ansible_python_interpreter": sys.executable}, (), "test")


def started_ahead(node) -> subprocess.Popen:
    argv, stdin = agentcall.agent_call_ahead(host(), "profile")
    agent = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, env=node["env"], cwd=node["dir"])
    agent.stdin.write(stdin)
    agent.stdin.flush()
    return agent


def plan_args(node) -> bytes:
    return agentcall.arguments({"mode": "profile", "plan": node["plan"], "context": {}})


def test_an_agent_started_ahead_runs_nothing_until_it_is_sent_its_plan(node):
    agent = started_ahead(node)
    time.sleep(1.5)  # loaded by now, and waiting: nothing of the workload has run
    assert agent.poll() is None and not node["marker"].exists()
    out, err = agent.communicate(plan_args(node), timeout=60)
    [result] = wire.answers(out.decode(), "profile")
    assert agent.returncode == 0 and result["status"] == "ok", (result, err.decode()[-2000:])
    assert node["marker"].read_text() == "ran\n"


def test_arguments_that_come_with_the_agent_at_once_are_read_whole(node):
    """Sent in one write with the agent (fleet planned before the node read its agent), the plan is
    in the agent's buffer, not lost past it."""
    argv, stdin = agentcall.agent_call_ahead(host(), "profile")
    done = subprocess.run(argv, input=stdin + plan_args(node), capture_output=True,
                          env=node["env"], cwd=node["dir"], timeout=60)
    [result] = wire.answers(done.stdout.decode(), "profile")
    assert result["status"] == "ok" and node["marker"].exists(), done.stderr.decode()[-2000:]


def test_an_agent_sent_no_plan_ends_at_once_having_done_nothing(node):
    agent = started_ahead(node)
    out, err = agent.communicate(b"", timeout=30)  # stdin ends: fleet has nothing for it
    assert (agent.returncode, out, err) == (0, b"", b"")
    assert not node["marker"].exists()


def reading_stdin(pid: int) -> bool:
    """Whether the process is blocked reading its stdin (the system call it is in: read, of fd 0)."""
    fields = Path(f"/proc/{pid}/syscall").read_text().split()
    return fields[:2] == ["0", "0x0"]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1])
def test_an_agent_stopped_while_it_waits_ends_quietly(node, sig):
    """Ctrl-C (INT), its "leave it running" (USR1) or a TERM reach an agent still waiting for its
    plan: it ends at once, with no traceback for fleet to show, having started nothing."""
    agent = started_ahead(node)
    deadline = time.monotonic() + 60
    while not reading_stdin(agent.pid):  # loaded, and waiting for its plan
        assert agent.poll() is None and time.monotonic() < deadline, agent.communicate()
        time.sleep(0.05)
    agent.send_signal(sig)
    out, err = agent.communicate(timeout=30)
    assert (agent.returncode, out, err) == (0, b"", b""), err.decode()[-2000:]
    assert not node["marker"].exists()


def test_the_transport_sends_the_later_input_and_counts_the_timeout_from_it():
    """``later``: stdin goes on past the first input until the future gives the rest; a run's
    bound counts from then, so a command told what to do late is not timed out for the wait."""
    async def go():
        loop = asyncio.get_running_loop()
        later = loop.create_future()
        call = asyncio.ensure_future(LocalTransport().run(host("here"), ["cat"], input=b"first,",
                                                          later=later, timeout=0.5, grace=0))
        await asyncio.sleep(1.5)  # three times the timeout: not counted while nothing is sent
        assert not call.done()
        later.set_result(b"then")
        return await call, await LocalTransport().run(host("here"), ["cat"], input=b"alone",
                                                      later=_given(loop, None))
    sent, none = asyncio.run(go())
    assert (sent.exit_status, sent.stdout, sent.error) == (0, b"first,then", None)
    assert (none.exit_status, none.stdout) == (0, b"alone")


def _given(loop, value):
    future = loop.create_future()
    future.set_result(value)
    return future


def agents_of(scenario: Path) -> list[int]:
    """This machine's processes with ``scenario`` in their environment: the agents of this test."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if f"FAKE_NVML_SCENARIO={scenario}".encode() in environ.split(b"\0"):
            found.append(int(pid))
    return found


def test_a_refused_host_is_sent_no_plan_and_its_agent_is_gone_when_fleet_ends(tmp_path):
    """ncu on a GPU with another tenant is refused: the agent started beside the probe is sent
    nothing, ends having run nothing, and is not left behind."""
    lab = local_inventory_node(tmp_path)
    tenant = subprocess.Popen(["sleep", "60"])
    try:
        fakenvml.write_scenario(lab["scenario"], {"gpus": [{"index": 0, "processes": [
            {"pid": tenant.pid, "mem": 1 << 30, "sm": 0}]}]})
        out = run_fleet("profile", "--hosts", "gpu01", "--gpu", "0", "--tool", "ncu", "--json",
                        "--store", str(lab["store"]), "--", "touch", str(tmp_path / "ran"),
                        env=lab["env"], timeout=120)
    finally:
        tenant.kill()
        tenant.wait()
    [h] = fleet_json(out.stdout)["hosts"]
    assert h["status"] == "refused", out.stdout + out.stderr
    assert not (tmp_path / "ran").exists()
    assert agents_of(lab["scenario"]) == []


def test_what_an_agent_prints_before_its_plan_is_shown_only_once_it_is_sent_one():
    """A host refused or left out says nothing: its agent's output (a traceback of a node's broken
    Python, say) is held until its plan is sent, then shown with the run's host prefix; held
    output is bounded."""
    from fleet.lab.ahead import Ahead
    from fleet.lab.sink import LINE_LIMIT, LineSink

    async def go():
        loop = asyncio.get_running_loop()
        written, quiet = [], []
        sent = Ahead(loop.create_future(), LineSink("gpu01", False, lambda s, t: written.append(t)))
        never = Ahead(loop.create_future(), LineSink("gpu02", False, lambda s, t: quiet.append(t)))
        for agent in (sent, never):
            agent.call = loop.create_future()
            agent.output("stderr", b"early line\n")
            agent.output("stderr", b"x" * (2 * LINE_LIMIT))
        assert written == [] and sent.held_bytes == LINE_LIMIT
        sent.sink.prefix = True
        sent.send({"mode": "profile"})
        sent.output("stdout", b"later line\n")
        never.later.set_result(None)
        never.output("stderr", b"after none\n")
        return written, quiet
    written, quiet = asyncio.run(go())
    assert written == ["gpu01: early line\n", "gpu01: later line\n"] and quiet == []


def test_agents_start_ahead_only_where_the_pool_runs_every_host_at_once():
    """Past the pool's bound (-f) a host would wait for its plan beyond what its agent waits:
    such a run starts its agents after the plan, within the bound, as before."""
    from fleet.lab import ahead
    from fleet.transport import Fanout

    async def go():
        fan = Fanout(concurrency=1)
        return ahead.start(fan, [host("gpu01"), host("gpu02")], write=lambda s, t: None,
                           stop=None, bound=None)
    assert asyncio.run(go()) == {}
