"""fleet top on the test Slurm cluster: --job, a look from a step inside a running job of yours
(srun --jobid --overlap), which sees that job's node and GPU, and ends with the look; --partition,
an admin's look at a partition's nodes over SSH, as the inventory reaches each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import yaml

from tests.conftest import REPO, fleet_json, fleet_json_lines, run_fleet
from tests.harness.hpc import hpc  # noqa: F401 (the module's cluster)


def submit_as_user(hpc, *args: str) -> str:
    """A job of the login user's own, submitted on the login node as a person would."""
    r = run_fleet("exec", "h01", "--json", "--", "sbatch", "--parsable", *args, env=hpc.env(), timeout=60)
    assert r.returncode == 0, r.stderr
    return fleet_json_lines(r.stdout)[0]["stdout"].strip().split(";")[0]


def wait_running(hpc, job: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while hpc.slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip() != "RUNNING":
        assert time.monotonic() < deadline, f"job {job} never ran"
        time.sleep(0.2)


def steps(hpc, job: str) -> list[str]:
    out = hpc.slurm.run("squeue", "-h", "-s", "-j", job, "-o", "%j", check=False).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def test_a_look_inside_a_job_shows_its_node_and_only_its_gpu_and_its_step_ends_with_the_look(hpc):
    job = submit_as_user(hpc, "--gres=gpu:1", "--nodes=1", "--wrap", "sleep 300")
    try:
        wait_running(hpc, job)
        node = hpc.slurm.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
        r = run_fleet("top", "--job", job, "--once", "--json", env=hpc.env(), timeout=120)
        assert r.returncode == 0, r.stderr
        [view] = fleet_json_lines(r.stdout, "top")
        # the job's node by Slurm's name, and of its two GPUs only the one Slurm gave the job
        assert view["host"] == node and view["error"] is None, view
        assert [g["index"] for g in view["gpus"]] == [0], view["gpus"]
        assert "fleet-top" not in steps(hpc, job)  # the step ended with the look
    finally:
        hpc.slurm.run("scancel", job, check=False)


def test_ctrl_c_ends_a_streaming_look_inside_a_job_and_its_step(hpc):
    job = submit_as_user(hpc, "--gres=gpu:2", "--nodes=1", "--wrap", "sleep 300")
    wait_running(hpc, job)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | hpc.env()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "top", "--job", job, "--json", "--interval", "0.3"],
                            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for _ in range(3):
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.wait(timeout=30) is not None else ""
            seen.append(fleet_json(line, "top"))
        assert [d["seq"] for d in seen] == [0, 1, 2] and [g["index"] for g in seen[-1]["gpus"]] == [0, 1], seen
        assert "fleet-top" in steps(hpc, job)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while "fleet-top" in steps(hpc, job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "fleet-top" not in steps(hpc, job), "the look's step outlived the look"
        assert proc.returncode == 0, proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        hpc.slurm.run("scancel", job, check=False)


def test_a_job_of_another_user_is_not_looked_into_and_says_so_in_one_line(hpc):
    job = hpc.slurm.run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300").stdout.strip()  # root's job
    try:
        wait_running(hpc, job)
        r = run_fleet("top", "--job", job, "--once", env=hpc.env(), timeout=120)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        [line] = r.stderr.strip().splitlines()
        assert line.startswith(f"fleet: no look inside job {job} from h01: srun: error: "), line
        assert "denied" in line or "not permitted" in line.lower(), line  # Slurm's own refusal, said
    finally:
        hpc.slurm.run("scancel", job, check=False)
    r = run_fleet("top", "--job", "12; rm -rf /", env=hpc.env(), timeout=60)
    assert (r.returncode, r.stderr) == (2, "fleet: --job '12; rm -rf /': a Slurm job id is its number\n")


# --- fleet top --partition: an admin's look at a partition's nodes, over SSH as the inventory reaches them ---

def _admin_inventory(hpc, path):
    """The cluster's inventory with node1 as a host of its own (the same machine's sshd), node2 left out."""
    doc = yaml.safe_load(hpc.inventory.read_text())
    login = doc["all"]["children"]["cluster"]["hosts"]["h01"]
    doc["all"]["children"]["nodes"] = {"hosts": {"node1": {
        "ansible_host": login["ansible_host"], "ansible_port": login["ansible_port"],
        "ansible_python_interpreter": "/usr/bin/python3"}}}
    path.write_text(yaml.safe_dump(doc))
    return {**hpc.env(), "FLEET_INVENTORY": str(path)}


def test_a_partitions_nodes_are_looked_at_over_ssh_and_a_node_the_inventory_lacks_is_said(hpc, tmp_path):
    env = _admin_inventory(hpc, tmp_path / "inventory.yaml")
    r = run_fleet("top", "--partition", "debug", "--once", "--json", env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    [view] = fleet_json_lines(r.stdout, "top")
    # outside any job: the node as SSH reaches it, every GPU of it
    assert view["host"] == "node1" and view["error"] is None and [g["index"] for g in view["gpus"]] == [0, 1], view
    r = run_fleet("top", "--partition", "gpu", "--once", "--json", env=env, timeout=120)
    assert r.returncode == 1, r.stderr  # a node not looked at is not a whole look
    views = {v["host"]: v for v in fleet_json_lines(r.stdout, "top")}
    assert sorted(views) == ["node1", "node2"] and views["node1"]["error"] is None, views
    assert views["node2"]["error"] == ("in partition gpu, but not a host of the inventory: fleet reaches a node "
                                       "over SSH only as the inventory says"), views["node2"]
    table = run_fleet("top", "--partition", "gpu", "--once", env=env, timeout=120)
    assert "node1 " in table.stdout and "node2: in partition gpu, but not a host" in table.stderr, table.stderr


def test_a_node_of_the_same_name_in_another_cluster_is_not_looked_at_as_this_clusters(hpc, tmp_path):
    env = _admin_inventory(hpc, tmp_path / "inventory.yaml")
    doc = yaml.safe_load((tmp_path / "inventory.yaml").read_text())
    login = doc["all"]["children"]["cluster"]["hosts"]["h01"]
    doc["all"]["children"]["other"] = {"hosts": {"o01": dict(login)}, "vars": {"slurm_login": "o01"}}
    doc["all"]["children"]["nodes"]["hosts"]["node1"]["slurm_login"] = "o01"  # the other cluster's node1
    (tmp_path / "inventory.yaml").write_text(yaml.safe_dump(doc))
    r = run_fleet("top", "--partition", "debug", "--cluster", "h01", "--once", "--json", env=env, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    [view] = fleet_json_lines(r.stdout, "top")
    assert view["host"] == "node1" and view["gpus"] == [] and view["error"] == (
        "in partition debug, but the inventory's host node1 is of the cluster whose login node is o01: "
        "not looked at as this cluster's node"), view


def test_a_partition_that_is_not_a_slurm_name_or_has_no_nodes_is_one_line_and_looks_at_nothing(hpc, tmp_path):
    env = _admin_inventory(hpc, tmp_path / "inventory.yaml")
    r = run_fleet("top", "--partition", "gpu;id", "--once", env=env, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("fleet: --partition: 'gpu;id' is not a Slurm name"), r.stderr
    r = run_fleet("top", "--partition", "nosuch", "--once", env=env, timeout=60)
    assert r.returncode != 0 and r.stderr.count("\n") == 1, r.stderr
    assert "partition nosuch has no nodes on h01 (sinfo -p nosuch)" in r.stderr, r.stderr
    r = run_fleet("top", "--partition", "gpu", "--job", "7", env=env, timeout=60)
    assert (r.returncode, r.stderr) == (2, "fleet: give --job (a running job's nodes) or --partition (a partition's "
                                           "nodes), not both\n")


def test_a_task_naming_a_node_it_is_not_or_one_already_named_is_not_believed():
    """The step's tasks run the job's code's neighbours: a frame's host is data. A name not of a
    node's shape is the task's number, and a second task naming the same node says its task, so
    neither look stands in for the other's."""
    from fleet.agent import wire
    from fleet.slurm.look import Tasks

    shown = []
    tasks = Tasks(shown.append)
    for task, host in (("0", "node1"), ("1", "node1"), ("2", "node2\x1b]0;owned\x07"), ("3", "../x")):
        tasks.line(f"{task}: " + wire.frame("look", {"host": host, "seq": 0, "gpus": []}).rstrip("\n"))
    assert [tasks.views[t].host for t in "0123"] == ["node1", "node1 (task 1)", "task 2", "task 3"]
