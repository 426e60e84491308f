"""The self-resubmitting schedule (fleet schedule install on a Slurm login node) run from a folder
that holds a ``fleet/`` of its own: the job runs in the folder it was submitted from, and fleet's
own modules must still be the installed ones. A real one-node Slurm cluster, fleet on its login
node (this machine)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import yaml

from fleet import store
from tests.conftest import REPO, announce
from tests.harness.slurm import SlurmCluster


@pytest.fixture(scope="module")
def local_slurm(pytestconfig):
    with SlurmCluster(1) as s:
        announce(pytestconfig, f"started Slurm (munged, slurmctld, slurmd node1) under {s.dir} for schedules")
        yield s


def test_the_resubmitting_schedule_from_a_folder_holding_a_fleet_package_runs_the_installed_fleet(
        local_slurm, tmp_path):
    folder = tmp_path / "work"
    (folder / "fleet").mkdir(parents=True)
    impostor = tmp_path / "impostor-ran"
    (folder / "fleet" / "__init__.py").write_text(f"open({str(impostor)!r}, 'w').close()\n")
    (folder / "fleet" / "__main__.py").write_text("raise SystemExit(0)\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"login": {
        "ansible_connection": "local", "slurm_login": "login", "report_dir": str(tmp_path / "runs"),
        "nsys_path": str(REPO / "tests" / "standins" / "nsys")}}}}))
    pb = tmp_path / "nightly.yaml"
    pb.write_text(yaml.safe_dump({"name": "from-a-folder", "target": {"partition": "gpu", "ntasks": 1},
                                  "command": ["sleep", "0.2"], "metrics": [{"kind": "gpu_kernel_total"}]}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(local_slurm.env, FLEET_STORE=str(tmp_path / "store"), FLEET_INVENTORY=str(inventory))

    def fleet(*args):  # started from the folder, as its user would (-P: this test's own start is safe)
        return subprocess.run([sys.executable, "-P", "-m", "fleet", *args], env=env, cwd=folder,
                              capture_output=True, text=True, timeout=120)

    r = fleet("schedule", "install", str(pb), "--every", "2s")
    assert r.returncode == 0 and "with resubmit: job" in r.stdout, r.stdout + r.stderr
    try:
        deadline = time.monotonic() + 120
        while len({row["run_id"] for row in store.metric_history(tmp_path / "store", "from-a-folder")}) < 2:
            logs = {p.name: p.read_text()[-500:] for p in (tmp_path / "store" / "schedules").glob("*.out")}
            assert time.monotonic() < deadline, logs
            time.sleep(0.5)
    finally:
        rm = fleet("schedule", "rm", "from-a-folder")
    assert rm.returncode == 0, rm.stderr
    assert not impostor.exists()  # the folder's fleet/ was never imported
