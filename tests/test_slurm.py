"""fleet profile --partition on a real Slurm cluster (munge, slurmctld, two slurmd), reached
through a real sshd as its login node. Jobs run as the login user; GPUs are simulated by
the fake NVML (loaded by the real pynvml in every task) and GRES backed by device files."""

from __future__ import annotations

import asyncio
import calendar
import csv
import json
import re
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from fleet.inventory import load
from fleet.slurm.jobs import SlurmClient
from fleet.transport import Fanout
from fleet.transport.settings import SSHSettings
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness import fakenvml
from tests.harness.hpc import _wait_running, fleet, manifest
from tests.harness.procs import TENANT_USER
from tests.harness.quoting import NASTY as NASTY_ARGS


def no_drained_nodes(hpc) -> None:
    assert set(hpc.slurm.node_states().values()) <= {"idle", "mixed", "allocated", "completing"}, \
        hpc.slurm.node_states()


def test_four_ranks_on_two_nodes_are_stored_with_distinct_names(hpc, tmp_path):
    command = ["python3", "-c", "import os, sys; print('rank', os.environ['SLURM_PROCID'], sys.argv[1:])",
               *NASTY_ARGS]
    r = fleet(hpc, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--", *command)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert m["status"] == "complete" and m["slurm"]["state"] == "COMPLETED"
    # Filed under the cluster's name (slurm.conf's ClusterName), not the login host's
    assert (m["site"], m["slurm"]["cluster_name"], m["slurm"]["cluster"]) == ("fleetci", "fleetci", "h01")
    assert (tmp_path / "fleetci" / m["day"] / m["run_id"] / "manifest.json").is_file()
    assert [(h["host"], h["rank"], h["status"]) for h in m["hosts"]] == [
        ("node1", 0, "ok"), ("node1", 1, "ok"), ("node2", 2, "ok"), ("node2", 3, "ok")]
    stored = [Path(rep["stored"]) for h in m["hosts"] for rep in h["reports"] if rep["status"] == "complete"]
    assert sorted(p.relative_to(p.parents[1]).as_posix() for p in stored) == [
        "node1/rank0.nsys-rep", "node1/rank1.nsys-rep", "node2/rank2.nsys-rep", "node2/rank3.nsys-rep"]
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"rank {i} {NASTY_ARGS}" in log for i in range(4))  # each rank's workload got the words exactly
    ls = run_fleet("reports", "ls", "--json", env={"FLEET_STORE": str(tmp_path)})
    rows = fleet_json(ls.stdout)
    reports = [row for row in rows if row["path"].endswith(".nsys-rep")]
    assert {row["host"] for row in reports} == {"node1", "node2"} and len(reports) == 4
    assert all(row["status"] == "complete" and len(row["sha256"]) == 64 for row in reports)
    exports = sorted(Path(row["path"]).relative_to(Path(row["path"]).parents[1]).as_posix()
                     for row in rows if row["status"] == "export")  # each rank's SQLite export, gathered too
    assert exports == ["node1/rank0.sqlite", "node1/rank1.sqlite", "node2/rank2.sqlite", "node2/rank3.sqlite"]
    # reports stats: a column per rank, each holding what that rank's kernel summary says
    stats = fleet_json(run_fleet("reports", "stats", m["run_id"], "--json", env={"FLEET_STORE": str(tmp_path)}).stdout)
    assert [c["label"] for c in stats["columns"]] == ["rank 0", "rank 1", "rank 2", "rank 3"]
    for h in m["hosts"]:
        [kern] = [r["stored"] for r in h["reports"] if r.get("summary") == "cuda_gpu_kern_sum"]
        with open(kern, newline="") as f:
            rows = {r["Name"]: float(r["Total Time (ns)"]) for r in csv.DictReader(f)}
        assert rows and {r["name"]: r["by"][f"rank {h['rank']}"]["total_ns"] for r in stats["kernels"]["rows"]} == rows
    no_drained_nodes(hpc)


def test_only_the_chosen_ranks_are_profiled(hpc, tmp_path):
    r = fleet(hpc, tmp_path, "--ntasks", "4", "--ranks", "0,3", "--", "sh", "-c", 'echo "ran $SLURM_PROCID"')
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert [(h["rank"], h["status"]) for h in m["hosts"]] == [(0, "ok"), (3, "ok")]
    assert sorted(Path(rep["stored"]).name for h in m["hosts"] for rep in h["reports"]
                  if rep["status"] == "complete") == ["rank0.nsys-rep", "rank3.nsys-rep"]
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"ran {i}" in log for i in range(4))  # the other ranks ran, unprofiled


def test_a_rank_that_dies_is_missing_and_reports_show_says_why(hpc, tmp_path):
    # Rank 1's agent is killed outright (SIGKILL): it leaves no result; rank 0's report comes home.
    die = 'if [ "$SLURM_PROCID" = 1 ]; then kill -KILL $(ps -o ppid= -p $PPID); fi; sleep 0.3'
    r = fleet(hpc, tmp_path, "--ntasks", "2", "--", "sh", "-c", die)
    assert r.returncode == 6, r.stderr + r.stdout  # partial
    m = manifest(tmp_path)
    assert m["schema"] == 2 and m["status"] == "partial"
    assert [(h["host"], h["rank"], h["status"]) for h in m["hosts"]] == [
        ("node1", 0, "ok"), ("(no result)", 1, "missing")]
    assert set(m["hosts"][0]) == set(m["hosts"][1])  # one shape for every entry
    shown = run_fleet("reports", "show", m["run_id"], env={"FLEET_STORE": str(tmp_path)})
    assert shown.returncode == 0, shown.stderr
    assert "  (no result) rank 1: missing (rank 1 left no result (job FAILED; see slurm-" in shown.stdout
    assert "  node1 rank 0: ok; " in shown.stdout


def test_dry_run_prints_the_exact_batch_script_and_submits_nothing(hpc, tmp_path):
    before = hpc.slurm.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split()
    r = fleet(hpc, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--time", "5", "--dry-run", "--",
              "echo", "a b", "$(x)")
    assert r.returncode == 0, r.stderr
    script = r.stdout
    assert script.startswith("#!/bin/bash\n#SBATCH --job-name=fleet-")
    for line in ("#SBATCH --partition=gpu", "#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --time=5", "#SBATCH --signal=B:USR1@120", "COMMAND=(echo 'a b' '$(x)')",
                 "trap stop_profilers USR1"):
        assert line in script.splitlines(), line
    assert "--exclusive" not in script  # nsys trace shares nodes
    assert hpc.slurm.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split() == before
    assert not list(tmp_path.glob("*/*/*/manifest.json"))
    ncu = fleet(hpc, tmp_path, "--tool", "ncu", "--dry-run", "--", "true")
    assert "#SBATCH --exclusive" in ncu.stdout.splitlines()


def test_unknown_partition_gives_slurms_error(hpc, tmp_path):
    env = {**hpc.env(), "FLEET_STORE": str(tmp_path)}
    r = run_fleet("profile", "--partition", "nope", "--", "true", env=env)
    assert r.returncode == 2  # a usage error: Slurm refused the job's options
    assert "invalid partition specified: nope" in r.stderr
    m = manifest(tmp_path)
    assert m["status"] == "failed" and m["slurm"]["state"] == "NOT SUBMITTED"


def test_job_at_its_time_limit_still_yields_finished_reports(hpc, tmp_path):
    start = time.monotonic()
    # Slurm sends the signal once the time left is under stop-before plus its 30 s check period,
    # at its next check: here between 10 and 40 s into the job, when the profiler is running.
    r = fleet(hpc, tmp_path, "--time", "1", "--stop-before", "20", "--", "sleep", "300", timeout=150)
    assert r.returncode == 0, r.stderr + r.stdout
    assert time.monotonic() - start < 90  # stopped before the limit, not killed at it
    m = manifest(tmp_path)
    assert m["slurm"]["stopped_before_time_limit"]
    [rank] = m["hosts"]
    assert rank["status"] == "ok" and rank["result"]["stopped"]
    [rep] = [rep for rep in rank["reports"] if rep["status"] == "complete"]
    assert rep["verified"] and Path(rep["stored"]).name == "rank0.nsys-rep"
    assert "time limit near" in Path(m["slurm"]["log"]["stored"]).read_text()


def test_nsys_stops_a_long_job_itself_before_the_trap_and_keeps_its_kernels(hpc, tmp_path):
    # A 2-minute job with --stop-before 20: each rank's nsys gets --duration for the time left
    # less 20 s and Slurm's 60 s of slack, about 38 s, so it stops the workload itself before the
    # USR1 trap's signal would (which, on an H200, left a report with no kernels in it).
    r = fleet(hpc, tmp_path, "--time", "2", "--stop-before", "20", "--", "sleep", "300", timeout=200)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    [rank] = m["hosts"]
    assert rank["status"] == "ok" and rank["result"]["stopped"] and not m["slurm"]["stopped_before_time_limit"]
    [said] = [n for n in rank["result"]["notes"] if "by nsys (--duration), its kernels until then kept" in n]
    assert 20 <= int(re.search(r"time limit of (\d+)s", said).group(1)) <= 40, said
    [kern] = [rep for rep in rank["reports"] if rep["stored"].endswith("_cuda_gpu_kern_sum.csv")]
    assert Path(kern["stored"]).read_text().count("\n") > 1  # kernels, where the trap's SIGTERM would leave none


def test_cancelled_job_leaves_clean_state_and_says_so(hpc, tmp_path):
    env = {**hpc.env(), "FLEET_STORE": str(tmp_path)}
    marker = "fleet-cancel-test-%d" % time.time_ns()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--partition", "gpu", "--poll", "1", "--",
                             "sh", "-c", f"exec sleep 300 # {marker}"], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        m = _wait_running(tmp_path)
        job = m["slurm"]["job_id"]
        deadline = time.monotonic() + 60
        while "RUNNING" not in hpc.slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout:
            assert time.monotonic() < deadline, "the job never started"
            time.sleep(0.2)
        jobs = run_fleet("jobs", "--json", env=env)
        # A running job has no reason: squeue's "None" is null, never the string
        assert [(j["job_id"], j["state"], j["reason"], j["cluster"]) for j in fleet_json(jobs.stdout)["jobs"]] == [
            (job, "RUNNING", None, "fleetci")]
        header, row = run_fleet("jobs", env=env).stdout.splitlines()  # for people: a header over the row
        assert header.split()[:4] == ["RUN", "CLUSTER", "JOB", "STATE"]
        assert row.split()[:4] == [m["run_id"], m["site"], job, "RUNNING"], row
        would = run_fleet("cancel", m["run_id"], "--dry-run", env=env)
        assert (would.returncode, would.stdout) == (0, f"fleetci: would cancel job(s) {job}\n"), would.stderr
        doc = fleet_json(run_fleet("cancel", m["run_id"], "--dry-run", "--json", env=env).stdout, "cancel")
        assert doc == {"dry_run": True, "cancelled": [{"cluster": "fleetci", "job_ids": [job]}], "stopped": []}
        time.sleep(2)  # time for a cancellation to show, had there been one
        assert hpc.slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING"
        c = run_fleet("cancel", m["run_id"], env=env)
        assert c.returncode == 0, c.stderr
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    m = manifest(tmp_path)
    assert m["status"] == "cancelled" and m["slurm"]["state"] == "CANCELLED", (out, err)
    assert proc.returncode != 0
    deadline = time.monotonic() + 30  # slurmstepd has ended everything the job started
    while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
        assert time.monotonic() < deadline, "processes of the cancelled job are still running"
        time.sleep(0.2)
    hpc.slurm.wait_idle()


def test_ncu_beside_a_tenant_is_refused_inside_the_job_before_ncu_starts(hpc, tmp_path):
    fakenvml.write_scenario(hpc.scenario, {"gpus": [{"index": 0, "processes": [{"pid": hpc.tenant.pid}]},
                                                    {"index": 1}]})
    try:
        witness = hpc.runs / f"ran-{time.time_ns()}"
        r = fleet(hpc, tmp_path, "--tool", "ncu", "--gres", "gpu:2", "--", "touch", str(witness), root=True)
    finally:
        fakenvml.write_scenario(hpc.scenario, {"gpus": [{"index": 0}, {"index": 1}]})
    assert r.returncode == 5, r.stderr + r.stdout
    m = manifest(tmp_path)
    [rank] = m["hosts"]
    assert rank["status"] == "refused"
    assert any(f"pid {hpc.tenant.pid} ({TENANT_USER}" in t for t in rank["tenants_seen"]), rank
    assert not witness.exists()  # neither ncu nor the workload ran
    assert not list(Path(m["slurm"]["run_dir"]).glob("*/*.ncu-rep"))
    assert "#SBATCH --exclusive" in m["slurm"]["script"]


def test_ncu_on_a_free_gpu_runs_and_its_report_comes_home(hpc, tmp_path):
    r = fleet(hpc, tmp_path, "--tool", "ncu", "--gres", "gpu:1", "--", "true", root=True)
    assert r.returncode == 0, r.stderr + r.stdout
    [rank] = manifest(tmp_path)["hosts"]
    assert [Path(rep["stored"]).name for rep in rank["reports"]] == ["rank0.ncu-rep", "rank0_ncu_raw.csv"]
    assert all(rep["verified"] for rep in rank["reports"]) and rank["reports"][1]["summary"] == "ncu_raw"
    from fleet.nightly.playbook import Metric, ncu_value  # the metrics a playbook tracks come from that CSV
    gemm = Metric("ncu", "gpu__time_duration.sum", kernel="*gemm*")  # what ncu printed on an H200, replayed
    recorded = ncu_value(gemm, REPO / "tests" / "fixtures" / "ncu-raw-h200.csv")
    assert recorded and ncu_value(gemm, Path(rank["reports"][1]["stored"])) == recorded


def test_status_is_one_squeue_call_for_twenty_jobs_and_terminal_states_are_cached(hpc):
    out = [hpc.slurm.run("sbatch", "--parsable", "--hold", "--wrap", "true").stdout.strip() for _ in range(20)]
    inventory = load([hpc.inventory])

    async def go():
        async with Fanout(SSHSettings(config=str(hpc.ssh_config))) as fan:
            client = SlurmClient(fan, inventory.hosts["h01"])
            await client.cluster_info()
            client.calls.clear()
            first = await client.states(out)
            one_poll = list(client.calls)
            hpc.slurm.run("scancel", *out)
            await asyncio.sleep(1)
            ended = await client.states(out)
            client.calls.clear()
            again = await client.states(out)
            return first, one_poll, ended, again, list(client.calls)

    first, one_poll, ended, again, later_calls = asyncio.run(go())
    assert {s.state for s in first.values()} == {"PENDING"} and len(first) == 20
    assert one_poll == ["squeue"]
    assert {s.state for s in ended.values()} == {"CANCELLED"}
    assert later_calls == [] and {s.state for s in again.values()} == {"CANCELLED"}


def test_the_partitions_gres_comes_in_the_one_round_trip_that_asks_the_version(hpc, tmp_path):
    """sinfo's GRES of the partition asked about, as this Slurm says it: the test cluster's nodes
    have two GPUs each, so ncu there is submitted (a partition of nodes without would be refused
    before, tests/test_slurm_states.py), in no more calls to the login node than before."""
    inventory = load([hpc.inventory])

    async def go():
        async with Fanout(SSHSettings(config=str(hpc.ssh_config))) as fan:
            client = SlurmClient(fan, inventory.hosts["h01"])
            asked = [await client.cluster_info(p) for p in ("gpu", "debug", None, "no-such-partition")]
            return [info.gres for info in asked], list(client.calls)

    gres, calls = asyncio.run(go())
    assert gres == [("gpu:2",), ("gpu:2",), (), ()] and calls == ["sinfo"] * 4
    ncu = fleet(hpc, tmp_path, "--tool", "ncu", "--dry-run", "--", "true")
    assert ncu.returncode == 0 and "#SBATCH --exclusive" in ncu.stdout.splitlines(), ncu.stderr

def test_squeue_json_of_this_slurm_parses(hpc):
    from fleet.slurm.jobs import parse_squeue_json

    job = hpc.slurm.run("sbatch", "--parsable", "--hold", "--wrap", "true").stdout.strip()
    try:
        doc = hpc.slurm.run("squeue", "--json").stdout
        assert parse_squeue_json(doc)[job].state == "PENDING"
    finally:
        hpc.slurm.run("scancel", job)


def test_torchrun_workers_are_each_profiled_under_their_own_rank(hpc, tmp_path):
    worker = hpc.runs / "worker.py"
    # The worker says what started it: nsys, where nsys wraps the worker itself, not torchrun.
    worker.write_text("import os\nparent = open(f'/proc/{os.getppid()}/cmdline').read().split(chr(0))[:2]\n"
                      "print('worker', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], 'under',\n"
                      "      'nsys' if 'nsys' in map(os.path.basename, parent) else parent)\n")
    worker.chmod(0o644)
    r = fleet(hpc, tmp_path, "--nodes", "2", "--launcher", "torchrun", "--",
              "torchrun", "--nnodes", "2", "--nproc-per-node", "2", str(worker))
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert [(h["host"], h["rank"], h["status"]) for h in m["hosts"]] == [
        ("node1", 0, "ok"), ("node1", 1, "ok"), ("node2", 2, "ok"), ("node2", 3, "ok")]
    for h in m["hosts"]:
        [rep] = [rep for rep in h["reports"] if rep["status"] == "complete"]
        assert Path(rep["stored"]).name == f"rank{h['rank']}.nsys-rep"
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"worker {i} of 4 under nsys" in log for i in range(4)), log


def test_no_wait_returns_the_job_and_gather_brings_the_reports_home_later(hpc, tmp_path):
    r = fleet(hpc, tmp_path, "--no-wait", "--ntasks", "2", "--", "true")
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path)
    assert m["status"] == "submitted" and f"job {m['slurm']['job_id']}" in r.stdout
    env = {**hpc.env(), "FLEET_STORE": str(tmp_path)}
    deadline = time.monotonic() + 60
    while True:
        g = run_fleet("gather", m["run_id"], env=env)
        if g.returncode != 6:  # 6: the job has not ended yet
            break
        assert time.monotonic() < deadline, g.stdout
        time.sleep(0.5)
    assert g.returncode == 0, g.stdout + g.stderr
    m = manifest(tmp_path)
    assert m["status"] == "complete" and [h["rank"] for h in m["hosts"]] == [0, 1]
    assert all(rep["verified"] for h in m["hosts"] for rep in h["reports"])


def test_ray_workers_reports_named_by_its_runtime_env_block_are_gathered(hpc, tmp_path):
    # Stands in for Ray: each "worker" runs nsys with the options of the _nsight block, as Ray does.
    fake_ray = hpc.runs / "fake_ray.py"
    fake_ray.write_text(
        "import json, os, subprocess\n"
        "opts = json.loads(os.environ['FLEET_RAY_RUNTIME_ENV'])['_nsight']\n"
        "args = [w for k, v in opts.items() if k != 'o' for w in ((f'--{k}={v}',) if len(k) > 1 else (f'-{k}', v))]\n"
        "for _ in range(2):\n"
        "    subprocess.run(['nsys', 'profile', *args, '-o', opts['o'], 'true'], check=True)\n")
    fake_ray.chmod(0o644)
    r = fleet(hpc, tmp_path, "--launcher", "ray", "--", "python3", str(fake_ray))
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    workers = [h for h in m["hosts"] if h.get("worker")]
    assert len(workers) == 2 and len({h["worker"] for h in workers}) == 2  # one report per worker, distinct
    assert all(h["reports"][0]["verified"] and h["worker"].startswith("worker-") for h in workers)
    assert {h["host"] for h in workers} == {socket.gethostname()}  # the node, from worker-HOST-PID


def test_reports_written_to_node_local_scratch_come_home_through_the_run_directory(hpc, tmp_path):
    scratch = hpc.scratch("node-local")
    inventory = tmp_path / "inventory.yaml"
    doc = yaml.safe_load(hpc.inventory.read_text())
    doc["all"]["children"]["cluster"]["hosts"]["h01"]["slurm_scratch"] = str(scratch)
    inventory.write_text(yaml.safe_dump(doc))
    env = {**hpc.env(), "FLEET_STORE": str(tmp_path / "store"), "FLEET_INVENTORY": str(inventory)}
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--nodes", "2", "--ntasks-per-node", "1", "--",
                  "true", env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path / "store")
    assert "srun --ntasks-per-node=1" in m["slurm"]["script"] and str(scratch) in m["slurm"]["script"]
    assert [(h["host"], h["rank"], h["status"]) for h in m["hosts"]] == [("node1", 0, "ok"), ("node2", 1, "ok")]
    assert all(rep["verified"] for h in m["hosts"] for rep in h["reports"])
    assert not any(scratch.rglob("*.nsys-rep"))  # moved off the nodes once copied


def test_probe_and_doctor_reach_a_partitions_compute_nodes_as_a_short_job(hpc, tmp_path):
    env = hpc.env()
    out = run_fleet("probe", "--partition", "gpu", "--json", env=env)
    assert out.returncode == 0, out.stderr
    nodes = fleet_json(out.stdout, "probe")["nodes"]
    assert [(n["host"], n["error"]) for n in nodes] == [("node1", None), ("node2", None)]
    assert all(len(n["state"]["gpus"]) == 2 for n in nodes), nodes  # each node's own (simulated) GPUs
    text = run_fleet("probe", "--partition", "gpu", "--nodes", "1", env=env)
    assert text.returncode == 0 and text.stdout.startswith("node1") and "node2" not in text.stdout, text
    doctor = run_fleet("doctor", "--partition", "gpu", "--nodes", "1", "--json", env=env)
    assert doctor.returncode == 0, doctor.stderr
    [node] = fleet_json(doctor.stdout, "doctor")["nodes"]
    # As for a lab server, examined where the agent ran: inside the probe's job, on node1
    assert node["host"] == "node1" and "inside Slurm job" in node["problems"]["wrapping"]["text"]
    assert [v["way"] for v in node["verdicts"]] == ["nsys-trace", "nsys-cpu-sampling", "nsys-gpu-metrics", "ncu"]
    for args, said in ((("--partition", "gpu", "h01"), "not both"), (("--nodes", "2"), "give --partition too"),
                       (("--partition", "gpu;id"), "is not a Slurm name")):
        bad = run_fleet("probe", *args, env=env)
        assert bad.returncode == 2 and said in bad.stderr and bad.stderr.count("\n") == 1, bad
    no_drained_nodes(hpc)


def test_fleet_cancel_20_times_gives_every_rank_the_same_verdict(hpc, tmp_path):
    """fleet cancel records its stop in the run folder before scancel's SIGTERM: a rank whose agent
    saw its profiler end before its own signal read `workload-failed` beside three `ok` ranks,
    some of the time. Twenty cancels of four running ranks, each run's ranks all stopped by fleet:
    five rounds of four jobs side by side (the cluster's 16 cores), each cancelled on its own. A
    round's four are submitted at once: each waits mostly for Slurm to start it."""
    seen = []
    for round_ in range(5):
        with ThreadPoolExecutor(4) as pool:
            runs = list(pool.map(lambda k: _running_job(hpc, tmp_path / f"run{round_}-{k}",
                                                        f"fleet-cancel-race-{round_}-{k}-{time.time_ns()}"), range(4)))
        for store, m in runs:
            env = {**hpc.env(), "FLEET_STORE": str(store)}
            assert run_fleet("cancel", m["run_id"], env=env).returncode == 0
            assert Path(m["slurm"]["run_dir"], "job.stop-asked").is_file()  # recorded, and before the signal
        for store, m in runs:
            env = {**hpc.env(), "FLEET_STORE": str(store)}
            deadline = time.monotonic() + 60
            while hpc.slurm.run("squeue", "-h", "-j", m["slurm"]["job_id"], "-o", "%T", check=False).stdout.strip():
                assert time.monotonic() < deadline, "the cancelled job never ended"
                time.sleep(0.2)
            gathered = run_fleet("gather", m["run_id"], env=env)
            m = manifest(store)
            assert m["status"] == "cancelled", gathered.stdout + gathered.stderr
            seen.append(sorted((h["rank"], h["status"], h.get("missing_why")) for h in m["hosts"]))
    assert len(seen) == 20 and all([status for _, status, _ in ranks] == ["ok"] * 4 for ranks in seen), seen
    hpc.slurm.wait_idle()


def _running_job(hpc, store: Path, marker: str) -> tuple[Path, dict]:
    """A run of four ranks submitted (--no-wait), returned once every rank's workload runs under its
    profiler: its store and manifest."""
    r = fleet(hpc, store, "--no-wait", "--ntasks", "4", "--", "sh", "-c", f"sleep 300; : {marker}")
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 60
    while len(subprocess.run(["pgrep", "-f", f"^sh -c sleep 300; : {marker}$"], capture_output=True,
                             text=True).stdout.split()) < 4:
        assert time.monotonic() < deadline, "the ranks' workloads never all started"
        time.sleep(0.1)
    return store, manifest(store)


def test_four_ranks_each_take_their_nvtx_windows_and_run_on(hpc, tmp_path):
    """--nvtx-window on Slurm: every rank's nsys collects within the rank's own `step` ranges (two,
    --repeat 2), each window its own report, and the ranks run on to their end."""
    steps = 'for i in 1 2 3; do sleep 0.3; echo step >> "$STANDIN_NVTX_LOG"; done; echo "rank $SLURM_PROCID ran on"'
    r = fleet(hpc, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--nvtx-window", "step", "--repeat", "2",
              "--", "sh", "-c", steps)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert m["status"] == "complete" and [h["status"] for h in m["hosts"]] == ["ok"] * 4, m["hosts"]
    stored = sorted(Path(rep["stored"]).relative_to(Path(rep["stored"]).parents[1]).as_posix()
                    for h in m["hosts"] for rep in h["reports"] if rep["stored"].endswith(".nsys-rep"))
    assert stored == [f"{node}/rank{rank}.{k}.nsys-rep" for node, rank in
                      (("node1", 0), ("node1", 1), ("node2", 2), ("node2", 3)) for k in (1, 2)]
    assert all("nsys collected 2 windows (NVTX range 'step'), and the workload went on to its end"
               in h["result"]["notes"] for h in m["hosts"])
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"rank {i} ran on" in log for i in range(4))
    no_drained_nodes(hpc)


def test_a_rank_that_opens_no_window_fails_it_and_the_others_windows_are_kept(hpc, tmp_path):
    steps = '[ "$SLURM_PROCID" -lt 2 ] && echo step >> "$STANDIN_NVTX_LOG"; sleep 0.3; echo "rank $SLURM_PROCID ended"'
    r = fleet(hpc, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--nvtx-window", "step", "--", "sh", "-c", steps)
    assert r.returncode != 0, r.stdout
    m = manifest(tmp_path)
    assert m["status"] == "partial", m["status"]
    assert [(h["rank"], h["status"]) for h in m["hosts"]] == [(0, "ok"), (1, "ok"), (2, "failed"), (3, "failed")]
    for h in m["hosts"][2:]:
        assert ("no window was taken: the workload never opened one (NVTX range 'step') while nsys ran, and nsys "
                "collects nothing outside it") in h["result"]["reasons"]
    assert all([rep for rep in h["reports"] if rep["stored"].endswith("rank%d.nsys-rep" % h["rank"])]
               for h in m["hosts"][:2])
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"rank {i} ended" in log for i in range(4)) and "Traceback" not in log, log
    no_drained_nodes(hpc)


def test_four_ranks_take_the_same_time_window_and_run_on(hpc, tmp_path):
    """--window on Slurm: the window counts from one moment of the batch script's, so every rank's
    nsys collects the same seconds, whenever srun started it, exits with its report written, and
    the rank's agent stays with the workload to its end."""
    # START 6 s: time for srun to start every rank and its agent to probe, on a loaded 2-core machine (a rank
    # past the moment starts at once, and its note does not claim the others' moment)
    work = 'sleep 9; echo "rank $SLURM_PROCID after the window"'
    r = fleet(hpc, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--window", "6:1", "--", "sh", "-c", work)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert m["status"] == "complete" and [h["status"] for h in m["hosts"]] == ["ok"] * 4, m["hosts"]
    said = [n for h in m["hosts"] for n in h["result"]["notes"] if "(--window" in n]
    starts = {re.search(r"nsys collected 1s from (\S+) \(--window, the moment every rank's window starts\)", n).group(1)
              for n in said}
    assert len(said) == 4 and len(starts) == 1, said  # one moment for every rank
    at = calendar.timegm(time.strptime(starts.pop(), "%Y-%m-%dT%H:%M:%SZ"))
    for h in m["hosts"]:
        [report] = [rep for rep in h["reports"] if rep["stored"].endswith(".nsys-rep")]
        written = json.loads(Path(report["stored"]).read_text())
        assert written["window_ended"] and written["kernels"] and written["options"]["--kill"] == "none", written
        # each rank's nsys began collecting at that moment, its own delay counted from its own start
        assert abs(written["started"] + float(written["options"]["--delay"]) - at) < 1.5, (written, at)
        assert any(n.endswith("and ended by itself (exit status 0)") for n in h["result"]["notes"]), h["result"]
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"rank {i} after the window" in log for i in range(4))
    no_drained_nodes(hpc)


def test_four_ranks_each_take_their_cuda_profiler_window(hpc, tmp_path):
    """--cuda-profiler-window on Slurm: every rank's nsys collects from its own cudaProfilerStart() to its
    cudaProfilerStop(), one report a rank, and the rank runs on after it."""
    api = ('sleep 0.3; echo start >> "$STANDIN_CUDA_PROFILER_LOG"; sleep 0.3; echo stop >> "$STANDIN_CUDA_PROFILER_LOG";'
           ' sleep 0.3; echo "rank $SLURM_PROCID ran on"')
    r = fleet(hpc, tmp_path, "--nodes", "2", "--ntasks-per-node", "2", "--cuda-profiler-window", "--", "sh", "-c", api)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path)
    assert m["status"] == "complete" and [h["status"] for h in m["hosts"]] == ["ok"] * 4, m["hosts"]
    stored = sorted(Path(rep["stored"]).relative_to(Path(rep["stored"]).parents[1]).as_posix()
                    for h in m["hosts"] for rep in h["reports"] if rep["stored"].endswith(".nsys-rep"))
    assert stored == ["node1/rank0.nsys-rep", "node1/rank1.nsys-rep", "node2/rank2.nsys-rep", "node2/rank3.nsys-rep"]
    assert all("nsys collected 1 window (cudaProfilerStart() to cudaProfilerStop()), and the workload went on to its "
               "end" in h["result"]["notes"] for h in m["hosts"])
    log = Path(m["slurm"]["log"]["stored"]).read_text()
    assert all(f"rank {i} ran on" in log for i in range(4))
    no_drained_nodes(hpc)
