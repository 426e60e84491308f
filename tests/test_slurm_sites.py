"""fleet profile --partition as real sites configure Slurm, on the test cluster (munge,
slurmctld, two slurmd) reached through a real sshd as its login node: --export=NONE, a job
that can never start, Ctrl-C on a pending job, slurmctld stopped and started mid-run, a node
that goes down under a job."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness.hpc import _wait_running, manifest
from tests.harness.prolog import python36


def env_of(hpc, store: Path, **extra) -> dict:
    return {**hpc.env(), "FLEET_STORE": str(store), **extra}


def start_fleet(hpc, store: Path, *args: str, inventory: Path | None = None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(env_of(hpc, store))
    if inventory:
        env["FLEET_INVENTORY"] = str(inventory)
    return subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--poll", "1", *args], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def job_state(hpc, job: str) -> str:
    return hpc.slurm.run("squeue", "-h", "-t", "all", "-j", job, "-o", "%T", check=False).stdout.strip()


def wait_state(hpc, job: str, want: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while job_state(hpc, job) != want:
        assert time.monotonic() < deadline, f"job {job} never {want}: {job_state(hpc, job)}"
        time.sleep(0.2)


def no_traceback(err: str) -> None:
    for junk in ("Traceback", "never retrieved", "CancelledError", "Task exception"):
        assert junk not in err, err


def test_under_export_none_every_rank_finds_its_python_and_is_profiled(hpc, tmp_path):
    # No ansible_python_interpreter: the login node's python3 is probed, by absolute path, and the
    # job's ranks, started with no PATH at all (--export=NONE), run the agent with it.
    inventory = tmp_path / "inventory.yaml"
    doc = yaml.safe_load(hpc.inventory.read_text())
    del doc["all"]["children"]["cluster"]["hosts"]["h01"]["ansible_python_interpreter"]
    inventory.write_text(yaml.safe_dump(doc))
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--ntasks", "2", "--sbatch-arg=--export=NONE",
                  "--", "true", env=env_of(hpc, tmp_path / "store", FLEET_INVENTORY=str(inventory)), timeout=240)
    assert r.returncode == 0, r.stderr + r.stdout
    python = subprocess.run(["sh", "-c", "command -v python3"], capture_output=True, text=True,
                            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}).stdout.strip()
    assert f"the agent's Python on the compute nodes: {python} (the login node's python3" in r.stderr, r.stderr
    m = manifest(tmp_path / "store")
    assert "#SBATCH --export=NONE" in m["slurm"]["script"] and f"FLEET_PYTHON={python}" in m["slurm"]["script"]
    assert [(h["rank"], h["status"]) for h in m["hosts"]] == [(0, "ok"), (1, "ok")]
    assert all(rep["verified"] for h in m["hosts"] for rep in h["reports"])
    assert f"fleet: the agent runs with {python} on node1" in Path(m["slurm"]["log"]["stored"]).read_text()


def test_a_job_pending_on_a_limit_slurm_never_clears_is_said_cancelled_and_fails(hpc, tmp_path):
    # EnforcePartLimits=NO (Slurm's default): sbatch takes a --time above the partition's MaxTime
    # (debug: 30 minutes), and the job would pend forever.
    config = hpc.slurm.run("scontrol", "show", "config").stdout
    assert re.search(r"^EnforcePartLimits\s*=\s*NO$", config, re.M), "the test cluster must run Slurm's default"
    env = env_of(hpc, tmp_path)
    start = time.monotonic()
    r = run_fleet("profile", "--partition", "debug", "--time", "60", "--poll", "1", "--", "true", env=env)
    assert r.returncode == 1 and time.monotonic() - start < 60, r.stderr + r.stdout
    [said] = [line for line in r.stderr.splitlines() if "can never start" in line]
    assert "PartitionTimeLimit (the job's time limit is above its partition's MaxTime); cancelled it" in said
    no_traceback(r.stderr)
    m = manifest(tmp_path)
    assert m["status"] == "failed" and "PartitionTimeLimit" in m["error"]
    assert job_state(hpc, m["slurm"]["job_id"]) == "CANCELLED"
    # --keep-pending: said, and the job is left in the queue.
    kept = run_fleet("profile", "--partition", "debug", "--time", "60", "--poll", "1", "--keep-pending", "--", "true",
                     env=env_of(hpc, tmp_path / "kept"))
    job = manifest(tmp_path / "kept")["slurm"]["job_id"]
    try:
        assert kept.returncode == 1 and "kept in the queue (--keep-pending)" in kept.stderr, kept.stderr
        assert job_state(hpc, job) == "PENDING"
    finally:
        hpc.slurm.run("scancel", job)


def test_ctrl_c_cancels_a_pending_job_and_no_ctrl_c_gives_a_traceback(hpc, tmp_path):
    # A reason that clears (a begin time): fleet waits, saying it; Ctrl-C then cancels the job.
    proc = start_fleet(hpc, tmp_path, "--partition", "gpu", "--sbatch-arg=--begin=now+1hour", "--", "true")
    try:
        job = _wait_running(tmp_path)["slurm"]["job_id"]
        wait_state(hpc, job, "PENDING")
        time.sleep(3)  # several polls: still waiting
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert f"job {job} PENDING reason=BeginTime" in err, err
    assert job_state(hpc, job) == "CANCELLED" and proc.returncode != 0, err
    no_traceback(err)
    # Twice on a running job: the second leaves at once, cleanly, and says how to gather later.
    proc = start_fleet(hpc, tmp_path / "twice", "--partition", "gpu", "--", "sleep", "30")
    try:
        job = _wait_running(tmp_path / "twice")["slurm"]["job_id"]
        wait_state(hpc, job, "RUNNING")
        proc.send_signal(signal.SIGINT)
        time.sleep(0.3)  # the first is being handled: the job's steps are being stopped
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        hpc.slurm.run("scancel", job, check=False)
    assert proc.returncode == 130 and "fleet gather" in err, err
    no_traceback(err)


def slurmctld_pid(hpc) -> int:
    return int((hpc.slurm.dir / "run" / "slurmctld.pid").read_text())


def test_slurmctld_stopped_mid_run_is_unknown_not_gone_and_the_run_completes(hpc, tmp_path):
    proc = start_fleet(hpc, tmp_path, "--partition", "gpu", "--ntasks", "2", "--", "sleep", "25")
    restarted = False
    try:
        job = _wait_running(tmp_path)["slurm"]["job_id"]
        wait_state(hpc, job, "RUNNING")
        deadline = time.monotonic() + 60  # the ranks' step is running (srun needs slurmctld to start it)
        while f"{job}.0" not in hpc.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%i", check=False).stdout.split():
            assert time.monotonic() < deadline, "the job's step never started"
            time.sleep(0.2)
        time.sleep(2)  # the ranks' profilers are running
        pid = slurmctld_pid(hpc)
        os.kill(pid, signal.SIGTERM)  # the cluster's own slurmctld, by its pid
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        start = time.monotonic()
        jobs = run_fleet("jobs", "--json", env=env_of(hpc, tmp_path), timeout=120)
        took = time.monotonic() - start
        assert jobs.returncode == 0, jobs.stderr
        [row] = fleet_json(jobs.stdout)["jobs"]
        assert (row["job_id"], row["state"], row["reason"]) == (job, "UNKNOWN", "slurmctld not answering"), row
        assert took < 45, took  # bounded: not slurm's own minutes of retries
        table = run_fleet("jobs", env=env_of(hpc, tmp_path), timeout=120)
        assert "UNKNOWN" in table.stdout and "slurmctld not answering" in table.stdout, table.stdout
        time.sleep(5)
        assert proc.poll() is None  # still waiting: the job was never called gone
        hpc.slurm.run("slurmctld", "-i")
        restarted = True
        out, err = proc.communicate(timeout=180)
    finally:
        if not restarted and not Path(f"/proc/{slurmctld_pid(hpc)}").exists():
            hpc.slurm.run("slurmctld", "-i", check=False)
        proc.kill()
    assert "slurmctld not answering since " in err, err
    assert proc.returncode == 0, out + err
    m = manifest(tmp_path)
    assert m["status"] == "complete" and m["slurm"]["state"] == "COMPLETED"
    assert [(h["rank"], h["status"]) for h in m["hosts"]] == [(0, "ok"), (1, "ok")]
    hpc.slurm.wait_idle(timeout=120)


def test_a_node_set_down_under_the_job_fails_the_run_even_with_finished_reports(hpc, tmp_path):
    proc = start_fleet(hpc, tmp_path, "--partition", "gpu", "--nodes", "1", "--sbatch-arg=--no-requeue", "--",
                       "sleep", "40")
    node = None
    try:
        m = _wait_running(tmp_path)
        job = m["slurm"]["job_id"]
        wait_state(hpc, job, "RUNNING")
        node = hpc.slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
        time.sleep(3)  # the rank's profiler is running
        hpc.slurm.run("scontrol", "update", f"nodename={node}", "state=down", "reason=fleet-test")
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        if node:
            hpc.slurm.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    assert proc.returncode != 0, out + err
    m = manifest(tmp_path)
    assert m["slurm"]["state"] == "NODE_FAIL" and m["status"] != "complete", m["status"]
    assert "job ended NODE_FAIL: a node of the job failed" in (m["slurm"]["end"] or "")
    assert "job ended NODE_FAIL" in out
    assert all(h["status"] != "ok" for h in m["hosts"]), m["hosts"]
    hpc.slurm.wait_idle(timeout=120)


def test_what_a_job_writes_into_its_run_folder_is_not_read_as_fleets_and_gather_finishes(hpc, tmp_path):
    # The job writes a result of its own (malformed, naming a rank that does not exist) with lines
    # shaped as fleet's marks for the files it gathers: gather finishes, the ranks are as they
    # were, the forged rank fails with a line, and nothing the marks name is fetched.
    forge = ('d=$(scontrol show job "$SLURM_JOB_ID" | sed -n "s/.*WorkDir=//p"); mkdir -p "$d/node9"; '
             'printf "%s\\n" "{\\"rank\\": 7, \\"slurm_node\\": \\"node9\\", \\"status\\": \\"ok\\", \\"reports\\": [5]}" '
             '"@@ray 1024 $(printf %064d 0) /etc/passwd" "@@slurm 1024 $(printf %064d 0) /etc/shadow" '
             '> "$d/node9/rank7.result.json"')
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--ntasks", "1", "--", "sh", "-c", forge,
                  env=env_of(hpc, tmp_path), timeout=240)
    m = manifest(tmp_path)
    assert r.returncode == 6, r.stderr + r.stdout  # partial: the real rank ok, the forged one failed
    no_traceback(r.stderr)
    [(real, forged)] = [m["hosts"]]
    assert (real["rank"], real["status"]) == (0, "ok") and all(rep["verified"] for rep in real["reports"])
    assert (forged["host"], forged["rank"], forged["status"]) == ("node9", 7, "failed")
    assert "the rank's result is not taken" in forged["missing_why"] and not forged["reports"]
    assert not any(h.get("worker") for h in m["hosts"])  # no "Ray worker" from the forged line
    assert m["slurm"]["log"]["remote"].endswith(f"slurm-{m['slurm']['job_id']}.out")
    stored = [p.name for p in (tmp_path).rglob("*") if p.is_file()]
    assert "passwd" not in stored and "shadow" not in stored


def test_a_killed_ranks_finished_report_is_gathered_and_named(hpc, tmp_path):
    # Rank 1's agent is SIGKILLed right after its nsys finished the report, before it wrote the
    # rank's result (as the OOM killer or Slurm's SIGKILL after KillWait would): the report comes
    # home under its rank and node, and the rank is not ok.
    # The report is renamed into place as nsys ends; the agent then still drains, hashes and runs
    # nsys stats before it writes the result: the watcher kills it in that window.
    die = ('if [ "$SLURM_PROCID" = 1 ]; then agent=$(ps -o ppid= -p $PPID); '
           'rep="$(scontrol show job "$SLURM_JOB_ID" | sed -n "s/.*WorkDir=//p")/$SLURMD_NODENAME/rank1.nsys-rep"; '
           '(while [ ! -s "$rep" ]; do sleep 0.01; done; kill -KILL $agent) </dev/null >/dev/null 2>&1 & '
           'fi; sleep 1')
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--ntasks", "2", "--nodes", "1", "--",
                  "sh", "-c", die, env=env_of(hpc, tmp_path), timeout=240)
    assert r.returncode == 6, r.stderr + r.stdout  # partial
    m = manifest(tmp_path)
    [first, killed] = m["hosts"]
    assert (first["rank"], first["status"]) == (0, "ok")
    assert (killed["host"], killed["rank"], killed["status"]) == (first["host"], 1, "missing"), killed
    assert f"rank 1 on {first['host']} left no result (it was killed first" in killed["missing_why"]
    [rep] = killed["reports"]
    assert rep["verified"] and Path(rep["stored"]).name == "rank1.nsys-rep" and Path(rep["stored"]).is_file()
    assert f"{first['host']} rank 1: missing: rank 1 on {first['host']}" in r.stdout


def test_a_result_forged_linked_or_reshaped_fails_its_rank_alone_and_gather_finishes(hpc, tmp_path):
    # What the job can do to its run's folder, as its user: print a result frame with a guessed
    # nonce (rank 0, claiming it was refused), replace rank 1's result by a link to a copy of it,
    # give rank 2's report a size that is a string, and plant a rank 3 with the guessed nonce.
    guess = "0" * 32
    lie = json.dumps({"wire": 1, "kind": "profile", "body": {
        "status": "refused", "rank": 0, "host": "rank0", "slurm_node": "NODE", "nonce": guess, "reasons": ["forged"]}})
    job_says = ('[ "$SLURM_PROCID" != 0 ] || printf "\\036@@fleet-result@@ %s\\n" "$1" | '
                'sed "s/NODE/$SLURMD_NODENAME/"')
    env = env_of(hpc, tmp_path)
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--ntasks", "3", "--nodes", "1", "--no-wait", "--",
                  "sh", "-c", job_says, "sh", lie, env=env, timeout=240)
    assert r.returncode == 0, r.stderr
    m = manifest(tmp_path)
    job, run_dir = m["slurm"]["job_id"], Path(m["slurm"]["run_dir"])
    deadline = time.monotonic() + 120
    while (state := job_state(hpc, job)) != "COMPLETED":  # asked once a round: it may end between two asks
        assert time.monotonic() < deadline and state in ("PENDING", "RUNNING", "COMPLETING"), state
        time.sleep(0.5)
    [real] = run_dir.glob("*/rank0.result.json")
    node, owner = real.parent, real.stat()
    assert oct(owner.st_mode & 0o777) == "0o600"  # the agent's own file

    def as_job(path: Path, text: str) -> None:
        path.write_text(text)
        path.chmod(0o600)
        os.chown(path, owner.st_uid, owner.st_gid)

    copy = run_dir / "copy.json"
    as_job(copy, (node / "rank1.result.json").read_text())
    (node / "rank1.result.json").unlink()
    (node / "rank1.result.json").symlink_to(copy)
    os.lchown(node / "rank1.result.json", owner.st_uid, owner.st_gid)
    second = node / "rank2.result.json"
    as_job(second, re.sub(r'"size":(\d+)', r'"size":"\1"', second.read_text(), count=1))
    as_job(node / "rank3.result.json", "\x1e@@fleet-result@@ " + lie.replace("NODE", node.name)
           .replace('"rank": 0', '"rank": 3').replace('"rank0"', '"rank3"') + "\n")
    g = run_fleet("gather", m["run_id"], env=env)
    assert g.returncode == 6, g.stdout + g.stderr  # partial: rank 0 ok, every other rank failed alone
    no_traceback(g.stderr)
    ranks = {h["rank"]: h for h in manifest(tmp_path)["hosts"]}
    assert sorted(ranks) == [0, 1, 2, 3], ranks
    assert ranks[0]["status"] == "ok" and all(rep["verified"] for rep in ranks[0]["reports"])  # not the printed lie
    for rank, why in ((1, "rank1.result.json is a symbolic link"), (2, "reports[0].size: not a size"),
                      (3, "does not carry this run's nonce")):
        assert ranks[rank]["status"] == "failed" and why in ranks[rank]["missing_why"], ranks[rank]
        assert not ranks[rank]["reports"] and ranks[rank]["host"] == node.name
        assert f"rank {rank}: failed:" in g.stdout, g.stdout
    assert guess in Path(manifest(tmp_path)["slurm"]["log"]["stored"]).read_text()  # the job did print it


def test_one_bad_manifest_is_skipped_and_named_and_fleet_jobs_lists_the_others(hpc, tmp_path):
    store = tmp_path / "store"
    r = run_fleet("profile", "--partition", "gpu", "--no-wait", "--sbatch-arg=--hold", "--", "true",
                  env=env_of(hpc, store))
    assert r.returncode == 0, r.stderr
    [good] = store.glob("*/*/*/manifest.json")
    job = json.loads(good.read_text())["slurm"]["job_id"]
    try:
        bad = {}
        for name, text in (("20261201-000000-bad1", '{"run_id": "x", "status": "submitted", "hosts": 5}'),
                           ("20261201-000000-bad2", good.read_text()[:40])):  # a wrong type; cut off
            folder = good.parent.parent / name
            folder.mkdir(mode=0o700)
            bad[name] = folder / "manifest.json"
            bad[name].write_text(text)
            bad[name].chmod(0o600)
        elsewhere = json.loads(good.read_text())  # whole, but its cluster is no longer in the inventory
        elsewhere["run_id"], elsewhere["slurm"]["cluster"] = "20261201-000000-else", "retired"
        (good.parent.parent / elsewhere["run_id"]).mkdir(mode=0o700)
        moved = good.parent.parent / elsewhere["run_id"] / "manifest.json"
        moved.write_text(json.dumps(elsewhere))
        moved.chmod(0o600)
        listed = run_fleet("jobs", "--json", env=env_of(hpc, store))
        assert listed.returncode == 0, listed.stderr
        assert [(row["job_id"], row["state"]) for row in fleet_json(listed.stdout)["jobs"]] == [(job, "PENDING")]
        for path in bad.values():
            assert f"fleet: skipped a run whose manifest cannot be read: {path}: " in listed.stderr, listed.stderr
        assert "fleet: skipped run 20261201-000000-else: no Slurm cluster named 'retired'" in listed.stderr
        no_traceback(listed.stderr)
        named = run_fleet("jobs", "20261201-000000-bad1", env=env_of(hpc, store))  # asked for by name: said
        assert named.returncode != 0 and named.stderr.startswith(f"fleet: {bad['20261201-000000-bad1']}: "), named
        no_traceback(named.stderr)
    finally:
        hpc.slurm.run("scancel", job, check=False)


def test_slurm_install_apply_checks_the_python_on_each_node_through_a_step_and_writes_nothing(hpc, tmp_path):
    # Both test nodes share this machine's files: the interpreter below runs as a path missing on
    # node2 alone would (sh's own words, status 127), and as the real python3 on node1.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python3"
    python.write_text('#!/bin/sh\nif [ "$SLURMD_NODENAME" = node2 ]; then echo "sh: 1: $0: not found" >&2; exit 127; fi\n'
                      f'exec {os.path.realpath("/usr/bin/python3")} "$@"\n')
    python.chmod(0o755)
    prefix, log = tmp_path / "etc", tmp_path / "slurm.log"
    r = run_fleet("slurm", "install", "--apply", "--prefix", str(prefix), "--python", str(python), "--log-file",
                  str(log), env=hpc.slurm.env, timeout=180)
    assert r.returncode == 2 and r.stdout == "", r
    assert r.stderr == f"fleet: --python {python} does not start on node2: sh: 1: {python}: not found; nothing written\n", \
        r.stderr
    assert not prefix.exists() and not log.exists()
    # node2's is RHEL 8's 3.6 (the stand-in of tests/harness/prolog.py): named with its version.
    old = python36(tmp_path)
    python.write_text(f'#!/bin/sh\nif [ "$SLURMD_NODENAME" = node2 ]; then exec {old} "$@"; fi\n'
                      f'exec {os.path.realpath("/usr/bin/python3")} "$@"\n')
    r = run_fleet("slurm", "install", "--apply", "--prefix", str(prefix), "--python", str(python), "--log-file",
                  str(log), env=hpc.slurm.env, timeout=180)
    assert r.returncode == 2 and not prefix.exists(), r
    assert r.stderr == (f"fleet: --python {python} on node2 (Python 3.6.8) cannot run fleet's agent: SyntaxError: "
                        "future feature annotations is not defined; the hooks need Python 3.8 or newer; nothing "
                        "written\n"), r.stderr
    good = run_fleet("slurm", "install", "--apply", "--prefix", str(prefix), "--python",
                     os.path.realpath("/usr/bin/python3"), "--log-file", str(log), env=hpc.slurm.env, timeout=180)
    assert good.returncode == 0 and f"wrote {prefix}/node.json" in good.stdout, good.stderr
    hpc.slurm.wait_idle()


@pytest.mark.parametrize("poll", ["1", "40"], ids=["watched", "between-two-looks"])
def test_a_job_requeued_under_the_run_is_said_and_its_last_start_is_gathered(hpc, tmp_path, poll):
    # With a long poll, fleet's look at the queue misses the requeue (RUNNING, PENDING and RUNNING
    # again all fall between two asks): Slurm's own restart count, left by the batch script, says it.
    proc = start_fleet(hpc, tmp_path, "--poll", poll, "--partition", "gpu", "--ntasks", "1", "--", "sleep", "8")
    try:
        job = _wait_running(tmp_path)["slurm"]["job_id"]
        wait_state(hpc, job, "RUNNING")
        time.sleep(3)  # fleet has seen it running
        hpc.slurm.run("scontrol", "requeue", job)  # as Slurm does for a node lost with requeue allowed
        wait_state(hpc, job, "PENDING")
        hpc.slurm.start_requeued_now(job)
        out, err = proc.communicate(timeout=240)
    finally:
        proc.kill()
    m = manifest(tmp_path)
    assert m["slurm"]["requeues"] == 1 and m["slurm"]["state"] == "COMPLETED", (m["slurm"], err)
    assert "Slurm requeued the job 1 time(s): what was gathered is from its last start" in out, out
    assert [(h["rank"], h["status"]) for h in m["hosts"]] == [(0, "ok")], m["hosts"]


def test_under_export_none_each_rank_s_nsys_still_stops_before_the_time_limit(hpc, tmp_path):
    # Under --export=NONE, srun gives its tasks Slurm's own variables and no other: the job's end,
    # which the batch script reads from Slurm, must still reach each rank's agent, for nsys to stop
    # the workload itself (--duration) before the time limit's signal would lose its kernels.
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--time", "2", "--stop-before", "20",
                  "--sbatch-arg=--export=NONE", "--", "sleep", "300", env=env_of(hpc, tmp_path / "store"),
                  timeout=240)
    assert r.returncode == 0, r.stderr + r.stdout
    m = manifest(tmp_path / "store")
    [rank] = m["hosts"]
    assert rank["status"] == "ok" and rank["result"]["stopped"] and not m["slurm"]["stopped_before_time_limit"]
    assert any("by nsys (--duration), its kernels until then kept" in n for n in rank["result"]["notes"]), rank
