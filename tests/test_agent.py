"""The node agent over real sshd hosts, with simulated GPUs whose tenants are real processes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import announce, fleet_json, run_fleet
from tests.harness import fakenvml
from tests.harness.procs import TENANT_USER, local_env, spawn, stop
from tests.harness.sshd import SSHCluster, ensure_user


def unused_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


@pytest.fixture(scope="module")
def gpu_nodes(pytestconfig):
    """Six sshd hosts, each seeing its own simulated GPUs through the real pynvml."""
    ensure_user(TENANT_USER)
    c = SSHCluster(6)
    lib = fakenvml.build(c.dir / "fakenvml")
    tenant = spawn(TENANT_USER, ["sleep", "600"])
    own = spawn(c.user, ["sleep", "600"])
    ghost = unused_pid()
    scenarios = {
        "h01": {"gpus": [{"index": 0, "processes": [{"kind": "compute", "pid": tenant.pid, "mem": 1_700_000_000},
                                                    {"kind": "compute", "pid": own.pid, "mem": 500_000_000}]},
                         {"index": 1}]},
        "h02": {"gpus": [{"index": 0, "mig": 1, "mig_pending": 1,
                          "mig_instances": [{"gi": 1, "ci": 0}, {"gi": 2, "ci": 0}],
                          "processes": [{"kind": "compute", "pid": tenant.pid, "mem": 10**9, "gi": 1, "ci": 0}]}]},
        "h03": {"gpus": [{"index": 0, "arch": 8, "name": "NVIDIA A100-SXM4-80GB"}]},
        "h04": {"gpus": [{"index": 0, "processes": [{"kind": "compute", "pid": ghost, "mem": 3 * 10**9}]}]},
        "h06": {"init_error": 9},
    }
    for h in c.hosts:
        path = c.dir / f"scenario-{h.name}.txt"
        fakenvml.write_scenario(path, scenarios.get(h.name, {"gpus": [{"index": 0}]}))
        env = fakenvml.env(lib, path)
        h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in env.items())
    c.hosts[4].options["SetEnv"] = "PATH=/nonexistent"  # h05: no python3 on the node
    tools = c.standins()
    c.inventory_vars = {"nsys_path": str(tools / "nsys"), "ncu_path": str(tools / "ncu")}
    try:
        c.start()
        announce(pytestconfig, f"started {len(c.hosts)} sshd hosts with simulated GPUs; tenant pid {tenant.pid}")
        yield {"cluster": c, "tenant": tenant.pid, "own": own.pid, "ghost": ghost}
    finally:
        stop([tenant, own])
        c.stop()


def probe_json(c: SSHCluster, *targets: str) -> dict:
    out = run_fleet("probe", ",".join(targets), "--json", env=c.env())
    return {n["host"]: n for n in fleet_json(out.stdout)["nodes"]}, out


def test_tenants_are_listed_with_user_pid_memory_and_foreign(gpu_nodes):
    nodes, out = probe_json(gpu_nodes["cluster"], "h01")
    assert out.returncode == 0, out.stderr
    gpus = nodes["h01"]["state"]["gpus"]
    assert [g["index"] for g in gpus] == [0, 1] and gpus[1]["processes"] == []
    procs = {p["pid"]: p for p in gpus[0]["processes"]}
    tenant, own = procs[gpu_nodes["tenant"]], procs[gpu_nodes["own"]]
    assert (tenant["user"], tenant["foreign"], tenant["used_memory"], tenant["name"]) == (TENANT_USER, True,
                                                                                         1_700_000_000, "sleep")
    assert (own["user"], own["foreign"], own["used_memory"]) == ("fleetci", False, 500_000_000)
    assert gpus[0]["name"] == "NVIDIA H200" and gpus[0]["architecture_name"] == "Hopper"


def test_a_pid_that_cannot_be_resolved_is_foreign(gpu_nodes):
    nodes, _ = probe_json(gpu_nodes["cluster"], "h04")
    [p] = nodes["h04"]["state"]["gpus"][0]["processes"]
    assert p["pid"] == gpu_nodes["ghost"] and p["foreign"] is True and p["user"] is None


def test_mig_mode_and_instances_are_reported_and_ncu_refused(gpu_nodes):
    nodes, _ = probe_json(gpu_nodes["cluster"], "h02")
    g = nodes["h02"]["state"]["gpus"][0]
    assert g["mig_mode"] == {"current": 1, "pending": 1}
    assert [(m["gpu_instance"], m["compute_instance"]) for m in g["mig_instances"]] == [(1, 0), (2, 0)]
    assert g["processes"][0]["gpu_instance"] == 1
    doc = fleet_json(run_fleet("doctor", "h02", "--json", env=gpu_nodes["cluster"].env()).stdout)
    ncu = {v["way"]: v for v in doc["nodes"][0]["verdicts"]}["ncu"]
    assert ncu["status"] == "refused" and any("MIG mode" in r for r in ncu["reasons"])


def test_missing_python_is_a_clear_per_host_error_and_the_others_go_on(gpu_nodes):
    nodes, out = probe_json(gpu_nodes["cluster"], "all")
    assert out.returncode == 1, [(h, n["error"]) for h, n in nodes.items() if n["error"]]  # all reached
    assert nodes["h05"]["error_kind"] == "no-python" and "python3 not found on h05" in nodes["h05"]["error"]
    assert all(nodes[h]["state"] for h in ("h01", "h02", "h03", "h04", "h06"))


def test_nvml_that_fails_to_start_is_a_state_not_a_crash(gpu_nodes):
    nodes, out = probe_json(gpu_nodes["cluster"], "h06")
    nvml = nodes["h06"]["state"]["nvml"]
    assert out.returncode == 0 and nvml["available"] is False and "nvmlInit failed" in nvml["error"]


def test_doctor_refuses_ncu_beside_a_tenant_and_allows_nsys_trace(gpu_nodes):
    c = gpu_nodes["cluster"]
    out = run_fleet("doctor", "h01", env=c.env())
    assert out.returncode == 0
    assert f"pid {gpu_nodes['tenant']} ({TENANT_USER}, 1.7 GB) belongs to another user" in out.stdout
    verdict_lines = {line.split()[0]: line for line in out.stdout.splitlines()[7:] if line.strip()}
    assert "REFUSED" in verdict_lines["ncu"] and "ok" in verdict_lines["nsys-trace"]
    strict = run_fleet("doctor", "h01", "--strict", env=c.env())
    assert strict.returncode == 5


def test_doctor_without_gpu_or_inventory_reports_no_nvml(tmp_path):
    env = {"LD_LIBRARY_PATH": str(tmp_path)}  # an empty directory: no libnvidia-ml here
    out = run_fleet("doctor", "--json", env=env)
    assert out.returncode == 0, out.stderr
    [node] = fleet_json(out.stdout)["nodes"]
    assert node["nvml"]["available"] is False and "libnvidia-ml.so.1" in node["nvml"]["error"]
    assert {v["way"]: v["status"] for v in node["verdicts"]}["ncu"] == "refused"


LISTEN_9400 = ("import socket, time; s = socket.socket(); s.bind(('0.0.0.0', 9400)); s.listen(); "
               "print('listening', flush=True); time.sleep(600)")


def test_local_probe_sees_mps_and_dcgm(tmp_path):
    lib = fakenvml.build(tmp_path / "lib")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server", "nv-hostengine"):
        shutil.copy("/bin/sleep", bindir / name)  # real processes with the daemons' names
    procs = [spawn(None, [str(bindir / n), "300"]) for n in ("nvidia-cuda-mps-control", "nvidia-cuda-mps-server",
                                                             "nv-hostengine")]
    # dcgm-exporter's port, 9400, in a network namespace of the test's own: the machine's port
    # stays free for whatever else runs here, and fleet, started in that namespace, sees it.
    listener = subprocess.Popen(["unshare", "--net", "--", sys.executable, "-c", LISTEN_9400],
                                stdout=subprocess.PIPE, text=True)
    in_namespace = ("nsenter", f"--net=/proc/{listener.pid}/ns/net", "--")
    try:
        assert listener.stdout.readline().strip() == "listening", "the namespace's listener did not start"
        scenario = tmp_path / "s.txt"
        fakenvml.write_scenario(scenario, {"gpus": [{"index": 0, "arch": 7, "processes": [
            {"kind": "compute", "pid": procs[1].pid, "mem": 10**8}]}]})
        env = local_env(fakenvml.env(lib, scenario))
        out = run_fleet("probe", "--json", env=env, prefix=in_namespace)
        state = fleet_json(out.stdout)["nodes"][0]["state"]
        assert state["mps"]["control_daemon"] == [procs[0].pid] and state["mps"]["servers"] == [procs[1].pid]
        assert state["dcgm"]["hostengine"] == [procs[2].pid]
        assert {"port": 9400, "usual_owner": "dcgm-exporter"} in state["dcgm"]["listening"]
        doctor = fleet_json(run_fleet("doctor", "--json", env=env, prefix=in_namespace).stdout)["nodes"][0]
        reasons = " ".join({v["way"]: v for v in doctor["verdicts"]}["ncu"]["reasons"])
        assert "MPS server" in reasons and "MPS control daemon" in reasons and "predate Hopper" in reasons
    finally:
        listener.kill()  # by its pid: the process this test started
        listener.wait()
        stop(procs)


def test_mps_is_reported_over_ssh(gpu_nodes, tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shutil.copy("/bin/sleep", bindir / "nvidia-cuda-mps-control")
    daemon = spawn(None, [str(bindir / "nvidia-cuda-mps-control"), "300"])
    try:
        nodes, _ = probe_json(gpu_nodes["cluster"], "h03")
        assert nodes["h03"]["state"]["mps"]["control_daemon"] == [daemon.pid]
        out = run_fleet("probe", "h03", env=gpu_nodes["cluster"].env())
        assert "[MPS]" in out.stdout.splitlines()[0]
    finally:
        stop([daemon])
