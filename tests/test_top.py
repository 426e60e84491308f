"""fleet top over real sshd hosts whose GPUs are the simulated NVML, replaying an H200's recorded
GPM answers (tests/fixtures/gpm-h200), with tenants that are real processes of another account."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, announce, fleet_json, fleet_json_lines, run_fleet
from tests.harness import fakenvml
from tests.harness.procs import TENANT_USER, descendants, end_frozen, spawn, stop
from tests.harness.sshd import SSHCluster, ensure_user

RECORDED = fakenvml.gpm_recorded


@pytest.fixture(scope="module")
def gpu_hosts(pytestconfig):
    ensure_user(TENANT_USER)
    c = SSHCluster(5)
    lib = fakenvml.build(c.dir / "fakenvml")
    tenant = spawn(TENANT_USER, ["sleep", "600"])
    scenarios = {
        # another user's SGEMM loop: GPM as the H200 gave it beside one
        "h01": {"gpus": [{**RECORDED("gemm"), "processes": [{"pid": tenant.pid, "mem": 698351616, "sm": 90}]},
                         {**RECORDED("idle")}]},
        "h02": {"gpus": [{"index": 0, "mig": 1, "mig_instances": [{"gi": 1, "ci": 0}]}]},
        "h03": {"gpus": [{"index": 0, "arch": 8, "name": "NVIDIA A100-SXM4-80GB", "util": 100}]},
        # memory in use that no process the agent can list explains: a tenant in another PID namespace
        "h04": {"gpus": [{**RECORDED("holding"), "mem_used": 1722613760}]},
        "h05": {"gpus": [{**RECORDED("idle")}]},
    }
    paths = {}
    for h in c.hosts:
        paths[h.name] = c.dir / f"scenario-{h.name}.txt"
        fakenvml.write_scenario(paths[h.name], scenarios[h.name])
        h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in fakenvml.env(lib, paths[h.name]).items())
    tools = c.standins()
    c.inventory_vars = {"nsys_path": str(tools / "nsys"), "ncu_path": str(tools / "ncu")}
    try:
        c.start()
        announce(pytestconfig, f"started {len(c.hosts)} sshd hosts with simulated GPUs for fleet top")
        yield {"cluster": c, "tenant": tenant.pid, "paths": paths, "scenarios": scenarios}
    finally:
        stop([tenant])
        c.stop()


def by_host(lines: list[dict]) -> dict:
    return {d["host"]: d for d in lines}


def test_one_look_names_each_gpu_s_people_its_activity_and_whether_ncu_may_run(gpu_hosts):
    c = gpu_hosts["cluster"]
    r = run_fleet("top", "--once", "--json", "all", env=c.env(), timeout=120)
    assert r.returncode == 0, r.stderr
    hosts = by_host(fleet_json_lines(r.stdout, "top"))
    assert sorted(hosts) == ["h01", "h02", "h03", "h04", "h05"] and not any(h["error"] for h in hosts.values())
    busy, idle = hosts["h01"]["gpus"]
    # GPM's own figures, not the plain 95 % utilization: most SMs busy, few warps resident.
    assert busy["activity"]["source"] == "gpm" and busy["activity"]["utilization"] == 95
    assert (busy["activity"]["sm_activity"], busy["activity"]["sm_occupancy"]) == (89.89, 11.24), busy["activity"]
    [p] = busy["processes"]
    assert (p["pid"], p["user"], p["command"], p["foreign"]) == (gpu_hosts["tenant"], TENANT_USER, "sleep 600", True)
    assert busy["ncu"] == "refused" and not busy["free"]
    assert any(f"pid {gpu_hosts['tenant']} ({TENANT_USER}" in why for why in busy["ncu_reasons"]), busy["ncu_reasons"]
    assert idle["free"] and idle["processes"] == [] and idle["activity"]["sm_activity"] == 0
    [mig] = hosts["h02"]["gpus"]
    assert not mig["free"] and any("MIG" in why for why in mig["ncu_reasons"])
    [old] = hosts["h03"]["gpus"]  # no GPM before Hopper: the plain figure, said as such
    assert old["activity"]["source"] == "utilization" and old["activity"]["utilization"] == 100
    assert "Hopper" in old["activity"]["why"] and old["free"]
    [hidden] = hosts["h04"]["gpus"]
    assert hidden["processes"] == [] and not hidden["free"] and hidden["ncu"] == "refused"
    assert hidden["unseen"] and "1.6 GiB in use by processes not visible" in hidden["unseen"][0], hidden["unseen"]


def test_the_table_says_the_plain_utilization_as_such_and_names_the_tenant(gpu_hosts):
    r = run_fleet("top", "--once", "h01,h03", env=gpu_hosts["cluster"].env(), timeout=120)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()[1:]]  # memory as nvidia-smi says it: the driver's share in
    assert [row[:3] for row in rows] == [["h01", "0", "1.3/140.4"], ["h01", "1", "0.6/140.4"], ["h03", "0", "0.6/140.4"]]
    assert rows[0][3:5] == ["90%", "11%"] and rows[2][3:5] == ["util", "100%"], rows
    assert f"{TENANT_USER}:{gpu_hosts['tenant']}" in r.stdout and "sleep 600" in r.stdout


def test_free_only_leaves_out_every_gpu_someone_else_is_on(gpu_hosts):
    r = run_fleet("top", "--once", "--free", "all", env=gpu_hosts["cluster"].env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert sorted((line.split()[0], line.split()[1]) for line in r.stdout.splitlines()[1:]) == \
        [("h01", "1"), ("h03", "0"), ("h05", "0")], r.stdout


def _read_until(proc: subprocess.Popen, want, limit: int = 400) -> list[dict]:
    seen = []
    for _ in range(limit):
        line = proc.stdout.readline()
        assert line, (seen[-3:], proc.stderr.read() if proc.poll() is not None else "")
        seen += fleet_json_lines(line, "top")
        if want(seen):
            return seen
    raise AssertionError(seen[-3:])


def test_a_tenant_who_arrives_and_leaves_is_seen_in_the_next_sample_over_one_session(gpu_hosts):
    c, path = gpu_hosts["cluster"], gpu_hosts["paths"]["h05"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | c.env()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "top", "--json", "--interval", "0.3", "h05"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = _read_until(proc, lambda s: len(s) >= 2)
        assert first[-1]["gpus"][0]["free"]
        fakenvml.write_scenario(path, {"gpus": [{**RECORDED("gemm"), "processes": [
            {"pid": gpu_hosts["tenant"], "mem": 698351616, "sm": 90}]}]})
        changed_at = first[-1]["seq"]
        arrived = _read_until(proc, lambda s: not s[-1]["gpus"][0]["free"])
        # the sample after the change, or the one after it (a sample may have been under way)
        assert arrived[-1]["seq"] <= changed_at + 2, [d["seq"] for d in arrived]
        assert arrived[-1]["gpus"][0]["processes"][0]["user"] == TENANT_USER
        fakenvml.write_scenario(path, gpu_hosts["scenarios"]["h05"])
        left = _read_until(proc, lambda s: s[-1]["gpus"][0]["free"])
        seqs = [d["seq"] for d in first + arrived + left]
        assert seqs == list(range(len(seqs))), seqs  # one session: its samples one after another, none lost
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        fakenvml.write_scenario(path, gpu_hosts["scenarios"]["h05"])
    assert proc.returncode == 0, proc.stderr.read()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:  # ended meanwhile (an sshd session's helper)
        return b""


def _agents(c: SSHCluster) -> list[int]:
    """The look's agents below this test's sshd daemons (sessions of this cluster only)."""
    return [p for h in c.hosts for p in descendants(h.pid) if b'"mode":"look"' in _cmdline(p)]


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_every_agent_is_gone_soon_after_the_client_goes_however_it_goes(gpu_hosts, how):
    c = gpu_hosts["cluster"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | c.env()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "top", "--json", "--interval", "0.3", "all"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _read_until(proc, lambda s: len({d["host"] for d in s if d["seq"] and d["seq"] >= 2}) == 5)
        running = _agents(c)
        assert len(running) >= 5, running
        proc.send_signal(how)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 10  # a bound for a loaded machine; gone within a second or two here
        while _agents(c) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _agents(c) == [], "agents outlived the look"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_host_that_goes_silent_is_shown_stale_while_the_others_refresh(gpu_hosts):
    c = gpu_hosts["cluster"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | c.env()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "top", "--interval", "0.3", "h01,h05"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    frozen = []
    try:
        seen = ""
        while seen.count("\nh05 ") < 2:
            seen += proc.stdout.readline()
        frozen = [p for p in _agents(c) if p in descendants(c.hosts[4].pid)]
        assert frozen
        for p in frozen:
            os.kill(p, signal.SIGSTOP)  # the node goes silent: its agent sends nothing more
        after = ""
        while "h05: stale (last sample" not in after:
            line = proc.stdout.readline()
            assert line, after
            after += line
        tables = after.split("--- ")
        assert any("\nh01 " in t for t in tables[-2:]), after  # the other host still on the screen
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            end_frozen(proc, frozen)


# --- fleet profile --gpu free: placement by the neighbours the look shows ---

def test_gpu_free_runs_on_each_host_s_free_gpu_and_refuses_a_host_with_none(gpu_hosts, tmp_path):
    env = {**gpu_hosts["cluster"].env(), "FLEET_STORE": str(tmp_path / "store")}
    r = run_fleet("profile", "--hosts", "h01,h02,h04", "--gpu", "free", "--json", "--", "true", env=env, timeout=180)
    assert r.returncode == 6, r.stderr  # partial: one host ran, two were refused
    hosts = {h["host"]: h for h in fleet_json(r.stdout, "profile")["hosts"]}
    assert hosts["h01"]["status"] == "ok", hosts["h01"]
    # GPU 0 has the tenant: GPU 1 was chosen, and the workload saw only it
    assert hosts["h01"]["plan"]["env"]["CUDA_VISIBLE_DEVICES"] == "GPU-fa4e0000-0000-0000-0000-000000000001"
    assert hosts["h01"]["plan"]["placement"].startswith("GPU 1 chosen: nobody else is on it")
    assert hosts["h02"]["status"] == "refused" and "GPU 0 is in MIG mode" in hosts["h02"]["error"], hosts["h02"]
    assert hosts["h04"]["status"] == "refused" and "1.6 GiB in use by processes not visible" in hosts["h04"]["error"]


def test_gpu_free_with_a_count_takes_the_least_busy_free_gpus_and_says_who_was_left_out(gpu_hosts, tmp_path):
    env = {**gpu_hosts["cluster"].env(), "FLEET_STORE": str(tmp_path / "store")}
    r = run_fleet("profile", "--hosts", "all", "--gpu", "free", "--count", "2", "--", "true", env=env, timeout=180)
    assert r.returncode == 0, r.stderr + r.stdout
    # h03's A100 is free but at 100 % utilization: the two idle H200s (h05's GPU 0, h01's GPU 1) are less busy
    assert "h05: ok" in r.stdout and "h01: ok" in r.stdout and "h03:" not in r.stdout, r.stdout
    assert "h03: not in this run: left out: 2 less busy free GPU(s) elsewhere" in r.stderr, r.stderr
    assert "h02: not in this run: --gpu free: no free GPU here: GPU 0: GPU 0 is in MIG mode" in r.stderr, r.stderr
    too_many = run_fleet("profile", "--hosts", "all", "--gpu", "free", "--count", "4", "--", "true", env=env,
                         timeout=180)
    assert too_many.returncode == 5, too_many.stderr  # refused, nothing run
    assert "--gpu free --count 4: only 3 host(s) have a free GPU now (h05, h01, h03)" in too_many.stdout + too_many.stderr

