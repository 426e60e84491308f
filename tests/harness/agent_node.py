"""One simulated H200 node on this machine, and the node's agent run on it the way fleet runs it: the
stand-in profilers on PATH, the simulated NVML naming who is on the GPU while the agent runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fleet.agent import wire
from fleet.agent.messages import ProfileResult
from fleet import outcome
from fleet.store.manifest import HostEntry, ReportEntry
from tests.harness import fakenvml

STANDINS = Path(__file__).parent.parent / "standins"
MEM = 900 << 20

AGENT = """
import json, sys
from fleet.agent import node, run
from fleet.plan import LabPart, ProfileRequest, plan
from fleet.policy import NodeState
a = json.loads(sys.argv[1])
state = NodeState.read(node.probe({"tools": a["tools"], "report_dir": a["report_dir"], "environment_check": False}))
p = plan("h01", state, ProfileRequest(tool="nsys", command=tuple(a["command"]), run_id="r", lab=LabPart(gpus=(0,))))
if p.status != "ok":
    print("PLAN REFUSED", p.reasons); sys.exit(2)
sys.exit(run.main({"plan": p.to_json()}))
"""


class Node:
    """One simulated H200; the test says who is on it while the agent runs."""

    def __init__(self, tmp_path: Path):
        self.dir = tmp_path
        self.scenario = tmp_path / "gpus.txt"
        fakenvml.write_scenario(self.scenario, {"gpus": [{"index": 0}]})
        self.env = {**os.environ, **fakenvml.env(fakenvml.build(tmp_path / "lib"), self.scenario),
                    "PATH": f"{STANDINS}:{os.environ['PATH']}"}

    def on_gpu(self, *pids: int) -> None:
        fakenvml.write_scenario(self.scenario, {"gpus": [{"index": 0, "processes": [
            {"pid": pid, "mem": MEM, "sm": 0} for pid in pids]}]})

    def start(self, script: str, report_dir: Path, prefix=(), env=None) -> tuple[subprocess.Popen, int]:
        """The agent profiling ``sh -c script`` (which writes its pid first); the workload's pid once it runs."""
        pidfile = self.dir / "workload.pid"
        args = {"report_dir": str(report_dir), "tools": {"nsys": str(STANDINS / "nsys")},
                "command": ["sh", "-c", f"echo $$ > {pidfile}; {script}"]}
        agent = subprocess.Popen([*prefix, sys.executable, "-c", AGENT, json.dumps(args)], env={**self.env, **(env or {})},
                                 cwd=self.dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True)
        for _ in range(400):
            if pidfile.exists() and pidfile.read_text().strip():
                return agent, int(pidfile.read_text())
            assert agent.poll() is None, agent.communicate()
            time.sleep(0.05)
        raise AssertionError("the workload never started")

    @staticmethod
    def entry(agent: subprocess.Popen) -> tuple[HostEntry, str]:
        """The host's entry as gather makes it: the result, and each report brought home verified."""
        out, err = agent.communicate(timeout=90)
        [result] = wire.answers(out, "profile")
        assert not wire.problems(result, "profile"), wire.problems(result, "profile")
        reports = [ReportEntry(remote=r["path"], size=r["size"], sha256=r["sha256"], verified=True,
                               status="truncated" if r.get("truncated") else "complete") for r in result["reports"]]
        status, why = outcome.of_result(ProfileResult.read(result), reports, tool="nsys")
        return HostEntry(host="h01", status=status, missing_why=why, result=result, reports=reports), out + err


def local_inventory_node(tmp_path: Path, report_dir: Path | None = None) -> dict:
    """gpu01, this machine as `fleet profile --hosts gpu01` reaches it (``ansible_connection=local``):
    one simulated GPU, the stand-in profilers, reports under ``report_dir``; the env for run_fleet."""
    scenario = tmp_path / "gpus.txt"
    fakenvml.write_scenario(scenario, {"gpus": [{"index": 0}]})
    inventory = tmp_path / "inv.ini"
    inventory.write_text(f"gpu01 ansible_connection=local nsys_path={STANDINS / 'nsys'} ncu_path={STANDINS / 'ncu'} "
                         f"ansible_python_interpreter={sys.executable} report_dir={report_dir or tmp_path / 'reports'}\n")
    env = {**fakenvml.env(fakenvml.build(tmp_path / "lib"), scenario), "FLEET_INVENTORY": str(inventory)}
    return {"dir": tmp_path, "scenario": scenario, "env": env, "store": tmp_path / "store"}

