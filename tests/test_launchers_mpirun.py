"""Open MPI as users run it: Debian's openmpi-bin (4.1), each rank under fleet's agent, reports
named by the rank Open MPI gives it. The option table is held to what the real mpirun lists
(tests/fixtures/openmpi-4.1/help-all.txt), the rank names to the environment it gave its ranks
(tests/fixtures/openmpi-4.1/env-np4/). Before, `--timeout 60` (one of 56 options the table
missed) made fleet take "60" for the program, and mpirun was only ever met as text."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet import completeness, outcome
from fleet.agent.messages import ProfileResult
from fleet.agent import bundle, task, wire
from fleet.plan import ProfileRequest
from fleet.slurm.launchers import launch, script_index
from fleet.store.manifest import HostEntry, ReportEntry
from tests.harness import fakenvml

FIXTURES = Path(__file__).parent / "fixtures" / "openmpi-4.1"
STANDINS = Path(__file__).parent / "standins"
MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun (Debian: openmpi-bin)")


def real_options() -> dict[str, int]:
    """Every option Open MPI 4.1's `mpirun --help all` lists, and how many values it takes."""
    found = {}
    for m in re.finditer(r"^\s*(-[^\s<]+)((?:\s*<arg\d+>)*)", (FIXTURES / "help-all.txt").read_text(), re.M):
        for name in m.group(1).split("|"):
            found[name] = len(re.findall("<arg", m.group(2)))
    return found


def test_every_option_the_real_mpirun_lists_is_skipped_with_its_values():
    options = real_options()
    assert len(options) > 150 and options["-np"] == 1 and options["--mca"] == 2 and options["--oversubscribe"] == 0
    for name, values in options.items():
        if name in ("-h", "--help"):  # mpirun --help TOPIC prints help: there is no program to wrap
            continue
        cmd = ["mpirun", name, *[f"v{i}" for i in range(values)], "./app", "-np", "9"]
        assert script_index(cmd, "mpirun") == 2 + values, (name, values)


def test_ranks_are_named_as_open_mpi_names_them():
    ranks = sorted(FIXTURES.glob("env-np4/rank*.json"))
    assert len(ranks) == 4
    for path in ranks:
        given = json.loads(path.read_text())["values"]
        assert task.rank_of(given, "mpirun") == int(path.stem[4:])
        mine = task.whose(given, "mpirun", task.rank_of(given, "mpirun"), "node1", [])
        assert mine["local_rank"] == int(given["OMPI_COMM_WORLD_LOCAL_RANK"])


@needs_mpirun
def test_four_ranks_of_the_real_mpirun_are_each_under_the_agent_and_named_by_rank(tmp_path):
    """The batch script's own launch lines, run by bash, as a Slurm job's shell runs them."""
    lib = fakenvml.build(tmp_path / "lib")
    scenario = tmp_path / "gpus.txt"
    fakenvml.write_scenario(scenario, {"gpus": [{"index": 0}, {"index": 1}]})
    agent_file = tmp_path / "fleet-agent.py"
    agent_file.write_text(bundle.script())
    reports = tmp_path / "reports"
    reports.mkdir(mode=0o700)
    worker = tmp_path / "worker.py"
    # Each rank says who it is in a file of its own: four processes' lines on one pipe interleave.
    worker.write_text("import os\nr = os.environ['OMPI_COMM_WORLD_RANK']\n"
                      "open('said-' + r + '.txt', 'w').write('rank %s of %s' % (r, os.environ['OMPI_COMM_WORLD_SIZE']))\n")
    req = ProfileRequest(tool="nsys", command=(), run_id="r1")
    args = {"mode": "task", "request": req.to_json(), "report_dir": str(reports), "launcher": "mpirun",
            "ranks": None, "tools": {"nsys": str(STANDINS / "nsys")}, "prolog_expected": False, "stop_before": None}
    agent = [sys.executable, str(agent_file), json.dumps(args)]
    command = [MPIRUN, "-np", "4", "--allow-run-as-root", "--oversubscribe", "--timeout", "120",
               "--mca", "btl", "self,tcp", "python3", str(worker)]
    la = launch("mpirun", command, agent, str(tmp_path), None)
    script = "\n".join(["set -u", "COMMAND=(" + " ".join(map(shlex.quote, command)) + ")", *la.setup, la.line])
    env = {**os.environ, **fakenvml.env(lib, scenario), "PATH": f"{STANDINS}:{os.environ['PATH']}",
           "SLURM_JOB_ID": "77", "SLURMD_NODENAME": "node1"}
    env.pop("SLURM_PROCID", None)
    done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert [(tmp_path / f"said-{i}.txt").read_text() for i in range(4)] == [f"rank {i} of 4" for i in range(4)], said
    entries = []
    for rank in range(4):
        result = wire.read((reports / "r1" / "node1" / f"rank{rank}.result.json").read_text(), "profile")
        [rep] = result["reports"]
        assert Path(rep["path"]).name == f"rank{rank}.nsys-rep"
        # nsys wrapped the rank itself (python3 on the worker), not mpirun
        assert json.loads(Path(rep["path"]).read_text())["app"] == ["python3", str(worker)]
        assert result["whose"]["launcher"] == "mpirun" and result["whose"]["rank"] == rank
        assert result["whose"]["local_rank"] == rank and result["whose"]["job"] == "77"
        reps = [ReportEntry(remote=rep["path"], size=rep["size"], sha256=rep["sha256"], status="complete",
                            verified=True)]
        status, why = outcome.of_result(ProfileResult.read(result), reps, tool="nsys")
        entries.append(HostEntry(host="node1", rank=rank, status=status, missing_why=why, result=result, reports=reps))
    assert [e.status for e in entries] == ["ok"] * 4
    assert completeness.run_lines(entries)[0] == "reports: 4 complete"


@needs_mpirun
def test_mpirun_in_a_slurm_job_profiles_four_ranks_named_by_rank(hpc, tmp_path):
    from tests.harness.hpc import fleet as fleet_slurm, manifest

    worker = hpc.runs / "mpi_worker.py"
    worker.write_text("import os\nprint('rank', os.environ['OMPI_COMM_WORLD_RANK'], 'of', "
                      "os.environ['OMPI_COMM_WORLD_SIZE'], flush=True)\n")
    worker.chmod(0o644)
    r = fleet_slurm(hpc, tmp_path, "--launcher", "mpirun", "--", "mpirun", "-np", "4", "--oversubscribe",
                    "--timeout", "120", "--mca", "btl", "self,tcp", "python3", str(worker))
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert sorted((h["rank"], h["status"]) for h in m["hosts"]) == [(i, "ok") for i in range(4)]
    for h in m["hosts"]:
        [rep] = [rep for rep in h["reports"] if rep["status"] == "complete"]
        assert Path(rep["stored"]).name == f"rank{h['rank']}.nsys-rep"
        assert json.loads(Path(rep["stored"]).read_text())["app"] == ["python3", str(worker)]
        assert h["result"]["whose"]["launcher"] == "mpirun" and h["result"]["whose"]["job"] == m["slurm"]["job_id"]
    assert "reports: 4 complete" in r.stdout
