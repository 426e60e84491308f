"""Hostile values from the command line, a playbook, the inventory or a job: each is refused with
one clear line, and nothing is submitted or written; the batch script fleet renders is re-read by
bash and by the rules sbatch reads ``#SBATCH`` lines with. On a real Slurm cluster (munge,
slurmctld, two slurmd) reached through a real sshd as its login node."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from fleet import hostlist, store
from fleet.agent import slurmd
from fleet.agent import wire
from fleet.plan import ProfileRequest
from fleet.safenames import UnsafeValue
from fleet.slurm import jobs
from fleet.slurm import options
from fleet.slurm.script import JobFiles, JobSpec, render
from fleet.store.manifest import RunManifest
from tests.conftest import run_fleet
from tests.harness.hpc import fleet

# The fixtures `hpc` (this module's own Slurm cluster, tests/harness/hpc.py) and `node` (a node's fleet
# files and a job user, tests/harness/prolog.py) come from tests/conftest.py.

FLEETS_OWN = ("--job-name", "--output", "--signal", "--chdir")
UID0 = "gpu\n#SBATCH --uid=0"


def sbatch_directives(script: str) -> list[str]:
    """The options sbatch takes from a script: ``#SBATCH`` lines up to the first command (sbatch
    reads no further), each line's words as bash would split them."""
    words: list[str] = []
    for line in script.splitlines()[1:]:
        if line.startswith("#SBATCH"):
            words += shlex.split(line[len("#SBATCH"):], comments=True)
        elif line.strip() and not line.startswith("#"):
            break
    return words


def one_line_refusal(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, r.stderr + r.stdout
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("fleet: ") and "Traceback" not in r.stderr, r.stderr
    assert all(n in r.stderr for n in needles), r.stderr


def queue(hpc) -> list[str]:
    return hpc.slurm.run("squeue", "-h", "-t", "all", "-o", "%i").stdout.split()


def untouched(hpc, store_dir: Path, before_jobs: list[str], before_runs: set) -> None:
    assert queue(hpc) == before_jobs, "a job was submitted"
    assert set(hpc.runs.iterdir()) == before_runs, "a run directory was left on the login node"
    assert not list(store_dir.rglob("manifest.json*")), "a run was recorded"


def inventory_with(hpc, tmp_path: Path, **login_vars) -> dict:
    doc = yaml.safe_load(hpc.inventory.read_text())
    doc["all"]["children"]["cluster"]["hosts"]["h01"].update(login_vars)
    path = tmp_path / "inventory.yaml"
    path.write_text(yaml.safe_dump(doc))
    return {**hpc.env(), "FLEET_INVENTORY": str(path), "FLEET_STORE": str(tmp_path / "store")}


# --- 2. batch-script injection ---

HOSTILE_OPTIONS = [
    (("--partition", UID0), "--partition: a newline"),
    (("-A", "proj\n#SBATCH --uid=0"), "--account: a newline"),
    (("--qos", "high\rx"), "--qos: a newline"),
    (("-t", "10\ntouch /tmp/x"), "--time: a newline"),
    (("-t", "10 minutes"), "is not a Slurm time"),
    (("--gres", "gpu:1\n#SBATCH --uid=0"), "--gres: a newline"),
    (("--gpus", "1;id"), "--gpus: '1;id' is not what sbatch takes"),
    (("--sbatch-arg", "--comment=x\n#SBATCH --uid=0"), "--sbatch-arg: a newline"),
    (("--sbatch-arg", "--uid=0"), "--uid is set by fleet"),
    (("--sbatch-arg", "--out=/tmp/stolen"), "--out (sbatch reads it as --output) is set by fleet"),
    (("--sbatch-arg", "--sig=B:USR1@1"), "reads it as --signal"),
    (("--sbatch-arg", "--wrap=id"), "--wrap is set by fleet"),
    (("--sbatch-arg", "-o /tmp/x"), "is not one --option"),
    (("--sbatch-arg", "--constraint=a\\b"), "read differently by sbatch"),
    (("--workdir", "/tmp\nx"), "--workdir: a newline"),
    (("--container-image", "img\x1b[2J"), "control character"),
]


@pytest.mark.parametrize("args,message", HOSTILE_OPTIONS, ids=[m for _, m in HOSTILE_OPTIONS])
def test_a_hostile_slurm_option_is_refused_and_nothing_is_submitted(hpc, tmp_path, args, message):
    before_jobs, before_runs = queue(hpc), set(hpc.runs.iterdir())
    r = fleet(hpc, tmp_path, *args, "--", "true")
    one_line_refusal(r, message)
    untouched(hpc, tmp_path, before_jobs, before_runs)


def test_a_hostile_report_dir_in_the_inventory_is_refused(hpc, tmp_path):
    before_jobs, before_runs = queue(hpc), set(hpc.runs.iterdir())
    env = inventory_with(hpc, tmp_path, report_dir=f"{hpc.runs}/x\n#SBATCH --uid=0")
    r = run_fleet("profile", "--partition", "gpu", "--", "true", env=env)
    one_line_refusal(r, "report_dir", "a newline")
    untouched(hpc, tmp_path / "store", before_jobs, before_runs)


@pytest.mark.parametrize("key,value", [("partition", UID0), ("account", "a\nb"), ("time", "1\nid"),
                                       ("gres", "gpu:1\n#SBATCH --uid=0"), ("qos", "q;id"), ("gpus", "1\n2"),
                                       ("ranks", [-1]), ("nodes", 0), ("launcher", "bash")])
def test_a_hostile_playbook_target_is_refused_with_its_line(hpc, tmp_path, key, value):
    pb = tmp_path / "pb.yaml"
    target = {"partition": "gpu", key: value}
    pb.write_text(yaml.safe_dump({"name": "pb", "target": target, "command": ["true"]}, default_style=None))
    line = next(i for i, t in enumerate(pb.read_text().splitlines(), 1) if t.lstrip().startswith(f"{key}:"))
    before_jobs, before_runs = queue(hpc), set(hpc.runs.iterdir())
    r = run_fleet("run", str(pb), env={**hpc.env(), "FLEET_STORE": str(tmp_path / "store")})
    one_line_refusal(r, f"{pb}:{line}: target.{key}")
    untouched(hpc, tmp_path / "store", before_jobs, before_runs)


def test_odd_but_valid_values_reach_sbatch_as_bash_reads_them(hpc, tmp_path):
    """A report_dir with a space and a '#', and a --sbatch-arg value with spaces: quoted once, the
    script is valid bash, fleet's own options come before any command, and the real job's log
    lands where fleet said."""
    runs = hpc.runs / "with space#1"
    env = inventory_with(hpc, tmp_path, report_dir=str(runs))
    args = ("profile", "--partition", "gpu", "--poll", "1", "--sbatch-arg=--comment=a b & c", "--", "true")
    dry = run_fleet(*args[:-2], "--dry-run", *args[-2:], env=env)
    assert dry.returncode == 0, dry.stderr
    subprocess.run(["bash", "-n"], input=dry.stdout, text=True, check=True)
    read = sbatch_directives(dry.stdout)
    assert [w.split("=")[0] for w in read[:4]] == list(FLEETS_OWN)
    assert "--comment=a b & c" in read and "--partition=gpu" in read
    [chdir] = [w for w in read if w.startswith("--chdir=")]
    assert chdir.startswith(f"--chdir={runs}/")
    r = run_fleet(*args, env=env)
    assert r.returncode == 0, r.stderr + r.stdout
    [log] = runs.glob("*/slurm-*.out")  # sbatch read --output and --chdir with the space and '#'
    assert log.parent.parent == runs


def test_fleets_own_directives_come_before_any_command_whatever_the_options():
    files = JobFiles("/scratch/u/fleet-reports/r", "/scratch/u/fleet-reports")
    spec = JobSpec(partition="gpu", nodes=2, gres="gpu:2", time="1-00:00", account="a", qos="q",
                   sbatch_args=("--constraint=h100&a100", "--comment=x #y"), ranks=(0,), workdir="/w d")
    req = ProfileRequest(tool="ncu", command=("x",), run_id="r")
    script = render(req, options.checked(spec, req), files)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    read = sbatch_directives(script)
    assert [w.split("=")[0] for w in read[:4]] == list(FLEETS_OWN)
    assert read[4:] == ["--partition=gpu", "--nodes=2", "--gres=gpu:2", "--time=1-00:00", "--account=a", "--qos=q",
                        "--exclusive", "--constraint=h100&a100", "--comment=x #y"]
    with pytest.raises(UnsafeValue, match="--partition: a newline"):
        options.checked(JobSpec(partition=UID0), ProfileRequest(tool="nsys", command=("x",), run_id="r"))


# --- 11. values accepted that meant nothing ---

@pytest.mark.parametrize("args,message", [
    (("--stop-before", "0"), "--stop-before: must be 1 second or more, not 0"),
    (("--stop-before", "-5"), "not -5"),
    (("-t", "00:01:00", "--stop-before", "120"), "--stop-before 120 is not less than --time 00:01:00 (60 s)"),
    (("--nodes", "0"), "--nodes: must be a whole number, 1 or more, not 0"),
    (("--ntasks", "-2"), "--ntasks: must be a whole number"),
    (("--ranks", ",,,"), "--ranks takes rank numbers"),
    (("--ranks", "-1"), "--ranks takes rank numbers"),
    (("--ntasks", "2", "--ranks", "0,5"), "rank 5 would never be profiled"),
])
def test_values_that_mean_nothing_are_refused(hpc, tmp_path, args, message):
    before_jobs, before_runs = queue(hpc), set(hpc.runs.iterdir())
    one_line_refusal(fleet(hpc, tmp_path, *args, "--", "true"), message)
    untouched(hpc, tmp_path, before_jobs, before_runs)


def test_a_short_time_limit_shortens_the_default_stop_and_says_so(hpc, tmp_path):
    r = fleet(hpc, tmp_path, "-t", "00:01:00", "--dry-run", "--", "true")
    assert r.returncode == 0, r.stderr
    assert "--signal=B:USR1@30" in sbatch_directives(r.stdout)
    assert "the profilers stop 30 s before the limit" in r.stderr
    r = fleet(hpc, tmp_path, "-t", "10", "--dry-run", "--", "true")
    assert "--signal=B:USR1@120" in sbatch_directives(r.stdout) and not r.stderr


def test_a_rejected_sbatch_leaves_nothing_on_the_login_node_and_exits_2(hpc, tmp_path):
    before_jobs, before_runs = queue(hpc), set(hpc.runs.iterdir())
    r = run_fleet("profile", "--partition", "nope", "--", "true", env={**hpc.env(), "FLEET_STORE": str(tmp_path)})
    one_line_refusal(r, "sbatch refused the job on h01", "invalid partition specified: nope")
    assert queue(hpc) == before_jobs and set(hpc.runs.iterdir()) == before_runs  # no agent, no script left
    [m] = tmp_path.glob("*/*/*/manifest.json")  # the attempt is on record
    assert json.loads(m.read_text())["slurm"]["state"] == "NOT SUBMITTED"


def test_files_staged_for_a_job_are_dated_now(hpc, tmp_path):
    start = time.time()
    r = fleet(hpc, tmp_path, "--", "true")
    assert r.returncode == 0, r.stderr + r.stdout
    [m] = tmp_path.glob("*/*/*/manifest.json")
    run_dir = Path(json.loads(m.read_text())["slurm"]["run_dir"])
    for name in ("fleet-agent.py", "job.sbatch", "fleet-request.json"):
        assert start - 2 <= (run_dir / name).stat().st_mtime <= time.time() + 2, name


# --- 10. tracebacks instead of errors ---

@pytest.fixture
def full_store(tmp_path):
    """A store on a filesystem with no room left (a small tmpfs, unmounted after)."""
    d = tmp_path / "store"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs", str(d)], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=True)


def fill(d: Path) -> None:
    with open(d / "filler", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError:
            pass


def test_a_full_store_keeps_the_last_manifest_whole_and_leaves_no_tmp(full_store):
    m = RunManifest.begin(ProfileRequest(tool="nsys", command=("x",), run_id="20261130-000000-abcd"), "lab")
    directory = store.save(full_store, m)
    before = (directory / "manifest.json").read_text()
    (directory / "host").mkdir()
    (directory / "host" / "report.nsys-rep").write_bytes(b"report")
    fill(full_store)
    m.status = "complete"
    m.hosts = []
    m.error = "x" * 300_000  # more than the room left
    with pytest.raises(store.StoreWriteError, match=f"run {m.run_id} .*No space left.* are in {directory}"):
        store.save(full_store, m)
    assert (directory / "manifest.json").read_text() == before
    assert not list(directory.glob("*.tmp")) and (directory / "host" / "report.nsys-rep").read_bytes() == b"report"


def test_a_full_store_refuses_a_slurm_run_before_submitting_it(hpc, full_store):
    fill(full_store)
    before_jobs, before_runs = queue(hpc), set(hpc.runs.iterdir())
    r = run_fleet("profile", "--partition", "gpu", "--", "true", env={**hpc.env(), "FLEET_STORE": str(full_store)})
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "could not write the manifest of run" in r.stderr and "No space left on device" in r.stderr
    assert queue(hpc) == before_jobs and set(hpc.runs.iterdir()) == before_runs
    assert not list(full_store.rglob("*.tmp"))


def test_repair_when_the_agent_prints_nothing_is_one_line(cluster, tmp_path):
    doc = yaml.safe_load(cluster.inventory.read_text())
    doc["all"]["children"]["cluster"]["hosts"]["h01"]["ansible_python_interpreter"] = "/bin/true"  # prints nothing
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump(doc))
    r = run_fleet("repair", "h01", env={**cluster.env(), "FLEET_INVENTORY": str(inv)})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr == "h01: the agent gave no repair result (exit status 0): it printed nothing\n"


# --- 9. size caps ---

@pytest.mark.parametrize("pattern", ["gpu[1:10000000]", "a[1-3000]b[1-3000]c[1-3000]", "n[0-99999,1-2]"])
def test_a_huge_range_is_refused_before_it_is_expanded(pattern):
    start = time.monotonic()
    with pytest.raises(hostlist.HostPatternError, match="more than fleet expands"):
        hostlist.expand(pattern)
    assert time.monotonic() - start < 0.5
    assert len(hostlist.expand("gpu[1:100000]")) == 100_000  # the cap itself is still expanded


def test_a_huge_range_on_the_command_line_is_one_line(cluster):
    r = run_fleet("exec", "a[1-3000]b[1-3000]c[1-3000]", "--", "true", env=cluster.env(), timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "27,000,000,000 host names" in r.stderr, r.stderr


def test_a_deeply_nested_request_is_refused_in_one_line(node):
    path = node["work"] / slurmd.REQUEST_NAME
    path.write_text("[" * slurmd.REQUEST_MAX)
    os.chown(path, node["user"].pw_uid, node["user"].pw_gid)
    assert slurmd.main({"op": "prolog", "config": node["config_path"]}, node["env"]) == 0
    log = node["log"].read_text()
    assert "ignored_request" in log and "nested too deeply" in log and "failed" not in log
    assert wire.answers(wire.MARK + "[" * 100_000 + "\n" + wire.MARK + '{"ok": 1}\n', "profile") == [{"ok": 1}]


def test_a_request_of_the_wrong_shape_asks_for_nothing():
    """The job's request file is the job's user's, read by root: each value of another type than
    fleet writes reads as absent, never as a truthy stand-in ("yes" is not True, a string is not a
    list of sysctls, a number in the list is no sysctl's name)."""
    odd = slurmd.JobRequest.read({"tool": 5, "sysctls": "kernel.perf_event_paranoid",
                                  "allow_own": "yes", "pause_dcgm": 1, "gpu_metrics": None,
                                  "run": ["rm", "-rf", "/"]})
    assert odd == slurmd.JobRequest()
    mixed = slurmd.JobRequest.read({"tool": "ncu", "sysctls": [7, "kernel.perf_event_paranoid", {}],
                                    "allow_own": True, "pause_dcgm": True, "gpu_metrics": False})
    assert mixed == slurmd.JobRequest(tool="ncu", sysctls=("kernel.perf_event_paranoid",),
                                      allow_own=True, pause_dcgm=True, gpu_metrics=False)


def test_staged_tar_members_carry_the_time_of_submission():
    import io
    import tarfile

    start = time.time()
    with tarfile.open(fileobj=io.BytesIO(jobs.tar_of({"a": b"x"}))) as tar:
        assert start - 1 <= tar.getmember("a").mtime <= time.time() + 1
