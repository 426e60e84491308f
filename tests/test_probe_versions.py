"""The probe starts a profiler for its ``--version`` only where someone reads the answer: a run's own
profiler, both for ``fleet probe`` and ``fleet doctor``, none for the live look. Each start is a
process on a node that may be full of other people's work (and, with the real tools, tens of
milliseconds before the run's profiler may start). Real processes: two recording profilers, the
agent's probe, and ``fleet profile`` over the local connection."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fleet.agent import node
from fleet.agentcall import agent_args
from fleet.inventory import Host
from tests.conftest import REPO, fleet_json
from tests.harness import fakenvml
from tests.harness.procs import local_env

pytestmark = pytest.mark.services  # the recording profilers, the agent's probe and fleet are processes

RECORDER = """#!/bin/sh
echo "$(basename "$0") $*" >> {log}
[ "$1" = --version ] && echo "NVIDIA Nsight 2025.3.1.0 (recording stand-in)"
exec {real} "$@"
"""


def recorders(tmp_path):
    """nsys and ncu that write each call to a log, then run the tests' stand-in of that name."""
    folder, log = tmp_path / "bin", tmp_path / "calls.log"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)  # as root, a profiler in a folder others may write is never run
    for tool in ("nsys", "ncu"):
        real = REPO / "tests" / "standins" / tool
        (folder / tool).write_text(RECORDER.format(log=log, real=real))
        (folder / tool).chmod(0o755)
    return folder, log


def calls(log) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_probe_asks_only_the_profilers_it_is_told_to(tmp_path):
    folder, log = recorders(tmp_path)
    paths = {t: str(folder / t) for t in ("nsys", "ncu")}
    state = node.probe({"tools": paths, "environment_check": False, "versions": ["nsys"]})
    assert calls(log) == ["nsys --version"]
    assert state["tools"]["nsys"]["version"] == "2025.3.1.0"
    # ncu is found (its path, whether another account could change it), its version unknown
    assert state["tools"]["ncu"]["path"] == paths["ncu"] and "version" not in state["tools"]["ncu"]
    log.unlink()
    node.probe({"tools": paths, "environment_check": False, "versions": []})
    assert calls(log) == []
    node.probe({"tools": paths, "environment_check": False})  # not said: both, as before
    assert sorted(calls(log)) == ["ncu --version", "nsys --version"]


def test_what_is_not_a_list_of_profilers_reads_as_both():
    read = node.ProbeArgs.read
    assert read({}).versions == read({"versions": "ncu"}).versions == ("nsys", "ncu")
    assert read({"versions": ["ncu", "bash", 3]}).versions == ("ncu",)
    host = Host("h01", {}, (), "test")
    assert "versions" not in agent_args(host) and agent_args(host, versions=())["versions"] == []


@pytest.fixture
def this_node(tmp_path):
    """This machine as a node with the simulated NVML and the recording profilers first on PATH:
    ``fleet(*args)`` runs a command against it; ``log`` is where the profilers' calls go."""
    folder, log = recorders(tmp_path)
    lib = fakenvml.build(tmp_path / "lib")
    scenario = fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [{"index": 0}]})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
           **local_env(fakenvml.env(lib, scenario)), "FLEET_STORE": str(tmp_path / "store")}
    env["PATH"] = f"{folder}:{env['PATH']}"

    def fleet(*args):
        log.unlink(missing_ok=True)
        out = subprocess.run([sys.executable, "-m", "fleet", *args], env=env, cwd=REPO, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        return out

    return fleet, log


def test_a_profile_asks_its_own_profiler_only(this_node):
    fleet, log = this_node
    for tool in ("nsys", "ncu"):
        out = fleet("profile", "--hosts", "localhost", "--tool", tool, "--gpu", "0", "--dry-run", "--json", "--",
                    "true")
        [host] = fleet_json(out.stdout)["hosts"]
        assert host["status"] == "planned" and host["tool_version"] == "2025.3.1.0", host
        assert calls(log) == [f"{tool} --version"]


def test_probe_and_doctor_ask_both_and_the_live_look_neither(this_node):
    fleet, log = this_node
    out = fleet("probe", "localhost", "--json")
    assert sorted(calls(log)) == ["ncu --version", "nsys --version"]
    [found] = fleet_json(out.stdout)["nodes"]
    assert {t: found["state"]["tools"][t]["version"] for t in ("nsys", "ncu")} == {"nsys": "2025.3.1.0",
                                                                                    "ncu": "2025.3.1.0"}
    fleet("doctor", "localhost")
    assert sorted(calls(log)) == ["ncu --version", "nsys --version", "nsys status -e"]
    fleet("top", "localhost", "--once")
    assert calls(log) == []


def test_a_slurm_rank_asks_its_own_profiler_only(tmp_path, monkeypatch):
    """A rank plans itself on its node, from its own probe: of the request's profiler alone."""
    from fleet.agent import task

    folder, log = recorders(tmp_path)
    lib = fakenvml.build(tmp_path / "lib")
    scenario = fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [{"index": 0}]})
    for name, value in fakenvml.env(lib, scenario).items():
        monkeypatch.setenv(name, value)
    tools = {t: str(folder / t) for t in ("nsys", "ncu")}
    args = task.TaskArgs({"request": {"tool": "ncu", "run_id": "20261208-000000-abcd"}, "tools": tools,
                          "report_dir": str(tmp_path / "scratch")})
    _, context = task.plan_rank(args, {"SLURM_JOB_ID": "78", "SLURMD_NODENAME": "node1"}, "rank0", ["true"])
    assert calls(log) == ["ncu --version"]
    assert context["tool_version"] == "2025.3.1.0"
