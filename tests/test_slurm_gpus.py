"""One GPU per rank under fleet's prolog, on the test Slurm cluster: `--gres gpu:2
--gpus-per-task=1` with a tenant on GPU 1 alone. The prolog (installed by `fleet slurm install
--apply`, run by slurmd as root) records who is on each GPU by UUID; each rank's agent plans
with that verdict for its own GPU (Slurm's SLURM_STEP_GPUS, one per task).

The GPUs are the fake NVML's. slurmd starts the prolog with an environment of its own making,
so the fake reaches it the way a node's NVML library reaches a real prolog: through the node's
Python, which here is a wrapper giving the library's directory (the interpreter `--python` names,
as an admin would name the node's Python). The ranks get it from the login node's environment,
as every job on the test cluster does (tests/harness/slurm.py configure_login)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from tests.conftest import announce, run_fleet
from tests.harness import fakenvml
from tests.harness.slurm import SlurmCluster, configure_login
from tests.harness.sshd import SSHCluster, ensure_user
from tests.harness.procs import TENANT_USER, spawn, stop


@pytest.fixture(scope="module")
def gpu_cluster(pytestconfig):
    """One node with 2 GPUs and fleet's Prolog/Epilog/TaskProlog, login host h01 (as root)."""
    ensure_user(TENANT_USER)
    slurm, c = SlurmCluster(1), SSHCluster(1)
    tenant = spawn(TENANT_USER, ["sleep", "900"])
    etc = Path(tempfile.mkdtemp(prefix="fleet-slurm-etc-"))
    state = Path(tempfile.mkdtemp(prefix="fleet-slurm-state-"))
    try:
        configure_login(slurm, c)
        for d in (etc, state):
            d.chmod(0o755)
        python = etc / "node-python3"  # the node's Python, with the node's (fake) NVML library
        python.write_text("#!/bin/sh\n" + "".join(f"export {k}={v}\n" for k, v in
                                                   fakenvml.env(c.dir / "fakenvml", c.scenario).items())
                          + f"exec {os.path.realpath('/usr/bin/python3')} \"$@\"\n")
        python.chmod(0o755)
        install = run_fleet("slurm", "install", "--apply", "--no-node-check", "--prefix", str(etc / "fleet"),
                            "--python", str(python),
                            "--jobs-dir", str(state / "jobs"), "--state-dir", str(state / "owned"),
                            "--log-file", str(state / "slurm.log"))
        assert install.returncode == 0, install.stderr
        slurm.extra_conf = "\n".join(line.split("#")[0].strip() for line in install.stdout.splitlines()
                                     if line.startswith(("Prolog", "Epilog", "TaskProlog", "PrologFlags")))
        slurm.start()
        c.hosts[0].vars.update(fleet_slurm_prolog=True)  # ranks without the prolog's verdict refuse counters
        c.start()
        doc = yaml.safe_load(c.inventory.read_text())
        doc["all"]["children"]["cluster"]["hosts"]["h01"]["ansible_user"] = "root"  # GPU counters open: ncu
        c.root_inventory = c.dir / "inventory-root.yaml"
        c.root_inventory.write_text(yaml.safe_dump(doc))
        c.slurm, c.tenant, c.state = slurm, tenant, state
        announce(pytestconfig, f"started Slurm (node1, 2 GPUs) with fleet's prolog from {etc}, login sshd "
                               f"{c.hosts[0].address}")
        yield c
    finally:
        stop([tenant])
        c.stop()
        slurm.stop()
        for d in (etc, state):
            shutil.rmtree(d, ignore_errors=True)


def test_one_gpu_per_rank_with_a_tenant_on_gpu_1_profiles_rank_0_and_refuses_rank_1(gpu_cluster, tmp_path):
    c = gpu_cluster
    fakenvml.write_scenario(c.scenario, {"gpus": [
        {"index": 0, "minor": 0},
        {"index": 1, "minor": 1, "processes": [{"kind": "compute", "pid": c.tenant.pid, "mem": 10**9}]}]})
    try:
        r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--tool", "ncu", "--gres", "gpu:2",
                      "--ntasks", "2", "--sbatch-arg=--gpus-per-task=1", "--", "true",
                      env={**c.env(), "FLEET_STORE": str(tmp_path), "FLEET_INVENTORY": str(c.root_inventory)},
                      timeout=240)
    finally:
        fakenvml.write_scenario(c.scenario, {"gpus": [{"index": 0}, {"index": 1}]})
    print(r.stdout)  # the run's per-rank verdicts, as a user sees them (pytest -s shows them)
    [path] = tmp_path.glob("*/*/*/manifest.json")
    m = json.loads(path.read_text())
    assert sorted(h["rank"] for h in m["hosts"]) == [0, 1], (m["hosts"], r.stderr)
    first, second = (next(h for h in m["hosts"] if h["rank"] == i) for i in (0, 1))
    assert first["status"] == "ok" and first["tenants_seen"] == [], (first, r.stderr)  # its GPU 0 is free
    assert [Path(rep["stored"]).name for rep in first["reports"]][:1] == ["rank0.ncu-rep"]
    assert all(rep["verified"] for rep in first["reports"])
    assert second["status"] == "refused", second  # its GPU 1 holds the tenant
    assert any(f"tenant seen by the node's prolog: GPU 1: pid {c.tenant.pid} ({TENANT_USER}" in t
               for t in second["result"]["reasons"]), second["result"]["reasons"]
    assert not second["reports"]
    assert "rank 0: ok" in r.stdout and "rank 1: refused" in r.stdout, r.stdout
    assert r.returncode == 6, r.stderr + r.stdout  # partial: one rank profiled, one refused
    # The prolog saw both GPUs, by UUID, the tenant on GPU 1's alone.
    log = (c.state / "slurm.log").read_text()
    assert f"GPU 1: pid {c.tenant.pid}" in log and "GPU 0: pid" not in log, log
