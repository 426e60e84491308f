"""fleet's Slurm prolog and epilog: a job's untrusted request read by root, tried directly
(as slurmd would run them: as root, with slurmd's environment), then on a real Slurm cluster
with Prolog, Epilog and TaskProlog installed by `fleet slurm install --apply`.

The sysctl is real: kernel.perf_event_paranoid of this machine, set to 3 for the tests and put
back after."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fleet.agent import nodeconfig, slurmd
from fleet.agent.wire import answers
from tests.conftest import announce, run_fleet
from tests.harness.procs import TENANT_USER
from tests.harness.prolog import PARANOID, python36, run, write_request
from tests.harness.slurm import SlurmCluster
from tests.harness.sshd import TEST_USER, ensure_user

NOT_OWNED = Path("/proc/sys/kernel/kptr_restrict")
# The node's files come from the `node` fixture (tests/harness/prolog.py).
pytestmark = pytest.mark.usefixtures("paranoid_3")  # the machine's value put back however the tests end


def test_an_opted_in_job_holds_the_owned_sysctl_until_its_epilog(node):
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": ["kernel.perf_event_paranoid"]})
    assert run(node, "prolog") == 0
    assert PARANOID.read_text().strip() == "2"
    verdict = json.loads((Path(node["config"]["jobs_dir"]) / "4242" / "verdict.json").read_text())
    assert verdict["job"] == "4242" and verdict["tenants"] == []
    assert slurmd.task_prolog(node["env"], nodeconfig.load_config(node["config_path"])) == [
        f"export FLEET_PROLOG_VERDICT={node['config']['jobs_dir']}/4242/verdict.json"]
    assert run(node, "epilog") == 0
    assert PARANOID.read_text().strip() == "3"
    assert not (Path(node["config"]["jobs_dir"]) / "4242").exists()
    assert run(node, "epilog") == 0 and PARANOID.read_text().strip() == "3"  # idempotent


def test_a_malformed_request_is_logged_and_ignored(node):
    write_request(node, {"fleet": 1})
    (node["work"] / slurmd.REQUEST_NAME).write_text("{not json")
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "3"
    assert "ignored_request" in node["log"].read_text() and "not JSON" in node["log"].read_text()


def test_a_job_without_a_request_is_untouched(node):
    assert run(node, "prolog") == 0
    assert PARANOID.read_text().strip() == "3"
    assert not Path(node["config"]["jobs_dir"]).exists() and not node["log"].exists()


def test_a_request_cannot_choose_values_or_sysctls_the_node_does_not_own(node):
    other = NOT_OWNED.read_text().strip()
    write_request(node, {"fleet": 1, "sysctls": ["kernel.perf_event_paranoid", "kernel.kptr_restrict"],
                         "kernel.perf_event_paranoid": -1, "values": {"kernel.perf_event_paranoid": -1},
                         "run": "touch /root/pwned"})
    assert run(node, "prolog") == 0
    assert PARANOID.read_text().strip() == "2"  # the config's value, not the request's
    assert NOT_OWNED.read_text().strip() == other and not Path("/root/pwned").exists()
    assert "ignored_sysctls" in node["log"].read_text() and '"kernel.kptr_restrict"' in node["log"].read_text()


def test_a_planted_symlink_or_someone_elses_file_is_not_read(node):
    secret = node["root"] / "root-only.json"  # a valid request the job's user cannot read
    secret.write_text(json.dumps({"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]}))
    secret.chmod(0o600)
    (node["work"] / slurmd.REQUEST_NAME).symlink_to(secret)
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "3"
    assert "ignored_request" in node["log"].read_text()  # refused, and said so (it was silent)
    (node["work"] / slurmd.REQUEST_NAME).unlink()
    write_request(node, {"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]}, owner=pwd.getpwnam(TENANT_USER))
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "3"
    # A working directory that is a symlink into a directory only root can read.
    hidden = node["root"] / "hidden"
    hidden.mkdir(mode=0o700)
    (hidden / slurmd.REQUEST_NAME).write_text(json.dumps({"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]}))
    os.chown(hidden / slurmd.REQUEST_NAME, node["user"].pw_uid, node["user"].pw_gid)
    (node["root"] / "link").symlink_to(hidden)
    node["env"]["SLURM_JOB_WORK_DIR"] = str(node["root"] / "link")
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "3"


def test_fleets_own_directories_must_be_roots(node):
    write_request(node, {"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]})
    jobs = Path(node["config"]["jobs_dir"])
    jobs.mkdir(mode=0o777)
    jobs.chmod(0o777)  # another account could plant a job's files here
    assert run(node, "prolog") == 0  # logged, the node stays in service, and nothing was set
    assert PARANOID.read_text().strip() == "3"
    assert "must be a directory owned by root" in node["log"].read_text()
    node["env"]["SLURM_JOB_ID"] = "../../etc"
    assert run(node, "prolog") == 0 and "not run by slurmd" in node["log"].read_text()


@pytest.mark.parametrize("broken", ["{not json", "[" * 400_000 + "]" * 400_000])  # a 400,000-deep node.json
def test_a_broken_config_is_logged_and_the_node_stays_in_service(node, broken):
    Path(node["config_path"]).write_text(broken)
    write_request(node, {"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]})
    default_log = Path(nodeconfig.DEFAULTS["log_file"])  # the config could not say where: the default
    before = default_log.read_text() if default_log.exists() else ""
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "3"
    assert "is not JSON" in default_log.read_text()[len(before):]


# --- on a real Slurm cluster ---

@pytest.fixture(scope="module")
def cluster(pytestconfig):
    user = ensure_user(TEST_USER)
    prefix = Path(tempfile.mkdtemp(prefix="fleet-slurm-etc-"))
    prefix.chmod(0o755)
    state = Path(tempfile.mkdtemp(prefix="fleet-slurm-state-"))
    state.chmod(0o755)  # as /run is: the job's user reads its verdict below it
    # The nodes' Python through a link a test can break after the install.
    pybin = Path(tempfile.mkdtemp(prefix="fleet-slurm-py-"))
    pybin.chmod(0o755)
    (pybin / "python3").symlink_to(os.path.realpath("/usr/bin/python3"))
    install = run_fleet("slurm", "install", "--apply", "--no-node-check", "--prefix", str(prefix),  # Slurm starts after
                        "--python", str(pybin / "python3"),
                        "--owned-sysctl",
                        "kernel.perf_event_paranoid=2", "--jobs-dir", str(state / "jobs"), "--state-dir",
                        str(state / "owned"), "--log-file", str(state / "slurm.log"))
    assert install.returncode == 0, install.stderr
    conf = "\n".join(line.split("#")[0].strip() for line in install.stdout.splitlines()
                     if line.startswith(("Prolog", "Epilog", "TaskProlog", "PrologFlags")))
    s = SlurmCluster(1, extra_conf=conf)
    try:
        s.start()
        s.user, s.prefix, s.state, s.pybin = user, prefix, state, pybin
        s.work = Path(tempfile.mkdtemp(prefix="fleet-slurm-work-"))
        s.work.chmod(0o777)
        announce(pytestconfig, f"started Slurm with fleet's Prolog/Epilog/TaskProlog from {prefix}")
        yield s
    finally:
        s.stop()
        for d in (prefix, state, pybin, getattr(s, "work", None)):
            if d:
                shutil.rmtree(d, ignore_errors=True)


def job_dir(cluster, name: str, opted_in: bool) -> Path:
    d = cluster.work / name
    d.mkdir(mode=0o755)
    if opted_in:
        (d / slurmd.REQUEST_NAME).write_text(json.dumps({"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]}))
    subprocess.run(["chown", "-R", f"{cluster.user.pw_uid}:{cluster.user.pw_gid}", str(d)], check=True)
    return d


def sbatch(cluster, d: Path, script: str, *args: str) -> str:
    (d / "job.sh").write_text("#!/bin/sh\n" + script)
    return cluster.run("runuser", "-u", cluster.user.pw_name, "--", "env", f"SLURM_CONF={cluster.conf}",
                       "sbatch", "--parsable", f"--chdir={d}", "-o", str(d / "out.txt"), *args,
                       str(d / "job.sh")).stdout.strip()


def wait_gone(cluster, *jobs: str, timeout: float = 150) -> None:
    deadline = time.monotonic() + timeout
    while cluster.run("squeue", "-h", "-j", ",".join(jobs), "-o", "%i", check=False).stdout.strip():
        assert time.monotonic() < deadline, f"jobs {jobs} still in the queue"
        time.sleep(0.2)


def wait_for(predicate, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.2)


def restored() -> bool:
    return PARANOID.read_text().strip() == "3"


def no_drain(cluster) -> None:
    states = cluster.node_states()
    assert not any("drain" in s or s in ("down", "fail") for s in states.values()), states


def test_opted_in_job_sees_the_sysctl_during_the_job_and_it_is_restored_after(cluster):
    d = job_dir(cluster, "opted", True)
    job = sbatch(cluster, d, 'cat /proc/sys/kernel/perf_event_paranoid; echo "verdict=$FLEET_PROLOG_VERDICT"\n')
    wait_gone(cluster, job)
    out = (d / "out.txt").read_text().split()
    assert out[0] == "2" and out[1] == f"verdict={cluster.state}/jobs/{job}/verdict.json", out
    wait_for(restored)
    no_drain(cluster)


def test_a_job_that_did_not_opt_in_is_untouched(cluster):
    d = job_dir(cluster, "plain", False)
    job = sbatch(cluster, d, "cat /proc/sys/kernel/perf_event_paranoid\n")
    wait_gone(cluster, job)
    assert (d / "out.txt").read_text().strip() == "3"
    assert not (cluster.state / "jobs" / job).exists()


def test_two_concurrent_jobs_restore_only_after_the_second_ends(cluster):
    a, b = job_dir(cluster, "a", True), job_dir(cluster, "b", True)
    gate = 'while [ ! -e "$PWD/go" ]; do sleep 0.1; done; cat /proc/sys/kernel/perf_event_paranoid\n'
    ja, jb = sbatch(cluster, a, gate), sbatch(cluster, b, gate)
    wait_for(lambda: cluster.run("squeue", "-h", "-t", "R", "-o", "%i").stdout.split().__len__() == 2)
    (a / "go").touch()
    wait_gone(cluster, ja)
    time.sleep(1)  # the epilog of the first has run
    assert PARANOID.read_text().strip() == "2"  # the second still holds it
    (b / "go").touch()
    wait_gone(cluster, jb)
    wait_for(restored)
    assert (a / "out.txt").read_text().strip() == "2" == (b / "out.txt").read_text().strip()


def test_a_cancelled_job_gets_everything_restored(cluster):
    d = job_dir(cluster, "cancelled", True)
    job = sbatch(cluster, d, "sleep 300\n")
    wait_for(lambda: PARANOID.read_text().strip() == "2")
    cluster.run("scancel", job)
    wait_gone(cluster, job)
    wait_for(restored)
    no_drain(cluster)


def test_a_job_killed_at_its_time_limit_gets_everything_restored(cluster):
    d = job_dir(cluster, "timeout", True)
    job = sbatch(cluster, d, "trap '' TERM; sleep 300\n", "--time=1")
    wait_for(lambda: PARANOID.read_text().strip() == "2")
    wait_gone(cluster, job, timeout=200)
    wait_for(restored)
    no_drain(cluster)


def test_a_fleet_error_in_the_prolog_leaves_the_node_idle_not_drained(cluster):
    config = cluster.prefix / "node.json"
    good = config.read_text()
    try:
        config.write_text("{broken")
        d = job_dir(cluster, "broken", True)
        job = sbatch(cluster, d, "echo ran\n")
        wait_gone(cluster, job)
        assert (d / "out.txt").read_text().strip() == "ran"
        cluster.wait_idle()
        no_drain(cluster)
    finally:
        config.write_text(good)


def test_a_rank_refuses_ncu_on_what_the_prolog_saw(tmp_path):
    """The TaskProlog's FLEET_PROLOG_VERDICT reaches the rank's agent: ncu is refused on it even
    when the rank itself (not root) sees nobody on the GPU."""
    from fleet.agent import bundle
    from tests.harness import fakenvml

    lib = fakenvml.build(tmp_path / "fakenvml")
    fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [{"index": 0}]})  # the GPU looks free
    verdict = tmp_path / "verdict.json"
    verdict.write_text(json.dumps({"job": "77", "nvml": True,
                                   "tenants": ["GPU 0: pid 4242 (bob, 2.0 GB) belongs to another user"]}))
    (tmp_path / "fleet-agent.py").write_text(bundle.script())
    standins = Path(__file__).parent / "standins"
    args = {"mode": "task", "request": {"tool": "ncu", "run_id": "r"}, "report_dir": str(tmp_path / "runs"),
            "launcher": "srun", "ranks": None, "tools": {"ncu": str(standins / "ncu"), "nsys": str(standins / "nsys")}}
    env = {**os.environ, **fakenvml.env(lib, tmp_path / "gpus.txt"), "SLURM_JOB_ID": "77", "SLURM_PROCID": "0",
           "SLURMD_NODENAME": "node1", "FLEET_PROLOG_VERDICT": str(verdict)}
    out = subprocess.run(["python3", str(tmp_path / "fleet-agent.py"), json.dumps(args), "touch", str(tmp_path / "ran")],
                         env=env, capture_output=True, text=True)
    assert out.returncode == 5, out.stderr
    [result] = answers((tmp_path / "runs" / "r" / "node1" / "rank0.result.json").read_text(), "profile")
    assert result["status"] == "refused" and "tenant seen by the node's prolog: GPU 0: pid 4242" in result["reasons"][0]
    assert not (tmp_path / "ran").exists()
    # A verdict that cannot be read says nothing about the GPU: it counts as shared (it counted as free).
    for unreadable in (tmp_path / "no-such-verdict.json", tmp_path):
        env["FLEET_PROLOG_VERDICT"] = str(unreadable)
        out = subprocess.run(["python3", str(tmp_path / "fleet-agent.py"), json.dumps(args), "touch",
                              str(tmp_path / "ran")], env=env, capture_output=True, text=True)
        assert out.returncode == 5 and "prolog verdict says nothing of the GPUs" in out.stderr, out.stderr
        assert not (tmp_path / "ran").exists()
    del env["FLEET_PROLOG_VERDICT"]  # where no prolog is installed, the free GPU is profiled
    assert subprocess.run(["python3", str(tmp_path / "fleet-agent.py"), json.dumps(args), "true"], env=env,
                          capture_output=True).returncode == 0
    # Where the cluster has it (fleet_slurm_prolog), a job without its verdict counts as shared.
    out = subprocess.run(["python3", str(tmp_path / "fleet-agent.py"), json.dumps(dict(args, prolog_expected=True)),
                          "touch", str(tmp_path / "ran")], env=env, capture_output=True, text=True)
    assert out.returncode == 5 and "left no verdict" in out.stderr and not (tmp_path / "ran").exists()


def test_a_rank_checks_the_gpus_slurm_gave_it_by_device_not_by_index(tmp_path):
    """With constrained devices NVML numbers the job's GPUs from 0, while Slurm names them by its
    own ids (the /dev/nvidiaN minors): the rank looked for GPU "3" and refused ("no GPU [3]"), or
    looked at another GPU than its own."""
    from fleet.agent import bundle
    from tests.harness import fakenvml
    from tests.harness.procs import spawn, stop

    ensure_user(TENANT_USER)
    tenant = spawn(TENANT_USER, ["sleep", "300"])
    try:
        lib = fakenvml.build(tmp_path / "fakenvml")
        fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [  # the job's two GPUs, as its cgroup shows them
            {"index": 0, "minor": 2},
            {"index": 1, "minor": 3, "processes": [{"kind": "compute", "pid": tenant.pid, "mem": 10**9}]}]})
        (tmp_path / "fleet-agent.py").write_text(bundle.script())
        standins = Path(__file__).parent / "standins"
        args = {"mode": "task", "request": {"tool": "ncu", "run_id": "r"}, "report_dir": str(tmp_path / "runs"),
                "launcher": "srun", "ranks": None, "tools": {"ncu": str(standins / "ncu")}}
        env = {**os.environ, **fakenvml.env(lib, tmp_path / "gpus.txt"), "SLURM_JOB_ID": "78", "SLURM_PROCID": "0",
               "SLURMD_NODENAME": "node1"}

        def rank(slurm_gpus):
            return subprocess.run(["python3", str(tmp_path / "fleet-agent.py"), json.dumps(args), "true"],
                                  env={**env, "SLURM_STEP_GPUS": slurm_gpus}, capture_output=True, text=True)

        beside = rank("3")  # Slurm's GPU 3 is NVML's 1, where the tenant is
        assert beside.returncode == 5 and f"pid {tenant.pid} ({TENANT_USER}" in beside.stderr, beside.stderr
        alone = rank("2")  # Slurm's GPU 2 is NVML's 0: free
        assert alone.returncode == 0, alone.stderr
    finally:
        stop([tenant])


def test_slurm_install_refuses_a_python_that_cannot_run_the_hooks_and_writes_nothing(tmp_path):
    old = python36(tmp_path)
    for python, said in (("/usr/local/bin/no-such-python3", "cannot run the hooks: No such file or directory"),
                         (str(old), "(Python 3.6.8) cannot run fleet's agent: SyntaxError: future feature annotations "
                                    "is not defined; the hooks need Python 3.8 or newer")):
        prefix = tmp_path / "etc"
        r = run_fleet("slurm", "install", "--apply", "--prefix", str(prefix), "--python", python,
                      "--log-file", str(tmp_path / "slurm.log"))
        assert r.returncode == 2 and r.stdout == "", r
        assert r.stderr == f"fleet: --python {python} {said}; nothing written\n", r.stderr
        assert not prefix.exists() and not (tmp_path / "slurm.log").exists()
        shown = run_fleet("slurm", "install", "--python", python)  # printing the files refuses it too
        assert shown.returncode == 2 and said in shown.stderr and shown.stdout == ""


def test_a_hook_whose_python_breaks_after_install_leaves_the_node_idle(cluster, tmp_path):
    link, log = cluster.pybin / "python3", cluster.state / "slurm.log"
    good = os.readlink(link)
    try:
        for name, broken in (("gone", None), ("old", python36(tmp_path))):
            link.unlink(missing_ok=True)
            if broken:
                link.symlink_to(broken)
            before = log.read_text() if log.exists() else ""
            d = job_dir(cluster, f"python-{name}", True)
            job = sbatch(cluster, d, "cat /proc/sys/kernel/perf_event_paranoid\n")
            wait_gone(cluster, job)
            assert (d / "out.txt").read_text().strip() == "3"  # the job ran; nothing was held for it
            cluster.wait_idle()
            assert cluster.run("sinfo", "-R", "-h").stdout.strip() == ""  # no node drained
            said = log.read_text()[len(before):]
            assert f"fleet slurm: prolog: {link} cannot run fleet's agent" in said, said
            assert "node left in service" in said
            assert (broken is None) or "future feature annotations" in said
    finally:
        link.unlink(missing_ok=True)
        link.symlink_to(good)
    no_drain(cluster)


def test_the_prologs_verdict_is_per_gpu_and_a_rank_is_refused_only_for_its_own(node, tmp_path):
    """ncu on a job with one GPU per task, a tenant on GPU 1 only: the prolog (root, the fake NVML)
    records who is on each GPU by UUID; rank 0 (GPU 0) is profiled, rank 1 (GPU 1) refused."""
    from fleet.agent import bundle
    from tests.harness import fakenvml
    from tests.harness.procs import spawn, stop

    tenant = spawn(TENANT_USER, ["sleep", "300"])
    try:
        lib = fakenvml.build(tmp_path / "fakenvml")
        fakenvml.write_scenario(tmp_path / "gpus.txt", {"gpus": [
            {"index": 0, "minor": 0},
            {"index": 1, "minor": 1, "processes": [{"kind": "compute", "pid": tenant.pid, "mem": 10**9}]}]})
        (tmp_path / "gpus.txt").chmod(0o644)
        agent = tmp_path / "fleet-agent.py"
        agent.write_text(bundle.script())
        write_request(node, {"fleet": 1, "tool": "ncu", "sysctls": []})
        gpu_env = fakenvml.env(lib, tmp_path / "gpus.txt")
        prolog = subprocess.run(["python3", str(agent), json.dumps({"mode": "slurmd", "op": "prolog",
                                                                    "config": node["config_path"]})],
                                env={**node["env"], **gpu_env, "SLURM_JOB_GPUS": "0,1"}, capture_output=True, text=True)
        assert prolog.returncode == 0, prolog.stderr
        verdict_path = Path(node["config"]["jobs_dir"]) / "4242" / "verdict.json"
        verdict = json.loads(verdict_path.read_text())
        free, taken = sorted(verdict["by_gpu"].values(), key=len)  # one entry per GPU, by its UUID
        assert len(verdict["by_gpu"]) == 2 and all(u.startswith("GPU-") for u in verdict["by_gpu"]), verdict
        assert free == [] and len(taken) == 1 and f"GPU 1: pid {tenant.pid}" in taken[0], verdict
        assert verdict["tenants"] == taken  # the job-wide list, as before, names it too
        standins = Path(__file__).parent / "standins"
        args = {"mode": "task", "request": {"tool": "ncu", "run_id": "r"}, "report_dir": str(tmp_path / "runs"),
                "launcher": "srun", "ranks": None, "tools": {"ncu": str(standins / "ncu")}, "prolog_expected": True}

        def rank(i):
            return subprocess.run(["python3", str(agent), json.dumps(args), "true"], capture_output=True, text=True,
                                  env={**os.environ, **gpu_env, "SLURM_JOB_ID": "4242", "SLURM_PROCID": str(i),
                                       "SLURM_STEP_GPUS": str(i), "SLURMD_NODENAME": "node1",
                                       "FLEET_PROLOG_VERDICT": str(verdict_path)})

        first, second = rank(0), rank(1)
        assert first.returncode == 0, first.stderr  # its GPU is free: profiled with ncu
        assert (tmp_path / "runs" / "r" / "node1" / "rank0.ncu-rep").exists()
        assert second.returncode == 5 and f"pid {tenant.pid}" in second.stderr, second.stderr
        [result] = answers((tmp_path / "runs" / "r" / "node1" / "rank1.result.json").read_text(), "profile")
        assert result["status"] == "refused"
    finally:
        stop([tenant])
