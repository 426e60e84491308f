"""The test Slurm cluster of the Slurm-path tests (munge, slurmctld, two slurmd, a tenant's process)
reached through a real sshd as its login node, and how a test drives `fleet profile --partition`
against it. The fixture is registered for every test module by tests/conftest.py; each module that
asks gets a cluster of its own."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import announce, run_fleet
from tests.harness.procs import TENANT_USER, spawn, stop
from tests.harness.slurm import SlurmCluster, configure_login
from tests.harness.sshd import SSHCluster, ensure_user


@pytest.fixture(scope="module")
def hpc(pytestconfig):
    """Slurm with nodes node1, node2 (2 GPUs each) and login host h01 (user fleetci)."""
    ensure_user(TENANT_USER)
    slurm = SlurmCluster(2)
    c = SSHCluster(1)
    tenant = spawn(TENANT_USER, ["sleep", "900"])
    try:
        slurm.start()
        configure_login(slurm, c)
        c.start()
        # The same login node, logged into as root (GPU counters open, as ncu needs).
        c.root_inventory = c.dir / "inventory-root.yaml"
        doc = yaml.safe_load(c.inventory.read_text())
        doc["all"]["children"]["cluster"]["hosts"]["h01"]["ansible_user"] = "root"
        c.root_inventory.write_text(yaml.safe_dump(doc))
        c.slurm, c.tenant = slurm, tenant
        announce(pytestconfig, f"started Slurm 22.05 (munged, slurmctld, slurmd node1 node2) under {slurm.dir}, "
                               f"login sshd {c.hosts[0].address}")
        yield c
    finally:
        stop([tenant])
        c.stop()
        slurm.stop()
        announce(pytestconfig, "stopped the Slurm cluster and its login sshd")


def fleet(hpc, store: Path, *args: str, root: bool = False, timeout: float = 240):
    env = {**hpc.env(), "FLEET_STORE": str(store)}
    if root:
        env["FLEET_INVENTORY"] = str(hpc.root_inventory)
    return run_fleet("profile", "--partition", "gpu", "--poll", "1", *args, env=env, timeout=timeout)


def manifest(store: Path) -> dict:
    [path] = store.glob("*/*/*/manifest.json")
    return json.loads(path.read_text())


def _wait_running(store: Path, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(store.glob("*/*/*/manifest.json"))
        if found:
            m = json.loads(found[0].read_text())
            if m["slurm"].get("job_id"):
                return m
        time.sleep(0.2)
    raise AssertionError("the run was not submitted in time")
