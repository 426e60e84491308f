"""A verdict that covers the whole run, through the real command line: a workload that exits 3 or
segfaults is not ok, and a tenant who arrives while ncu holds the counters makes the run yield.

fleet runs the agent on this machine (``ansible_connection=local``) with the simulated NVML and
the stand-in profilers, which replay what nsys and ncu did on an H200 for these ends
(tests/fixtures/tools-2025.3-h200/: nsys-app-exit3, nsys-app-segv, ncu-app-exit3, ...).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from fleet import exitcodes
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness import fakenvml
from tests.harness.agent_node import local_inventory_node
from tests.harness.sshd import ensure_user
from tests.harness.procs import TENANT_USER, spawn, stop

WORKLOAD_MEM = 300 << 20


@pytest.fixture
def node(tmp_path):
    return local_inventory_node(tmp_path)


def profile(node, *args: str):
    out = run_fleet("profile", "--hosts", "gpu01", "--store", str(node["store"]), *args, env=node["env"])
    return out


@pytest.mark.parametrize("tool, command, said, workload", [
    ("nsys", "exit 3", "the workload exited 3", {"exit_status": 3, "signal": None}),
    ("nsys", "kill -SEGV $$", "the workload was killed by SIGSEGV", {"exit_status": None, "signal": "SIGSEGV"}),
    ("ncu", "exit 3", "the workload exited 3", {"exit_status": 3, "signal": None}),
])
def test_a_workload_that_fails_is_not_ok_and_its_report_is_kept(node, tool, command, said, workload):
    """Exit 3 and a SIGSEGV were 'gpu01: ok', 'run ... complete', exit 0."""
    out = profile(node, "--tool", tool, "--", "sh", "-c", command)
    assert out.returncode == exitcodes.WORKLOAD_FAILED, out.stdout + out.stderr
    assert f"gpu01: workload-failed: {said}" in out.stderr
    assert "workload-failed: reports in" in out.stdout  # the run line says it too
    doc = fleet_json(profile(node, "--tool", tool, "--json", "--", "sh", "-c", command).stdout)
    [host] = doc["hosts"]
    assert host["status"] == "workload-failed" and host["result"]["workload"] == workload
    assert [r["verified"] for r in host["reports"] if r["status"] not in ("summary", "export")] == [True]
    if tool == "ncu":  # ncu's own line about it is shown, not hidden
        assert "==ERROR== The application returned an error code (3)." in out.stderr


def test_a_tenant_arriving_mid_ncu_makes_the_run_yield_and_is_named(node):
    """A tenant who arrived 10 s into an ncu run was profiled beside for 33 s, and the run said ok."""
    ensure_user(TENANT_USER)
    tenant = spawn(TENANT_USER, ["sleep", "300"])
    pidfile = node["dir"] / "workload.pid"
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--hosts", "gpu01", "--tool", "ncu", "--gpu",
                             "0", "--store", str(node["store"]), "--", "sh", "-c",
                             f"echo $$ > {pidfile}; exec sleep 60"], cwd=REPO, env={**__import__("os").environ,
                                                                                     **node["env"]},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(400):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        workload = {"pid": int(pidfile.read_text()), "mem": WORKLOAD_MEM, "sm": 0}
        fakenvml.write_scenario(node["scenario"], {"gpus": [{"index": 0, "processes": [workload]}]})
        time.sleep(1.5)  # the watch has seen the workload alone on the GPU
        fakenvml.write_scenario(node["scenario"], {"gpus": [{"index": 0, "processes": [
            workload, {"pid": tenant.pid, "mem": 1 << 30, "sm": 0}]}]})
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stop([tenant])
    assert proc.returncode == exitcodes.YIELDED, stdout + stderr
    line = next(l for l in stderr.splitlines() if l.startswith("gpu01: "))
    assert line.startswith("gpu01: yielded: gave the GPU's counters back to ")
    assert f"pid {tenant.pid} ({TENANT_USER}, 1.0 GiB) on GPU 0" in line and "s after the profiler started" in line
    assert "SIGINT" in line and "report kept" in line
    assert "run " in stdout and " yielded: reports in" in stdout
    assert "report:" in stderr and "verified" in stderr  # what ncu profiled until then came home
