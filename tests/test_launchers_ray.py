"""Ray as its users run it (the `ray` package from PyPI), with no change to their program: a program
that calls ray.init() and starts two named actors, run by the lines `fleet profile --launcher
ray` puts in its job script. fleet's runtime_env hook gives Ray's own nsys integration its `_nsight` block
(Ray 2.60 calls RAY_RUNTIME_ENV_HOOK from ray.init), and each worker says whose it is, which
gather reads to name the report. Before,
the program had to pass FLEET_RAY_RUNTIME_ENV to ray.init itself, and the reports were
worker-HOST-PID: nobody could tell which actor was which (ray#50711)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fleet.slurm.launchers import launch
from fleet.slurm.raygather import ray_worker_name
from fleet.store.manifest import ReportEntry

ray = pytest.importorskip("ray")
STANDINS = Path(__file__).parent / "standins"

PROGRAM = """
import os, time, ray

ray.init(num_cpus=2, include_dashboard=False)


@ray.remote
class Trainer:
    def pid(self):
        time.sleep(0.5)  # some work
        return os.getpid()


a = Trainer.options(name="trainer-a").remote()
b = Trainer.options(name="trainer-b").remote()
print("actor pids", ray.get([a.pid.remote(), b.pid.remote()]), flush=True)
# Each actor ends as Ray documents a graceful end (its worker exits, and nsys writes its report):
# Ray kills the workers of actors still alive at shutdown, and nsys with them, report unwritten.
for actor in (a, b):
    try:
        ray.get(actor.__ray_terminate__.remote())
    except ray.exceptions.RayActorError:  # it ended, as asked
        pass
"""


def test_the_job_script_installs_the_hook_with_the_nsight_block():
    la = launch("ray", ["python3", "train.py"], ["python3", "agent"], "/runs/r1", None)
    text = "\n".join(la.setup)
    assert "export RAY_RUNTIME_ENV_HOOK=fleet_ray_hook.runtime_env_hook" in text
    assert "def runtime_env_hook(runtime_env):" in text and la.line == '"${COMMAND[@]}"'
    block = json.loads(text.split("FLEET_RAY_RUNTIME_ENV='", 1)[1].split("'", 1)[0])
    assert block["_nsight"]["o"] == "/runs/r1/ray/worker-%h-%p"


def test_two_named_actors_of_an_unchanged_ray_program_give_two_reports_named_by_actor(tmp_path, request):
    """The batch script's own Ray lines, run by bash as a job's shell runs them, then the program:
    real Ray (a local instance, 2 CPUs, no dashboard) starts its workers under the nsys stand-in."""
    ray_tmp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # Ray's sessions, this test's own; short: its sockets' paths
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    program = tmp_path / "two_actors.py"
    program.write_text(PROGRAM)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    la = launch("ray", ["python", str(program)], ["unused"], str(run_dir), None)
    script = "\n".join([f"RUN_DIR={shlex.quote(str(run_dir))}", f"COMMAND=(python {shlex.quote(str(program))})",
                        *la.setup, la.line])
    # Ray's nsight plugin runs `nsys profile ... python`: the python with Ray first on PATH, nsys after it
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{STANDINS}:{os.environ['PATH']}",
           "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    pids = json.loads(done.stdout.split("actor pids ", 1)[1].split("\n", 1)[0])
    ray_dir = run_dir / "ray"
    for _ in range(100):  # nsys writes each report once its worker has exited
        if all((ray_dir / f"worker-{socket.gethostname()}-{pid}.nsys-rep").exists() for pid in pids):
            break
        time.sleep(0.1)
    names = []
    for pid in pids:
        report = ray_dir / f"worker-{socket.gethostname()}-{pid}.nsys-rep"
        # nsys wrapped Ray's worker process itself, started by Ray's raylet, not the program
        assert "default_worker.py" in " ".join(json.loads(report.read_text())["app"])
        whose = report.with_name(report.name.replace(".nsys-rep", ".whose.json"))
        entries = [ReportEntry(remote=str(report), stored=str(report), verified=True, status="complete"),
                   ReportEntry(remote=str(whose), stored=str(whose), size=whose.stat().st_size, verified=True)]
        names.append(ray_worker_name(entries))
    assert names == [f"Trainer trainer-a on {socket.gethostname()}, pid {pids[0]}",
                     f"Trainer trainer-b on {socket.gethostname()}, pid {pids[1]}"]


def test_a_node_without_nsys_is_refused_before_the_program_starts(tmp_path):
    # Ray 2.60 itself would start the program and fail it at the first actor: "RuntimeEnvSetupError:
    # ... nsight profile failed to run with the following error message: nsight is not installed"
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    started = tmp_path / "started"
    la = launch("ray", ["touch", str(started)], ["unused"], str(run_dir), None)
    script = "\n".join([f"RUN_DIR={shlex.quote(str(run_dir))}", f"COMMAND=(touch {shlex.quote(str(started))})",
                        *la.setup, la.line])
    bare = tmp_path / "bin"  # a PATH with bash's tools and no nsys
    bare.mkdir()
    for tool in ("mkdir", "cat", "touch", "printf"):
        (bare / tool).symlink_to(shutil.which(tool))
    done = subprocess.run(["/bin/bash", "-c", script], env={"PATH": str(bare)}, capture_output=True, text=True)
    assert done.returncode == 127 and "nsys is not on PATH" in done.stderr and "nothing was started" in done.stderr
    assert not started.exists() and (run_dir / "job.exit").read_text().strip() == "127"
