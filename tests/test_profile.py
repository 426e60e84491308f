"""fleet profile over real sshd hosts with simulated GPUs and stand-in profilers.

The node state these tests change is real: kernel.perf_event_paranoid of the
machine the tests run on (the kernel_lab: these tests run one after another with
the sysctl's other users), flocks, and the agent's state file.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import re
import time
from pathlib import Path

import pytest
import yaml

from fleet.lab import profile
from fleet.agent import holders, locks
from fleet.inventory import load
from fleet.plan import LabPart, ProfileRequest
from fleet.store import kernel_rows
from fleet.transport import Fanout
from fleet.transport.settings import SSHSettings
from tests.conftest import REPO, fleet_json, recorded_kernels, run_fleet
from tests.harness.lab import fleet, held_entries, kill_fleet_mid_run, scenario, wait_for
from tests.harness.procs import TENANT_USER, kill_recorded, spawn, stop
from tests.harness.quoting import NASTY as NASTY_ARGS
from tests.harness.sysctl import NODE_PATH

# The lab servers (tests/harness/lab.py, a lab for this module), each test's GPUs reset around it.
pytestmark = pytest.mark.usefixtures("clean_gpus")


@pytest.fixture(scope="module")
def lab(kernel_lab):
    """This module's lab sets and puts back the machine's own perf_event_paranoid: fleet's owned
    sysctl tested against the kernel's, not a lab's copy of it."""
    return kernel_lab


def lock_is_free(lab, uuid) -> bool:
    lock = locks.GPULock(uuid, str(lab["locks"]))
    if lock.acquire():
        lock.release()
        return True
    return False


def test_ncu_is_refused_beside_a_tenant_and_nothing_starts(lab):
    scenario(lab, "h03", [{"kind": "compute", "pid": lab["tenant"], "mem": 1_700_000_000}])
    marker = lab["c"].scratch("refused") / "ran"
    out = fleet(lab, "--hosts", "h03", "--tool", "ncu", "--gpu", "0", "--", "touch", str(marker))
    assert out.returncode == 5, out.stderr
    assert f"GPU 0: pid {lab['tenant']} ({TENANT_USER}, 1.7 GB) belongs to another user" in out.stderr
    assert not marker.exists() and lock_is_free(lab, "GPU-h03-0") and held_entries(lab) == {}
    assert lab["paranoid"].read() == "3"


def test_ncu_runs_alone_on_its_gpu_and_the_report_comes_home(lab):
    scenario(lab, "h02", [{"kind": "compute", "pid": lab["tenant"], "mem": 10**9}], gpu=1)  # tenant on GPU 1 only
    out = fleet(lab, "--hosts", "h02", "--tool", "ncu", "--gpu", "0", "--json", "--",
                "sh", "-c", 'echo "visible=$CUDA_VISIBLE_DEVICES"')
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    assert run["status"] == "ok" and "visible=GPU-h02-0" in out.stderr
    rep, metrics = run["reports"]  # the report, and its metrics per kernel as CSV (ncu --import)
    assert rep["verified"] and rep["stored"].endswith(".ncu-rep")
    assert metrics["verified"] and metrics["summary"] == "ncu_raw" and "Kernel Name" in Path(metrics["stored"]).read_text()
    argv = run["plan"]["argv"]  # what fleet ran
    assert argv[argv.index("--clock-control") + 1] == "base"  # always explicit
    assert lock_is_free(lab, "GPU-h02-0")


def test_a_tenant_arriving_after_the_probe_stops_ncu_before_it_starts(lab):
    c = lab["c"]
    hosts = load([c.inventory]).select(["h03"])
    marker = c.scratch("late") / "ran"
    req = ProfileRequest(tool="ncu", command=("touch", str(marker)), run_id="late-tenant", lab=LabPart(gpus=(0,)))

    async def go():
        async with Fanout(SSHSettings(config=str(c.ssh_config))) as fan:
            runs = await profile.plan_all(fan, hosts, req)
            assert runs["h03"].status == "planned"
            scenario(lab, "h03", [{"kind": "compute", "pid": lab["tenant"], "mem": 10**9}])  # arrives now
            await profile.run_planned(fan, hosts, runs, req, out=lab["out"] / "late")
            return runs["h03"]

    run = asyncio.run(go())
    assert run.status == "refused" and "tenant appeared since the probe" in run.error
    assert not marker.exists() and lock_is_free(lab, "GPU-h03-0")


def test_owned_sysctl_is_set_for_the_run_and_restored(lab):
    out = fleet(lab, "--hosts", "h01", "--json", "--", "cat", NODE_PATH)
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    assert run["plan"]["sysctls"] == {"kernel.perf_event_paranoid": 2}
    assert out.stderr.splitlines()[0] == "2"  # what the workload saw
    assert run["result"]["changed"] == {"kernel.perf_event_paranoid": {"from": "3", "to": "2"}}
    assert run["result"]["restored"]["restored"] == {"kernel.perf_event_paranoid": "3"}
    assert lab["paranoid"].read() == "3" and held_entries(lab) == {}


def test_a_sysctl_nobody_owns_is_never_touched(lab, tmp_path):
    doc = yaml.safe_load(lab["c"].inventory.read_text())
    del doc["all"]["children"]["cluster"]["vars"]["owned_sysctls"]
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    out = run_fleet("profile", "--store", str(lab["out"]), "--hosts", "h01", "--json", "--", "cat", NODE_PATH,
                    env={**lab["c"].env(), "FLEET_INVENTORY": str(inv)})
    [run] = fleet_json(out.stdout)["hosts"]
    assert out.stderr.splitlines()[0] == "3" and run["plan"]["sysctls"] == {}
    assert "--sample=none" in run["plan"]["argv"] and "--cpuctxsw=none" in run["plan"]["argv"]
    assert any("CPU sampling" in g for g in run["result"]["given_up"])


def test_fleet_killed_mid_run_still_leaves_the_node_as_it_was(lab):
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(lab["out"]), "--hosts", "h01",
                             "--", "sleep", "2"], env={**os.environ, **lab["c"].env()}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: lab["paranoid"].read() == "2")
    proc.kill()  # SIGKILL: fleet cannot clean up; the agent on the node does
    proc.wait()
    wait_for(lambda: lab["paranoid"].read() == "3" and held_entries(lab) == {})


def test_an_agent_killed_on_the_node_is_repaired_by_fleet_repair(lab):
    pidfile = lab["c"].scratch("workloads") / "repaired.pid"  # the workload's pid, written by itself
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(lab["out"]), "--hosts", "h01",
                             "--", "sh", "-c", 'echo $$ > "$0"; exec sleep 30.25', str(pidfile)],
                            env={**os.environ, **lab["c"].env()}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: held_entries(lab).get("kernel.perf_event_paranoid"))
        [agent] = held_entries(lab)["kernel.perf_event_paranoid"]["holders"]
        os.kill(agent["pid"], signal.SIGKILL)  # the agent dies without putting anything back
        assert lab["paranoid"].read() == "2"
        wait_for(lambda: holders.start_time(agent["pid"]) is None)  # gone (reaped by sshd)
        held = held_entries(lab)
        out = run_fleet("repair", "h01", "--dry-run", env=lab["c"].env())
        assert (out.returncode, out.stdout) == (0, "h01: would put back kernel.perf_event_paranoid=3\n"), out.stderr
        assert lab["paranoid"].read() == "2" and held_entries(lab) == held  # nothing changed, nothing written
        doc = fleet_json(run_fleet("repair", "h01", "--dry-run", "--json", env=lab["c"].env()).stdout, "repair")
        assert doc["dry_run"] and doc["hosts"][0]["value"]["restored"] == {"kernel.perf_event_paranoid": "3"}
        assert lab["paranoid"].read() == "2" and held_entries(lab) == held
        out = run_fleet("repair", "h01", env=lab["c"].env())
        assert out.returncode == 0 and "kernel.perf_event_paranoid=3" in out.stdout, (out.stdout, out.stderr,
                                                                                     held_entries(lab))
        assert lab["paranoid"].read() == "3" and held_entries(lab) == {}
    finally:
        proc.kill()
        proc.wait()
        kill_recorded(pidfile, ["sleep", "30.25"])  # this test's workload, by its pid


def test_two_concurrent_runs_restore_only_when_the_last_ends(lab):
    gates = lab["c"].scratch("gates")
    env = {**os.environ, **lab["c"].env()}

    def start(gate: str):  # a workload that runs until the test opens its gate
        return subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(lab["out"]), "--hosts", "h01",
                                 "--", "sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done', str(gates / gate)],
                                env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    holders = lambda: len(held_entries(lab).get("kernel.perf_event_paranoid", {}).get("holders", []))
    first = start("first")
    wait_for(lambda: holders() == 1)
    second = start("second")
    wait_for(lambda: holders() == 2)
    (gates / "first").touch()
    assert first.wait(timeout=60) == 0, first.stderr.read()
    assert lab["paranoid"].read() == "2" and holders() == 1  # the second run still holds it
    (gates / "second").touch()
    assert second.wait(timeout=60) == 0, second.stderr.read()
    assert lab["paranoid"].read() == "3" and held_entries(lab) == {}


def test_shell_metacharacters_in_the_command_survive(lab):
    target = lab["c"].scratch("meta") / "args"
    out = fleet(lab, "--hosts", "h02", "--", "sh", "-c", 'printf "%s\\0" "$@" > "$0"', str(target), *NASTY_ARGS)
    assert out.returncode == 0, out.stderr
    assert target.read_bytes().split(b"\0")[:-1] == [a.encode() for a in NASTY_ARGS]


def test_an_nsys_killed_while_collecting_fails_keeping_its_data_and_saying_why(lab):
    # SIGKILL to nsys itself while it collects; the workload lives on and keeps nsys's output open.
    # On an H200 test machine the data such an nsys left was refused by QdstrmImporter (exit 2,
    # docs/examples/h200-acceptance/profile-check/6-nsys-killed-collecting.txt): the run failed.
    pidfile = lab["c"].scratch("workloads") / "outlives-nsys.pid"  # the workload's pid, written by itself
    try:
        out = fleet(lab, "--hosts", "h01", "--json", "--", "sh", "-c",
                    'echo $$ > "$0"; kill -KILL $PPID; exec sleep 300.25', str(pidfile))
    finally:
        kill_recorded(pidfile, ["sleep", "300.25"])  # this test's workload, by its pid
    assert out.returncode == 1, out.stdout + out.stderr  # --json: what fleet found is on stdout
    [run] = fleet_json(out.stdout)["hosts"]
    notes = [n for n in run["result"]["notes"] if isinstance(n, str)]
    assert run["status"] == "failed" and not [r for r in run["reports"] if r["status"] != "summary"], run
    assert any("left running" in n for n in notes), notes
    [moved] = [n for n in notes if n.startswith("nsys ended before writing its report; its data ")]
    kept = moved.rsplit(" was moved to ", 1)[1]  # the data nsys left, moved beside the reports
    assert any(n.startswith(f"QdstrmImporter could not finish {kept} (exit 2): Qdstrm file is incomplete or invalid.")
               for n in notes), notes
    # the agent's word for it, which the run's class is read from (completeness), not the notes' words
    [unfinished] = run["result"]["unfinished"]
    assert unfinished.startswith(f"QdstrmImporter could not finish {kept} (exit 2)"), unfinished


def test_a_held_gpu_lock_refuses_naming_the_holder_or_waits(lab):
    lock = locks.GPULock("GPU-h02-1", str(lab["locks"]))
    assert lock.acquire()
    try:
        out = fleet(lab, "--hosts", "h02", "--tool", "ncu", "--gpu", "1", "--", "true")
        assert out.returncode == 5 and f"being profiled by pid {os.getpid()}" in out.stderr
        waiting = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(lab["out"]), "--hosts",
                                    "h02", "--tool", "ncu", "--gpu", "1", "--wait", "20", "--", "true"],
                                   env={**os.environ, **lab["c"].env()}, cwd=REPO, stderr=subprocess.PIPE)
        time.sleep(1.5)
        assert waiting.poll() is None  # still waiting for the lock
    finally:
        lock.release()
    assert waiting.wait(timeout=60) == 0, waiting.stderr.read()


def test_dry_run_prints_the_plan_and_touches_nothing(lab):
    scenario(lab, "h03", [{"kind": "compute", "pid": lab["tenant"], "mem": 10**9}])
    out = fleet(lab, "--hosts", "h02,h03", "--tool", "ncu", "--gpu", "0", "--dry-run", "--", "true")
    assert out.returncode == 6  # h03 refused, h02 planned
    assert "h02: planned" in out.stdout and "--clock-control base" in out.stdout
    assert "h03: refused" in out.stderr and "belongs to another user" in out.stderr
    assert lock_is_free(lab, "GPU-h02-0") and held_entries(lab) == {}


def test_dcgm_is_paused_only_when_asked_and_always_resumed(lab, tmp_path):
    scenario(lab, "h02", arch=8)  # an Ampere node, where DCGM's profiling holds the counters
    shutil.copy("/bin/sleep", tmp_path / "nv-hostengine")
    engine = spawn(None, [str(tmp_path / "nv-hostengine"), "300"])
    try:
        refused = fleet(lab, "--hosts", "h02", "--tool", "ncu", "--gpu", "0", "--", "true")
        assert refused.returncode == 5 and "predate Hopper" in refused.stderr
        assert not lab["dcgm_log"].exists()
        out = fleet(lab, "--hosts", "h02", "--tool", "ncu", "--gpu", "0", "--pause-dcgm", "--json", "--", "true")
        assert out.returncode == 0, out.stderr
        [run] = fleet_json(out.stdout)["hosts"]
        assert run["plan"]["pause_dcgm"] and run["result"]["restored"]["dcgm_resumed"]
        assert lab["dcgm_log"].read_text() == "pause\nresume\n"
        assert json.loads((lab["state"] / "state.json").read_text())["dcgm"] is None
    finally:
        stop([engine])


# --- the report store ---

def test_runs_land_in_the_store_with_a_manifest_and_in_the_catalog(lab, tmp_path):
    store_root = tmp_path / "store"
    scenario(lab, "h03", [{"kind": "compute", "pid": lab["tenant"], "mem": 10**9}])
    runs = []
    for _ in range(2):  # same hosts, same command: the report base names repeat
        out = run_fleet("profile", "--store", str(store_root), "--site", "lab-a", "--hosts", "h02,h03", "--tool",
                        "ncu", "--gpu", "0", "--json", "--", "true", env=lab["c"].env())
        assert out.returncode == 6, out.stderr  # h02 ok, h03 refused: a partial run
        runs.append(fleet_json(out.stdout)["run_id"])
    for run_id in runs:
        day = f"{run_id[:4]}-{run_id[4:6]}-{run_id[6:8]}"
        manifest = json.loads((store_root / "lab-a" / day / run_id / "manifest.json").read_text())
        assert manifest["status"] == "partial" and manifest["request"]["tool"] == "ncu"
        hosts = {h["host"]: h for h in manifest["hosts"]}
        assert "belongs to another user" in hosts["h03"]["missing_why"]
        assert hosts["h03"]["tenants_seen"] and hosts["h02"]["tool_version"] == "2025.3.1.0"
        [rep] = [r for r in hosts["h02"]["reports"] if r["status"] == "complete"]
        stored = Path(rep["stored"])
        assert stored.parent == store_root / "lab-a" / day / run_id / "h02"
        assert hashlib.sha256(stored.read_bytes()).hexdigest() == rep["sha256"]
    listed = fleet_json(run_fleet("reports", "ls", "--store", str(store_root), "--json").stdout)
    assert sorted((r["run_id"], r["host"], r["status"]) for r in listed) == sorted(
        [(r, "h02", "complete") for r in runs] + [(r, "h02", "summary") for r in runs]
        + [(r, "h03", "refused") for r in runs])
    paths = [r["path"] for r in listed if r["status"] == "complete"]
    assert len(set(paths)) == 2  # no collision between the two runs
    only = fleet_json(run_fleet("reports", "ls", "--store", str(store_root), "--host", "h02", "--status", "complete",
                                "--json").stdout)
    assert len(only) == 2 and all(r["sha256"] for r in only)

    shown = run_fleet("reports", "show", runs[0], "--store", str(store_root))
    assert f"run {runs[0]} (partial)" in shown.stdout and "h03: refused (tenant: GPU 0" in shown.stdout
    pulled = run_fleet("reports", "pull", runs[0], str(tmp_path / "out"), "--store", str(store_root))
    assert pulled.returncode == 0 and sorted(p.suffix for p in (tmp_path / "out" / "h02").iterdir()) == [".csv", ".ncu-rep"]

    (store_root / "catalog.sqlite").unlink()  # the manifests are the truth: rebuild from them
    assert "catalogued 2 runs" in run_fleet("reports", "reindex", "--store", str(store_root)).stdout
    again = fleet_json(run_fleet("reports", "ls", "--store", str(store_root), "--json").stdout)
    assert sorted(map(json.dumps, again)) == sorted(map(json.dumps, listed))
    assert run_fleet("reports", "rm", runs[0], "--store", str(store_root)).returncode == 0
    left = fleet_json(run_fleet("reports", "ls", "--store", str(store_root), "--json").stdout)
    assert {r["run_id"] for r in left} == {runs[1]}
    assert not list(store_root.glob(f"lab-a/*/{runs[0]}"))


def test_fleet_gather_brings_home_what_a_killed_fleet_left_on_the_node(lab, tmp_path):
    store_root = tmp_path / "store"
    kill_fleet_mid_run(lab, store_root)
    wait_for(lambda: lab["paranoid"].read() == "3" and held_entries(lab) == {})
    [manifest_path] = store_root.glob("lab/*/*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["status"] == "running" and not manifest["hosts"][0]["reports"]
    out = run_fleet("gather", manifest["run_id"], "--store", str(store_root), env=lab["c"].env())
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = json.loads(manifest_path.read_text())
    [rep] = [r for r in manifest["hosts"][0]["reports"] if r["status"] == "complete"]
    summaries = [r["summary"] for r in manifest["hosts"][0]["reports"] if r["status"] == "summary"]
    assert manifest["status"] == "complete" and rep["verified"]
    assert sorted(summaries) == ["cuda_api_sum", "cuda_gpu_kern_sum", "nvtx_sum"]  # they come home too
    assert hashlib.sha256(Path(rep["stored"]).read_bytes()).hexdigest() == rep["sha256"]


def test_nsys_stats_summaries_are_stored_and_runs_compared(lab, tmp_path):
    store_root = tmp_path / "store"
    runs = []
    for seconds in ("0.2", "1.2"):  # the stand-in's recorded kernels are scaled to the workload's duration
        out = run_fleet("profile", "--store", str(store_root), "--hosts", "h02", "--json", "--", "sleep", seconds,
                        env=lab["c"].env())
        assert out.returncode == 0, out.stderr
        doc = fleet_json(out.stdout)
        runs.append(doc["run_id"])
        summaries = {r["summary"]: r for r in doc["hosts"][0]["reports"] if r["status"] == "summary"}
        assert set(summaries) == {"cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum"}
        assert all(r["verified"] for r in summaries.values())
        assert [k for k, _, _ in kernel_rows(Path(summaries["cuda_gpu_kern_sum"]["stored"]))] == recorded_kernels()
    compared = fleet_json(run_fleet("reports", "compare", *runs, "--store", str(store_root), "--json").stdout)
    assert sorted(k["kernel"] for k in compared) == sorted(recorded_kernels())
    kernel = compared[0]  # the one whose time changed most: the longest, in the longer run
    assert kernel["kernel"] == recorded_kernels()[0] and kernel["b_ns"] > kernel["a_ns"] and kernel["change"] > 1


def test_the_node_keeps_its_report_unless_told_to_remove_it_after_verification(lab, tmp_path):
    doc = yaml.safe_load(lab["c"].inventory.read_text())
    doc["all"]["children"]["cluster"]["hosts"]["h03"]["remove_gathered_reports"] = True
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    env = {**lab["c"].env(), "FLEET_INVENTORY": str(inv)}
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "h02,h03", "--json", "--", "true",
                    env=env)
    assert out.returncode == 0, out.stderr
    for run in fleet_json(out.stdout)["hosts"]:
        for rep in run["reports"]:
            assert rep["verified"] and Path(rep["stored"]).exists()
            assert Path(rep["remote"]).exists() == (run["host"] == "h02")  # h03 asked for removal


def test_reports_on_a_shared_directory_are_read_through_one_host(lab, tmp_path):
    doc = yaml.safe_load(lab["c"].inventory.read_text())
    doc["all"]["children"]["cluster"]["vars"]["shared_report_dir"] = "nfs-scratch"  # all hosts: one machine
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    logs = {h.name: h.log for h in lab["c"].hosts}
    before = {n: p.read_text().count("subsystem 'sftp'") for n, p in logs.items()}
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "h02,h03", "--json", "--", "true",
                    env={**lab["c"].env(), "FLEET_INVENTORY": str(inv)})
    assert out.returncode == 0, out.stderr
    runs = {r["host"]: r for r in fleet_json(out.stdout)["hosts"]}
    assert all(rep["verified"] for r in runs.values() for rep in r["reports"])
    assert {rep.get("read_through") for rep in runs["h03"]["reports"]} == {"h02"}
    after = {n: p.read_text().count("subsystem 'sftp'") for n, p in logs.items()}
    assert after["h03"] == before["h03"] and after["h02"] - before["h02"] == len(runs["h02"]["reports"]) + len(
        runs["h03"]["reports"])


def test_fleet_run_shows_its_progress_and_its_dry_run_plan_as_profile_does(lab, tmp_path):
    """`fleet run PLAYBOOK` printed nothing while it ran (not the workload's lines, not the hosts'
    outcomes), and `--dry-run` printed the raw JSON envelope where `profile --dry-run` prints a plan."""
    book = tmp_path / "bench.yaml"
    book.write_text(yaml.safe_dump({"name": "bench", "target": {"hosts": "h02"}, "tool": "nsys",
                                    "command": ["python3", "-c", "print('the workload says hello')"],
                                    # the workload's version, asked on the host: a leading ~/ is the home there
                                    "version": ["sh", "-c", 'echo "v$((40 + 2)) $1"; echo second', "sh", "~/proj"]}))
    env = lab["c"].env()
    planned = run_fleet("run", str(book), "--dry-run", "--store", str(lab["out"]), env=env)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.startswith("h02: planned\n  run:      ") and "fleet_json" not in planned.stdout, planned.stdout
    as_json = fleet_json(run_fleet("run", str(book), "--dry-run", "--json", "--store", str(lab["out"]), env=env).stdout)
    assert [h["status"] for h in as_json["hosts"]] == ["planned"]
    ran = run_fleet("run", str(book), "--store", str(lab["out"]), env=env)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    lines = ran.stdout.splitlines()
    assert "the workload says hello" in lines  # the workload's own line, as it ran
    assert "h02: ok" in lines and any(line.startswith("  report:   ") for line in lines), ran.stdout
    run_line = next(line for line in lines if line.startswith("run "))
    assert " complete: reports in " in run_line and lines.index("h02: ok") < lines.index(run_line), ran.stdout
    manifest = json.loads((Path(run_line.split(" reports in ", 1)[1].split()[0]) / "manifest.json").read_text())
    assert re.fullmatch(r"v42 /\S+/proj", manifest["playbook"]["version"]), manifest["playbook"]
