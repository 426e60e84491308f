"""A job's shape is checked once (``options.checked``), before anything is asked of a login node.

Every usage error of the Slurm path, the launcher with the tool, the command or the container,
``--ranks`` against the job's shape, a ``--time`` Slurm does not take, exits 2 having touched
nothing: fleet runs here in-process with a PATH whose Slurm commands, ssh and shells only record
that they were called (a recorder: it answers nothing, so a run that reached it could not go on),
and, for an inventory's login node, with that node's address a socket that records a
connection. Then a dry run that does reach a login node, this machine's, with the real Slurm
client, counts the checks: each ran once.
"""

from __future__ import annotations

import os
import shlex
import socket
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from fleet import exitcodes
from fleet.slurm import options

# Every program fleet could start to reach a login node here (this machine's, through the local
# transport) or over SSH: none may run before the arguments are all found good.
RECORDED = ("sh", "bash", "ssh", "sinfo", "sbatch", "scontrol", "squeue", "sacct", "scancel", "srun", "salloc")


def fleet_here(*args: str, env: dict | None = None):
    """The command line in this process (click's runner), without the caller's FLEET_* settings."""
    from fleet.cli.main import main

    return CliRunner().invoke(main, list(args), env={"FLEET_INVENTORY": None, "FLEET_STORE": None,
                                                     "FLEET_SSH_CONFIG": None, **(env or {})})


@pytest.fixture
def recorder(tmp_path, monkeypatch) -> Path:
    """PATH's first folder holds a recording ``sinfo``, ``sbatch``, ``ssh``, ``sh`` ...: the file
    returned exists once any of them ran."""
    folder, called = tmp_path / "recording-bin", tmp_path / "called"
    folder.mkdir()
    for name in RECORDED:
        program = folder / name
        program.write_text(f'#!/bin/sh\necho {name} "$*" >> {shlex.quote(str(called))}\nexit 1\n')
        program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return called


@pytest.fixture
def login_socket():
    """A listening socket as an inventory's login node: ``accepted()`` says whether anything connected."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    s.setblocking(False)

    def accepted() -> bool:
        try:
            s.accept()[0].close()
        except BlockingIOError:
            return False
        return True

    try:
        yield s.getsockname()[1], accepted
    finally:
        s.close()


def one_line_usage_error(out, message: str) -> None:
    assert out.exit_code == exitcodes.USAGE, (out.exit_code, out.output, out.exception)
    assert out.stderr.startswith("fleet: ") and out.stderr.count("\n") == 1, out.stderr
    assert message in out.stderr and "Traceback" not in out.output, out.stderr


LAUNCHERS = [
    (("--launcher", "ray", "--tool", "ncu", "--dry-run", "--", "python3", "app.py"), "only an nsys trace"),
    (("--launcher", "ray", "--gpu-metrics", "--", "python3", "app.py"), "only an nsys trace"),
    (("--launcher", "torchrun", "--", "true"), "no program found after the torchrun options"),
    (("--launcher", "torchrun", "--dry-run", "--", "torchrun", "--nproc-per-node", "2"), "no program found"),
    (("--launcher", "mpirun", "--", "mpirun", "-np", "2"), "no program found after the mpirun options"),
    (("--launcher", "torchrun", "--", "torchrun", "--run-path", "train.py"), "leave --run-path out"),
    (("--launcher", "mpirun", "--container-image", "img", "--", "mpirun", "-np", "2", "./app"),
     "pyxis cannot put them in the image"),
    (("--launcher", "ray", "--apptainer", "img.sif", "--", "python3", "app.py"),
     "no container of fleet's would reach them"),
]
SHAPES = [
    (("--ranks", "5", "--", "true"), "the job has 1 rank(s), 0 to 0; rank 5 would never be profiled"),
    (("--ntasks", "2", "--ranks", "0,5", "--dry-run", "--", "true"), "rank 5 would never be profiled"),
    (("--nodes", "2", "--ntasks-per-node", "2", "--ranks", "4", "--", "true"), "the job has 4 rank(s)"),
    (("--ranks", "0,x", "--", "true"), "--ranks takes rank numbers"),
    (("--time", "1:2:3:4", "--", "true"), "--time: '1:2:3:4' is not a Slurm time"),
    (("--time", "soon", "--dry-run", "--", "true"), "is not a Slurm time"),
    (("--time", "00:01:00", "--stop-before", "60", "--", "true"), "--stop-before 60 is not less than --time"),
    (("--stop-before", "0", "--", "true"), "--stop-before: must be 1 second or more"),
    (("--nodes", "0", "--", "true"), "--nodes: must be a whole number, 1 or more"),
    (("--gres", "gpu 2", "--", "true"), "--gres: 'gpu 2' is not what sbatch takes"),
    (("--sbatch-arg=--out=x", "--", "true"), "--sbatch-arg: --out (sbatch reads it as --output) is set by fleet"),
    (("--workdir", "a\nb", "--", "true"), "--workdir: a newline"),
    (("--container-image", "img", "--apptainer", "img.sif", "--", "true"), "choose one of --container-image"),
    (("--container-image=-v/:/host", "--", "true"), "an image name, not an option"),
    (("-X", "--output=mine", "--", "true"), "is fleet's: it names each report"),
    (("--gpu", "0", "--", "true"), "on Slurm, ask for GPUs with --gpus or --gres"),
    (("--poll", "0", "--", "true"), "Invalid value for '--poll'"),  # a watch that would ask slurmctld unpaused
    (("--poll", "nan", "--", "true"), "nan is not a number of seconds"),
    (("--poll", "-1", "--dry-run", "--", "true"), "Invalid value for '--poll'"),
]


@pytest.mark.parametrize("args,message", LAUNCHERS + SHAPES)
def test_a_usage_error_on_slurm_exits_2_before_the_login_node_is_asked_anything(recorder, tmp_path, args, message):
    store = tmp_path / "store"
    out = fleet_here("profile", "--partition", "gpu", "--store", str(store), *args)
    one_line_usage_error(out, message)
    assert not recorder.exists(), recorder.read_text()  # no sinfo, no sh: this machine, the login node, untouched
    assert not store.exists()


def write_inventory(path: Path, port: int, **login_vars) -> Path:
    doc = {"all": {"children": {"hpc": {"vars": {"slurm_login": "login1"}, "hosts": {
        "login1": {"ansible_host": "127.0.0.1", "ansible_port": port, **login_vars}}}}}}
    path.write_text(yaml.safe_dump(doc))
    return path


INVENTORY = [
    ({"ansible_python_interpreter": "/usr/bin/python3\nrm -rf ~"}, ("--", "true"), "ansible_python_interpreter"),
    ({"report_dir": "runs'here"}, ("--dry-run", "--", "true"), "report_dir: \"'\" in \"runs'here\""),
    ({"slurm_scratch": "/local/a,/:/host"}, ("--apptainer", "img.sif", "--", "true"), "comma or colon"),
    ({"nsys_path": "/opt/ns:/etc/bin/nsys"}, ("--container-image", "img", "--", "true"), "comma or colon"),
    ({}, ("--launcher", "torchrun", "--", "true"), "no program found"),
]


@pytest.mark.parametrize("login_vars,args,message", INVENTORY)
def test_a_usage_error_exits_2_before_the_inventorys_login_node_is_connected_to(
        recorder, login_socket, tmp_path, login_vars, args, message):
    port, accepted = login_socket
    inventory = write_inventory(tmp_path / "cluster.yaml", port, **login_vars)
    out = fleet_here("-i", str(inventory), "--connect-timeout", "2", "profile", "--partition", "gpu",
                     "--store", str(tmp_path / "store"), *args)
    one_line_usage_error(out, message)
    assert not accepted() and not recorder.exists()
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("args,message", [
    (("--gpu", "-1"), "Invalid value for '--gpu': '-1': a GPU's index (0, 1, ...) or free"),
    (("--wait", "-5"), "Invalid value for '--wait'"),
    (("--wait", "nan", "--dry-run"), "nan is not a number of seconds"),
    (("--timeout", "nan"), "nan is not a number of seconds"),
    (("--finish-timeout", "5"), "give --timeout too"),
    (("-X", "--out=mine"), "is fleet's: it names each report"),
    (("--docker=--privileged",), "an image name, not an option"),
    (("--site", "a/b"), "the site 'a/b' cannot name a folder"),
    # --launcher is the lab servers' too (mpirun, torchrun: fleet/lab/profile.py); its mistakes are refused the same way
    (("--launcher", "torchrun"), "no program found after the torchrun options in true"),
    (("--launcher", "srun"), "--launcher srun: on lab servers one of mpirun, torchrun"),
])
def test_a_usage_error_on_lab_servers_exits_2_before_a_server_is_connected_to(recorder, login_socket, tmp_path,
                                                                               args, message):
    port, accepted = login_socket
    inventory = tmp_path / "lab.yaml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"lab1": {"ansible_host": "127.0.0.1",
                                                                     "ansible_port": port}}}}))
    out = fleet_here("-i", str(inventory), "--connect-timeout", "2", "profile", "--hosts", "lab1",
                     "--store", str(tmp_path / "store"), *args, "--", "true")
    one_line_usage_error(out, message)
    assert not accepted() and not recorder.exists()
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("target,tool,command,message", [
    ({"partition": "gpu", "launcher": "ray"}, "ncu", ["python3", "app.py"], "only an nsys trace"),
    ({"partition": "gpu", "launcher": "torchrun"}, "nsys", ["true"], "no program found"),
    ({"partition": "gpu", "ntasks": 2, "ranks": [3]}, "nsys", ["true"], "rank 3 would never be profiled"),
])
def test_a_playbook_that_cannot_be_its_job_exits_2_before_the_login_node_is_asked(recorder, tmp_path, target, tool,
                                                                                  command, message):
    playbook = tmp_path / "bench.yaml"
    playbook.write_text(yaml.safe_dump({"name": "bench", "target": target, "tool": tool, "command": command}))
    for dry in ((), ("--dry-run",)):
        out = fleet_here("run", str(playbook), "--store", str(tmp_path / "store"), *dry)
        one_line_usage_error(out, message)
        assert not recorder.exists(), recorder.read_text()


# --- the checks, counted on a dry run that reaches a login node ---

def this_machine_as_a_login_node(tmp_path: Path) -> Path:
    """A slurm.conf for this machine's Slurm client (the Debian package): ``sinfo --version`` reads
    it; its slurmctld is a closed port, so ``scontrol show config`` is refused at once, as a login
    node whose controller is down (the dry run asks nothing more)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "slurm.conf"
    conf.write_text(f"ClusterName=jobspec\nSlurmctldHost=localhost\nSlurmctldPort={port}\nMessageTimeout=1\n"
                    "TCPTimeout=1\nNodeName=node1 CPUs=1\nPartitionName=gpu Nodes=node1\n")
    return conf


@pytest.mark.services  # the real sinfo and scontrol run, through fleet's local transport
@pytest.mark.parametrize("time,stop", [("00:30:00", 120), ("1:00", 30), ("UNLIMITED", 120)])
def test_a_dry_run_checks_the_spec_fits_the_stop_and_parses_the_time_once(tmp_path, monkeypatch, time, stop):
    counts = {"checked": 0, "fit_stop_before": 0, "time_seconds": 0}
    for name in counts:
        real = getattr(options, name)

        def counted(*args, _real=real, _name=name, **kwargs):
            counts[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(options, name, counted)
    out = fleet_here("profile", "--partition", "gpu", "--ntasks", "2", "--ranks", "0,1", "--time", time,
                     "--dry-run", "--store", str(tmp_path / "store"), "--", "true",
                     env={"SLURM_CONF": str(this_machine_as_a_login_node(tmp_path))})
    assert out.exit_code == 0, (out.output, out.exception)
    assert out.stdout.startswith("#!/bin/bash\n") and f"#SBATCH --signal=B:USR1@{stop}\n" in out.stdout
    assert f"#SBATCH --time={time}\n" in out.stdout
    assert counts == {"checked": 1, "fit_stop_before": 1, "time_seconds": 1}, counts
    said = out.stderr.count("leaves no room for the default --stop-before")
    assert said == (stop != 120)  # the shortened stop is said once
    assert not (tmp_path / "store").exists()  # a dry run files nothing


def test_a_checked_spec_is_made_only_by_the_check_and_never_checked_twice():
    from fleet.plan import ProfileRequest
    from fleet.slurm.spec import JobSpec

    req = ProfileRequest(tool="nsys", command=("true",), run_id="r")
    spec = options.checked(JobSpec(time="2:00", ntasks=2), req)
    assert (spec.stop_before, spec.time_limit, spec.ntasks) == (60, 120, 2) and "stop 60 s" in spec.stop_note
    with pytest.raises(TypeError, match="checked already"):
        options.checked(spec, req)
    with pytest.raises(TypeError, match="made by fleet.slurm.options.checked"):
        options.CheckedJobSpec(time="bad")
    # The manifest keeps the job's shape as the JobSpec's fields, the fitted stop among them.
    assert spec.to_json() == {**{k: v for k, v in vars(JobSpec()).items()}, "time": "2:00", "ntasks": 2,
                              "stop_before": 60, "sbatch_args": ()}
