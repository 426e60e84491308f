"""The lab servers of the lab-path tests: three real sshd hosts with simulated GPUs, stand-in
profilers, a tenant's process, a sudo rule and kernel.perf_event_paranoid at 3, and how a test
drives `fleet profile` against them. The fixtures are registered for every test module by
tests/conftest.py (each module that asks gets a lab of its own); a module that resets the GPUs'
scenario around each test says `pytestmark = pytest.mark.usefixtures("clean_gpus")`.

A lab's perf_event_paranoid is its own (tests/harness/sysctl.py), so labs run side by side; a
module whose tests are about the machine's real sysctl asks for ``kernel_lab`` instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, announce, run_fleet
from tests.harness import fakenvml
from tests.harness.procs import TENANT_USER, spawn, stop
from tests.harness.sshd import SSHCluster, ensure_user
from tests.harness.sysctl import KernelSysctl, PrivateSysctl
# The machine's sudoers gains a rule for this run's test user while the lab is up, in a file of
# this run's own (sudo skips names with a '.', so the pid is joined with '-').
SUDOERS = Path(f"/etc/sudoers.d/fleet-tests-{os.getpid()}")


def wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def lab(pytestconfig):
    """Three lab servers with a perf_event_paranoid of their own (3, as Debian ships it: CPU
    sampling blocked for users). On h01 fleet logs in as an ordinary user (owned sysctls go
    through `sudo -n`, GPU counters are closed); on h02 and h03 as root (counters open, as for ncu)."""
    sysctl = PrivateSysctl("3")
    try:
        yield from _lab(pytestconfig, sysctl)
    finally:
        sysctl.stop()


@pytest.fixture(scope="module")
def kernel_lab(pytestconfig):
    """The lab on the machine's own perf_event_paranoid, set to 3 while it is up and put back
    however the tests end (the sysctl group runs its users one after another)."""
    sysctl = KernelSysctl("3")
    try:
        yield from _lab(pytestconfig, sysctl)
    finally:
        sysctl.stop()
        announce(pytestconfig, f"perf_event_paranoid put back to {sysctl.original}")


def _lab(pytestconfig, sysctl):
    ensure_user(TENANT_USER)
    c = SSHCluster(3, launcher=sysctl.prefix)
    tenant = spawn(TENANT_USER, ["sleep", "900"])
    try:
        lib = fakenvml.build(c.dir / "fakenvml")
        state_dir, lock_dir = c.dir / "state", c.dir / "locks"
        # The node's root-owned config, which alone says what root reached through sudo may set.
        node_config = c.dir / "node.json"
        node_config.write_text(json.dumps({"owned_sysctls": {"kernel.perf_event_paranoid": 2}}))
        node_config.chmod(0o644)
        lock_dir.mkdir(mode=0o777)
        lock_dir.chmod(0o1777)
        for h in c.hosts:
            scenario = c.dir / f"scenario-{h.name}.txt"
            fakenvml.write_scenario(scenario, {"gpus": [{"index": 0, "uuid": f"GPU-{h.name}-0"},
                                                        {"index": 1, "uuid": f"GPU-{h.name}-1"}]})
            scenario.chmod(0o644)
            env = {**fakenvml.env(lib, scenario), "FLEET_STATE_DIR": state_dir, "FLEET_LOCK_DIR": lock_dir,
                   "FLEET_NODE_CONFIG": node_config,
                   "FAKE_DCGM_LOG": c.dir / "dcgm.log",
                   "PATH": f"{c.dir / 'standins'}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
            h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in env.items())
        for h in c.hosts[1:]:
            h.vars["ansible_user"] = "root"
        tools = c.standins()
        c.inventory_vars = {"nsys_path": str(tools / "nsys"), "ncu_path": str(tools / "ncu"),
                            "ansible_python_interpreter": "/usr/bin/python3",
                            "owned_sysctls": {"kernel.perf_event_paranoid": 2}}
        SUDOERS.write_text(f'Defaults:{c.user} env_keep += "FLEET_STATE_DIR FLEET_LOCK_DIR FLEET_NODE_CONFIG"\n'
                           f"{c.user} ALL=(root) NOPASSWD: /usr/bin/python3\n")
        SUDOERS.chmod(0o440)
        c.start()
        announce(pytestconfig, f"started {len(c.hosts)} sshd lab servers; perf_event_paranoid {sysctl.read()} "
                               f"for them ({type(sysctl).__name__})")
        # The store is the controller's (root's here), in a folder of its own: a shared, sticky one
        # as the scratch folders are is refused (every account could plant its catalog).
        yield {"c": c, "tenant": tenant.pid, "state": state_dir, "locks": lock_dir, "node_config": node_config,
               "out": c.dir / "store", "dcgm_log": c.dir / "dcgm.log", "paranoid": sysctl}
    finally:
        stop([tenant])
        c.stop()
        SUDOERS.unlink(missing_ok=True)


def scenario(lab, host, processes=(), gpu=0, arch=9):
    gpus = [{"index": i, "uuid": f"GPU-{host}-{i}", "arch": arch, "processes": list(processes) if i == gpu else []}
            for i in (0, 1)]
    fakenvml.write_scenario(lab["c"].dir / f"scenario-{host}.txt", {"gpus": gpus})


@pytest.fixture
def clean_gpus(lab):
    for h in lab["c"].hosts:
        scenario(lab, h.name)
    yield
    assert lab["paranoid"].read() == "3", "a test left kernel.perf_event_paranoid changed"


def fleet(lab, *args, **kw):
    return run_fleet("profile", "--store", str(lab["out"]), *args, env=lab["c"].env(), **kw)


def held_entries(lab) -> dict:
    path = lab["state"] / "state.json"
    return json.loads(path.read_text())["sysctls"] if path.exists() else {}


def kill_fleet_mid_run(lab, store_root) -> None:
    """`fleet profile` on h01, SIGKILLed once its agent has the node (the sysctl is held)."""
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(store_root), "--hosts", "h01",
                             "--", "sleep", "2"], env={**os.environ, **lab["c"].env()}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: lab["paranoid"].read() == "2")
    proc.kill()  # fleet dies before the report comes home
    proc.wait()
