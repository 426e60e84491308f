"""The agent in a PID namespace of its own (real unshare, as in a container or a pod), another
user's process on the GPU outside it, the simulated NVML behaving as the driver does: the lists
hide the tenant, its memory does not. Before, the driver-like lists made ncu run beside it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, fleet_json
from tests.harness import fakenvml
from tests.harness.sshd import ensure_user
from tests.harness.procs import TENANT_USER, local_env, spawn, stop

if not shutil.which("unshare"):
    pytest.skip("unshare (util-linux) is needed", allow_module_level=True)
PRIVATE = ["unshare", "--pid", "--fork", "--mount-proc"]  # a new PID namespace, with its own /proc


@pytest.fixture
def tenant_outside(tmp_path):
    """Another user's process holding 1.7 GB of GPU 0, and the environment of a node whose
    NVML is the simulated one."""
    ensure_user(TENANT_USER)
    tenant = spawn(TENANT_USER, ["sleep", "300"])
    lib = fakenvml.build(tmp_path / "lib")
    scenario = fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [
        {"index": 0, "processes": [{"kind": "compute", "pid": tenant.pid, "mem": 1_722_613_760, "sm": 0}]},
        {"index": 1}]})
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
           **local_env(fakenvml.env(lib, scenario)), "FLEET_STORE": str(tmp_path / "store")}
    try:
        yield tenant, env
    finally:
        stop([tenant])


def fleet(env, *args, private=True):
    argv = [*(PRIVATE if private else []), sys.executable, "-m", "fleet", *args]
    return subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=120)


def verdicts(out):
    [node] = fleet_json(out.stdout)["nodes"]
    return {v["way"]: v for v in node["verdicts"]}


def test_a_tenant_outside_the_namespace_is_unseen_but_counted(tenant_outside, tmp_path):
    tenant, env = tenant_outside
    v = verdicts(fleet(env, "doctor", "--json"))
    for way in ("ncu", "nsys-gpu-metrics"):
        assert v[way]["status"] == "refused", v[way]
        assert any("1.6 GiB in use by processes not visible from here (the agent is in another PID namespace)"
                   in r for r in v[way]["reasons"]), v[way]["reasons"]
        assert "host's PID namespace" in v[way]["remedy"]
    assert v["nsys-trace"]["status"] == "ok" and any(r.startswith("warning: GPU 0") for r in v["nsys-trace"]["reasons"])
    probe = fleet(env, "probe")
    assert "no processes listed" in probe.stdout and "UNSEEN  1.6 GiB in use" in probe.stdout
    marker = tmp_path / "ran"
    ncu = fleet(env, "profile", "--hosts", "localhost", "--tool", "ncu", "--gpu", "0", "--", "touch", str(marker))
    assert ncu.returncode == 5 and "unseen tenant: GPU 0" in ncu.stderr and not marker.exists()
    other_gpu = fleet(env, "profile", "--hosts", "localhost", "--tool", "ncu", "--gpu", "1", "--json", "--", "true")
    assert other_gpu.returncode == 0, other_gpu.stderr  # GPU 1 holds nothing: nobody hides there


def test_the_same_tenant_seen_from_the_hosts_namespace_is_named(tenant_outside):
    tenant, env = tenant_outside
    v = verdicts(fleet(env, "doctor", "--json", private=False))
    assert v["ncu"]["status"] == "refused"
    assert any(f"pid {tenant.pid} ({TENANT_USER}" in r for r in v["ncu"]["reasons"]), v["ncu"]["reasons"]
    assert not any("not visible" in r for r in v["ncu"]["reasons"])


def test_own_processes_inside_the_agents_namespace_are_resolved(tmp_path):
    """Inside a namespace the driver lists that namespace's processes by its own pids (measured
    on an H200 test machine): they were all counted as foreign, so --allow-own never helped in a
    container. Now the listed pid is looked up where the agent is."""
    outer = spawn(None, [*PRIVATE, "sleep", "300"])  # root's sleep, pid 1 of a namespace of its own
    try:
        sleeper = wait_for_child(outer.pid)
        lib = fakenvml.build(tmp_path / "lib")
        scenario = fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [
            {"index": 0, "processes": [{"kind": "compute", "pid": sleeper, "mem": 500 << 20}]}]})
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")},
               **local_env(fakenvml.env(lib, scenario)), "FLEET_STORE": str(tmp_path / "store")}
        inside = ["nsenter", "--target", str(sleeper), "--pid", "--mount"]

        def fleet_inside(*args):
            return subprocess.run([*inside, sys.executable, "-m", "fleet", *args], env=env, cwd=REPO,
                                  capture_output=True, text=True, timeout=120)

        v = verdicts(fleet_inside("doctor", "--json"))
        assert any("pid 1 (root" in r and "your own other process" in r for r in v["ncu"]["reasons"]), v["ncu"]
        ncu = fleet_inside("profile", "--hosts", "localhost", "--tool", "ncu", "--gpu", "0", "--allow-own", "--json",
                           "--", "true")
        assert ncu.returncode == 0, ncu.stdout + ncu.stderr
    finally:
        stop([outer])


def wait_for_child(pid: int) -> int:
    import time
    from pathlib import Path

    for _ in range(100):
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    return int(stat.parent.name)
            except (OSError, ValueError, IndexError):
                continue
        time.sleep(0.05)
    raise AssertionError(f"no child of {pid}")
