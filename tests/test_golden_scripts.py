"""Every batch script a user can ask fleet for, and the lab path's ``docker run`` words, as golden files.

Each variant below is rendered through the function ``fleet profile --partition`` submits with
(``fleet.slurm.script.render``, as ``fleet.slurm.run.prepare`` calls it) from fixed inputs: a fixed
run id, nonce, paths and Python. Nothing random reaches the script but the nonce, and it is injected
(``JobFiles.nonce``), so the text is compared byte for byte.

On a mismatch the test prints a unified diff. When the change is on purpose, regenerate every
golden file and review the diff before committing it:

    FLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -p no:cacheprovider -q tests/test_golden_scripts.py

Each batch script must also pass ``bash -n`` and, where shellcheck is installed, ``shellcheck -s bash``
(skipped with a reason where it is not).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import replace

import pytest

from fleet.wrapping import containers
from fleet.wrapping.containers import Container
from fleet.plan import LabPart, ProfileRequest
from fleet.policy import docker_privileges
from fleet.slurm import options
from fleet.slurm.script import JobFiles, JobSpec, render
from tests.harness.golden import GOLDEN, compare


RUN_ID = "20261129-120000-abcd"
NONCE = "0123456789abcdef0123456789abcdef"  # prepare's secrets.token_hex(16), fixed
ROOT = "/scratch/ana/fleet-reports"
TOOLS = {"nsys": "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys",
         "ncu": "/opt/nvidia/nsight-compute/2025.3.0/ncu"}
FILES = JobFiles(f"{ROOT}/{RUN_ID}", ROOT, "/usr/bin/python3", TOOLS,
                 python_note="/usr/bin/python3 (the login node's python3; set ansible_python_interpreter to choose)",
                 nonce=NONCE)
SHAPE = JobSpec(partition="gpu", nodes=2, ntasks_per_node=2, gpus="h100:4", time="00:30:00", workdir="/home/ana/work")
TRAIN = ("python3", "train.py", "--lr", "1e-3", "it's \"quoted\" $HOME")
TORCHRUN = ("torchrun", "--nnodes", "2", "--nproc-per-node=2", "--rdzv-backend", "c10d", "train.py", "--lr", "1e-3")
TORCH_MODULE = ("python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "4", "-m", "pkg.train")
MPIRUN = ("mpirun", "-np", "4", "--mca", "btl", "self,tcp", "-x", "NCCL_DEBUG", "./app", "-np", "9")
RAY = ("python3", "ray_job.py", "--workers", "4")
PYXIS = Container("pyxis", "nvcr.io#nvidia/pytorch:25.01-py3", containers.nsight_dirs(TOOLS))
APPTAINER = Container("apptainer", "/shared/images/pytorch.sif", containers.nsight_dirs(TOOLS))


def request(tool: str = "nsys", command=TRAIN, **kw) -> ProfileRequest:
    return ProfileRequest(tool=tool, command=tuple(command), run_id=RUN_ID, **kw)


# name: (request, job shape, files): one of each variant a user can ask for.
SCRIPTS = {
    "srun.sbatch": (request(profiler_args=("--trace=cuda,nvtx",)), SHAPE, FILES),
    "srun-ranks.sbatch": (request(), replace(SHAPE, ranks=(0, 3), account="proj", qos="high",
                                             sbatch_args=("--constraint=h100",)), FILES),
    "srun-ncu.sbatch": (request("ncu", profiler_args=("--set=full",)), SHAPE, FILES),
    "srun-gpu-metrics.sbatch": (request(gpu_metrics=True), SHAPE, FILES),
    # --window: one moment for every rank's window, exported to the ranks; --nvtx-window --repeat: in the request
    "srun-window.sbatch": (request(lab=LabPart(window=(60, 30))), SHAPE, FILES),
    "srun-nvtx-window.sbatch": (request(nvtx_window="step", repeat=2), SHAPE, FILES),
    # --export=NONE: no PATH in the job, so the agent's Python is the inventory's, by absolute path.
    "srun-export-none.sbatch": (request(), replace(SHAPE, sbatch_args=("--export=NONE",)),
                                replace(FILES, python="/opt/py311/bin/python3.11",
                                        python_note="/opt/py311/bin/python3.11 (the inventory's "
                                                    "ansible_python_interpreter)")),
    "srun-scratch.sbatch": (request(), SHAPE, replace(FILES, scratch="/local/scratch", prolog=True)),
    "torchrun.sbatch": (request(command=TORCHRUN), replace(SHAPE, launcher="torchrun"), FILES),
    "torchrun-module.sbatch": (request(command=TORCH_MODULE), replace(SHAPE, launcher="torchrun", nodes=1), FILES),
    "mpirun.sbatch": (request(command=MPIRUN), replace(SHAPE, launcher="mpirun"), FILES),
    "ray.sbatch": (request(command=RAY, profiler_args=("--sample=none",)), replace(SHAPE, launcher="ray"), FILES),
    "pyxis-nsys.sbatch": (request(), replace(SHAPE, container=PYXIS), FILES),
    "pyxis-ncu.sbatch": (request("ncu"), replace(SHAPE, container=PYXIS), FILES),
    "apptainer-nsys.sbatch": (request(), replace(SHAPE, container=APPTAINER), FILES),
    "apptainer-ncu.sbatch": (request("ncu"), replace(SHAPE, container=APPTAINER), FILES),
    "pyxis-scratch.sbatch": (request(), replace(SHAPE, container=PYXIS), replace(FILES, scratch="/local/scratch")),
    "apptainer-scratch.sbatch": (request(), replace(SHAPE, container=APPTAINER),
                                 replace(FILES, scratch="/local/scratch")),
    "torchrun-pyxis.sbatch": (request(command=TORCHRUN), replace(SHAPE, launcher="torchrun", container=PYXIS), FILES),
    "torchrun-apptainer.sbatch": (request(command=TORCHRUN), replace(SHAPE, launcher="torchrun",
                                                                     container=APPTAINER), FILES),
    "mpirun-apptainer.sbatch": (request(command=MPIRUN), replace(SHAPE, launcher="mpirun", container=APPTAINER),
                                FILES),
}

DOCKER = Container("docker", "nvcr.io/nvidia/pytorch:25.01-py3", containers.nsight_dirs(TOOLS))
REPORT_DIR = "/home/ana/fleet-reports/20261129-120000-abcd"
GPUS = ("GPU-5d1d1c7e-0000-0000-0000-000000000001", "GPU-5d1d1c7e-0000-0000-0000-000000000002")
SECCOMP = "/etc/fleet/seccomp-perf.json"
# name: (tool, counters, sampling, seccomp profile, gpus): the privileges each profile is granted.
DOCKER_RUNS = {
    "docker-nsys-trace.argv": ("nsys", False, False, None, None),
    "docker-nsys-sampling.argv": ("nsys", False, True, SECCOMP, GPUS),
    "docker-nsys-sampling-no-profile.argv": ("nsys", False, True, None, GPUS[:1]),
    "docker-nsys-gpu-metrics.argv": ("nsys", True, False, None, GPUS),
    "docker-ncu.argv": ("ncu", True, False, SECCOMP, GPUS[:1]),
}


def docker_words(tool, counters, sampling, seccomp, gpus) -> str:
    """The ``docker run`` words before the profiler's argv, as lab/profile.in_docker asks for them:
    one word a line, shell-quoted, so a privilege added or dropped is one line of the diff."""
    granted = docker_privileges(tool, counters, sampling, seccomp)
    words = containers.docker_run(DOCKER, REPORT_DIR, user="1000:1000", gpus=gpus, privileges=granted)
    given_up = [f"# CPU sampling given up: {granted.given_up}"] if granted.given_up else []
    return "\n".join([*given_up, *map(shlex.quote, words)]) + "\n"


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_batch_script_matches_its_golden_file(name):
    req, spec, files = SCRIPTS[name]
    compare(name, render(req, options.checked(spec, req), files))


@pytest.mark.parametrize("name", sorted(DOCKER_RUNS))
def test_docker_run_words_match_their_golden_file(name):
    compare(name, docker_words(*DOCKER_RUNS[name]))


def test_every_golden_script_is_a_variant_here():
    """A golden file no variant renders any more is stale, not a check."""
    assert sorted(p.name for p in GOLDEN.glob("*.sbatch")) == sorted(SCRIPTS)
    assert sorted(p.name for p in GOLDEN.glob("*.argv")) == sorted(DOCKER_RUNS)


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_golden_script_is_valid_bash(name):
    subprocess.run(["bash", "-n", str(GOLDEN / name)], check=True)


# What shellcheck reports on fleet's scripts that is on purpose, by code (everything else fails):
SHELLCHECK_EXCLUDED = {
    "SC2317": "stop_profilers looks unreachable: it is called by the USR1 trap",
    "SC2015": "`[ \"$status\" -gt 128 ] && kill -0 \"$step\" || break`: break when either fails is the point",
    "SC2016": "a user's $WORD in COMMAND=(...) and the copy-back's sh -c program are single-quoted so that "
              "the batch shell does not expand them",
    "SC2054": "a comma inside a user's word (mpirun --mca btl self,tcp) is that word's, not an array separator",
}


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_golden_script_passes_shellcheck(name):
    excluded = ["--exclude=" + ",".join(SHELLCHECK_EXCLUDED)] if SHELLCHECK_EXCLUDED else []
    out = subprocess.run(["shellcheck", "-s", "bash", "-f", "gcc", *excluded, str(GOLDEN / name)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
