"""As root, a profiler another account can change is code that account chose: fleet never runs it
(not even for --version), refuses to profile with it, and doctor says so instead of "placement ok"."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from fleet import exitcodes
from tests.conftest import fleet_json, run_fleet
from tests.harness.sshd import STANDINS, ensure_user
from tests.harness.procs import TENANT_USER

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the rule is root's")

# A stand-in nsys that leaves a mark if anything runs it, then behaves as the stand-in does.
MARKING_NSYS = """#!/bin/sh
touch "{mark}"
exec "{nsys}" "$@"
"""


@pytest.fixture
def planted(tmp_path):
    """nsys in a folder another account owns (as a user's own Nsight install would be)."""
    tenant = ensure_user(TENANT_USER)
    folder = Path(tempfile.mkdtemp(prefix="fleet-tools-"))
    try:
        folder.chmod(0o755)
        mark = folder / "ran"
        nsys = folder / "nsys"
        nsys.write_text(MARKING_NSYS.format(mark=mark, nsys=STANDINS / "nsys"))
        nsys.chmod(0o755)
        os.chown(folder, tenant.pw_uid, tenant.pw_gid)
        inventory = tmp_path / "inv.ini"
        inventory.write_text(f"localhost ansible_connection=local nsys_path={nsys} report_dir={tmp_path / 'r'}\n")
        yield {"inventory": inventory, "mark": mark, "store": tmp_path / "store", "folder": folder}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_root_refuses_a_profiler_another_account_can_change_and_never_runs_it(planted):
    out = run_fleet("-i", str(planted["inventory"]), "profile", "--hosts", "localhost", "--store",
                    str(planted["store"]), "--json", "--", "true")
    [host] = fleet_json(out.stdout)["hosts"]
    assert out.returncode == exitcodes.REFUSED and host["status"] == "refused", out.stderr
    assert f"{planted['folder']} belongs to uid" in host["error"] and "as root" in host["error"]
    assert not planted["mark"].exists(), "the planted nsys was run"


def test_doctor_says_placement_is_bad_not_ok(planted):
    out = run_fleet("-i", str(planted["inventory"]), "doctor", "localhost", "--json")
    [node] = fleet_json(out.stdout, "doctor")["nodes"]
    placement = node["problems"]["placement"]
    assert placement["status"] == "bad" and "as root fleet will not run it" in placement["text"], placement
    assert not planted["mark"].exists()


def test_a_root_owned_profiler_is_used(tmp_path):
    inventory = tmp_path / "inv.ini"
    inventory.write_text(f"localhost ansible_connection=local nsys_path={STANDINS / 'nsys'} "
                         f"report_dir={tmp_path / 'r'}\n")
    out = run_fleet("-i", str(inventory), "profile", "--hosts", "localhost", "--store", str(tmp_path / "s"),
                    "--json", "--", "true")
    assert out.returncode == exitcodes.OK, out.stderr
