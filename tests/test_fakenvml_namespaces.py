"""The fake NVML and PID namespaces, called from real namespaces (unshare, nsenter).

The driver lists only the processes of the caller's PID namespace, under that
namespace's pids, while the device's memory counts every process. Tenants
here are real processes the tests start; pynvml runs in a child in the host's
namespace, in a new namespace of its own, or inside a tenant's namespace.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

from tests.harness import fakenvml
from tests.harness.pynvml_script import PRELUDE

pytest.importorskip("pynvml")
if not (shutil.which("unshare") and shutil.which("nsenter")):
    pytest.skip("unshare and nsenter (util-linux) are needed", allow_module_level=True)

NA = 0xFFFFFFFF
PRIVATE = ["unshare", "--pid", "--fork", "--mount-proc"]  # a new PID namespace, with its own /proc
OWN_NS = os.stat("/proc/self/ns/pid").st_ino
GHOST = 1 << 23  # above the largest pid_max (2^22): a pid no process has

# Prepended after PRELUDE: one GPU's view, as the caller sees it.
VIEW = """
def view(i=0):
    h = N.nvmlDeviceGetHandleByIndex(i)
    m1, m2 = N.nvmlDeviceGetMemoryInfo(h), N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    return dict(ns=os.stat("/proc/self/ns/pid").st_ino, pid=os.getpid(),
                compute=procs(N.nvmlDeviceGetComputeRunningProcesses(h)),
                graphics=procs(N.nvmlDeviceGetGraphicsRunningProcesses(h)),
                mps=procs(N.nvmlDeviceGetMPSComputeRunningProcesses(h)),
                v1=dict(total=m1.total, used=m1.used, free=m1.free),
                v2=dict(total=m2.total, reserved=m2.reserved, used=m2.used, free=m2.free))
"""


@pytest.fixture
def spawn():
    """Start real processes; at the end kill those (by pid) and only those."""
    started = []

    def start(argv):
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
        started.append(p)
        return p

    yield start
    for p in reversed(started):
        p.kill()
        p.wait()


def namespaced_sleeper(spawn) -> tuple[subprocess.Popen, int]:
    """A `sleep` as pid 1 of a new PID namespace: (its unshare, the sleep's host pid)."""
    outer = spawn([*PRIVATE, "--kill-child", "sleep", "300"])  # the sleep dies with its unshare
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        kids = pathlib.Path(f"/proc/{outer.pid}/task/{outer.pid}/children").read_text().split()
        # Once it runs sleep, unshare's child has mounted the namespace's /proc.
        if kids and pathlib.Path(f"/proc/{kids[0]}/comm").read_text().strip() == "sleep":
            return outer, int(kids[0])
        time.sleep(0.02)
    raise AssertionError("the namespaced sleep did not start")


def pynvml(lib_dir, scenario, body="print(json.dumps(view()))", within=()):
    """Run pynvml against the fake in a fresh interpreter, under the command prefix `within`."""
    env = {**os.environ, **fakenvml.env(lib_dir, scenario)}
    script = PRELUDE + VIEW + "N.nvmlInit()\n" + textwrap.dedent(body)
    proc = subprocess.run([*within, sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_harness_records_the_namespaces_of_a_live_process(spawn, tmp_path):
    tenant = spawn(["sleep", "300"])
    ns, ids = fakenvml.pid_namespaces(tenant.pid)
    assert ns[-1] == os.stat(f"/proc/{tenant.pid}/ns/pid").st_ino == OWN_NS and ids[-1] == tenant.pid
    _, inner = namespaced_sleeper(spawn)
    ns2, ids2 = fakenvml.pid_namespaces(inner)
    assert ns2 == [OWN_NS, os.stat(f"/proc/{inner}/ns/pid").st_ino] and ids2 == [inner, 1]
    text = fakenvml.write_scenario(tmp_path / "s.txt", {"gpus": [{"processes": [
        {"pid": tenant.pid}, {"pid": inner}, {"pid": 99, "pidns": [5, 6], "nspid": [99, 3]}]}]}).read_text()
    assert f"pid={tenant.pid} mem=0 gi={NA} ci={NA} pidns={OWN_NS} nspid={tenant.pid}\n" in text
    assert f"pid={inner} mem=0 gi={NA} ci={NA} pidns={OWN_NS},{ns2[1]} nspid={inner},1\n" in text
    assert "pid=99 mem=0 gi=4294967295 ci=4294967295 pidns=5,6 nspid=99,3\n" in text
    assert fakenvml.pid_namespaces(GHOST) is None


def test_a_tenant_outside_the_callers_namespace_is_hidden_but_its_memory_counted(lib_dir, scenario, spawn):
    tenant = spawn(["sleep", "300"])
    fakenvml.write_scenario(scenario, {"gpus": [{"processes": [
        {"kind": "compute", "pid": tenant.pid, "mem": 1_722_613_760},
        {"kind": "graphics", "pid": tenant.pid, "mem": 1_722_613_760}]}]})
    host = pynvml(lib_dir, scenario)
    private = pynvml(lib_dir, scenario, within=PRIVATE)
    assert host["ns"] == OWN_NS and private["ns"] != OWN_NS and private["pid"] == 1
    assert host["compute"] == host["graphics"] == [[tenant.pid, 1_722_613_760, NA, NA]]
    assert private["compute"] == private["graphics"] == private["mps"] == []
    # The memory is the same from both namespaces: v2 used counts the hidden tenant (once,
    # though listed as C+G), v1 used adds the driver's reservation.
    assert host["v1"] == private["v1"] and host["v2"] == private["v2"]
    total, reserved = fakenvml.H200_MEM_TOTAL, fakenvml.H200_RESERVED
    assert private["v2"] == dict(total=total, reserved=reserved, used=1_722_613_760,
                                 free=total - reserved - 1_722_613_760)
    assert private["v1"] == dict(total=total, used=1_722_613_760 + reserved, free=private["v2"]["free"])


def test_a_process_in_the_callers_namespace_is_listed_under_its_namespace_pid(lib_dir, scenario, spawn):
    tenant = spawn(["sleep", "300"])
    _, inner = namespaced_sleeper(spawn)
    fakenvml.write_scenario(scenario, {"gpus": [{"processes": [
        {"kind": "compute", "pid": tenant.pid, "mem": 3 << 30},
        {"kind": "compute", "pid": inner, "mem": 1 << 30},
        {"kind": "mps", "pid": inner, "mem": 1 << 30}]}]})
    host = pynvml(lib_dir, scenario)
    inside = pynvml(lib_dir, scenario, within=["nsenter", f"--target={inner}", "--pid", "--mount"])
    elsewhere = pynvml(lib_dir, scenario, within=PRIVATE)
    assert inside["ns"] == os.stat(f"/proc/{inner}/ns/pid").st_ino != elsewhere["ns"]
    assert host["compute"] == [[tenant.pid, 3 << 30, NA, NA], [inner, 1 << 30, NA, NA]]
    assert host["mps"] == [[inner, 1 << 30, NA, NA]]
    assert inside["compute"] == inside["mps"] == [[1, 1 << 30, NA, NA]]  # the sleep is pid 1 in there
    assert elsewhere["compute"] == elsewhere["mps"] == []
    assert host["v2"]["used"] == inside["v2"]["used"] == elsewhere["v2"]["used"] == 4 << 30


def test_namespace_fields_given_by_hand(lib_dir, scenario):
    other = 4026599999  # a namespace no caller is in
    fakenvml.write_scenario(scenario, {"gpus": [{"processes": [
        {"pid": 5000, "pidns": [fakenvml.PROC_PID_INIT_INO, other], "nspid": [5000, 7]},
        {"pid": 5001, "pidns": other},                  # no nspid: pid 5001 at every level
        {"pid": 5002, "pidns": None},                   # no namespace data: listed to every caller
        {"pid": GHOST}]}]})                             # no such process: listed as given
    host = pynvml(lib_dir, scenario)
    private = pynvml(lib_dir, scenario, within=PRIVATE)
    if OWN_NS == fakenvml.PROC_PID_INIT_INO:
        assert [p[0] for p in host["compute"]] == [5000, 5001, 5002, GHOST]
    assert [p[0] for p in private["compute"]] == [5002, GHOST]


def test_utilization_samples_name_the_host_pid_even_where_the_list_hides_it(lib_dir, scenario, spawn):
    tenant = spawn(["sleep", "300"])
    _, inner = namespaced_sleeper(spawn)
    fakenvml.write_scenario(scenario, {"gpus": [{"util": 99, "processes": [
        {"pid": tenant.pid, "mem": 858_587_136, "sm": 99}, {"pid": inner, "mem": 1 << 30, "sm": 0}]}]})
    body = """
        h = N.nvmlDeviceGetHandleByIndex(0)
        samples = [[s.pid, s.smUtil] for s in N.nvmlDeviceGetProcessUtilization(h, 0)]
        print(json.dumps(dict(view(), samples=samples, util=N.nvmlDeviceGetUtilizationRates(h).gpu)))
    """
    callers = {"host": ((), [tenant.pid, inner]),          # caller: (how to run it, the pids listed)
               "private": (PRIVATE, []),
               "inner": (["nsenter", f"--target={inner}", "--pid", "--mount"], [1])}
    for name, (within, listed) in callers.items():
        out = pynvml(lib_dir, scenario, body, within)
        assert [p[0] for p in out["compute"]] == listed, name
        assert out["samples"] == [[tenant.pid, 99], [inner, 0]], name  # host pids, from every namespace
        assert out["util"] == 99, name


MEASURED = json.loads((pathlib.Path(__file__).parent / "fixtures" / "nvml-pid-namespace-h200.json").read_text())


@pytest.mark.parametrize("state", sorted(MEASURED["states"]))
def test_the_fake_reproduces_what_the_h200_showed(lib_dir, scenario, spawn, state):
    """The same three GPU states, the tenant a real process, seen from both namespaces.

    The scenario gives only what the driver counts (the tenant's memory, its
    sampled SM share, the GPU's utilization); the reservation is the fake's default.
    """
    m = MEASURED["states"][state]
    tenant = None if state == "free" else spawn(["sleep", "300"]).pid
    processes = [] if tenant is None else [
        {"kind": "compute", "pid": tenant, "mem": m["v2_used_both"], "sm": m["utilization_gpu_percent"]}]
    fakenvml.write_scenario(scenario, {"driver": MEASURED["driver"], "gpus": [
        {"util": m["utilization_gpu_percent"], "processes": processes}]})
    body = """
        h = N.nvmlDeviceGetHandleByIndex(0)
        try:
            samples = [s.pid for s in N.nvmlDeviceGetProcessUtilization(h, 0)]
        except N.NVMLError as e:
            samples = "NVML_ERROR_NOT_FOUND" if isinstance(e, N.NVMLError_NotFound) else str(e)
        print(json.dumps(dict(view(), samples=samples, util=N.nvmlDeviceGetUtilizationRates(h).gpu)))
    """
    name = lambda v: [tenant if x == "tenant" else x for x in v] if isinstance(v, list) else v
    for caller, within in (("host", ()), ("private", PRIVATE)):
        out = pynvml(lib_dir, scenario, body, within)
        assert [p[0] for p in out["compute"]] == name(m["compute_list"][caller]), caller
        assert out["v2"]["used"] == m["v2_used_both"] and out["v2"]["reserved"] == m["v2_reserved_both"], caller
        assert out["v1"]["used"] == out["v2"]["used"] + out["v2"]["reserved"], caller
        assert round(out["v1"]["used"] / (1 << 20)) == m["v1_used_mib_both"], caller
        assert out["util"] == m["utilization_gpu_percent"], caller
        assert out["samples"] == name(m["process_utilization_both"]), caller
