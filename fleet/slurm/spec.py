"""How a profiled job is shaped (``fleet profile --partition``'s options, a playbook's target):
plain data, as given. :func:`.options.checked` checks it once into the ``CheckedJobSpec`` that
the batch script's renderer (:mod:`.script`) and the run (:mod:`.run`) take."""

from __future__ import annotations

from dataclasses import dataclass

from ..wrapping.containers import Container


@dataclass(frozen=True)
class JobSpec:
    """How the job is shaped; None leaves an option to Slurm's defaults."""
    partition: str | None = None
    nodes: int | None = None
    ntasks: int | None = None
    ntasks_per_node: int | None = None
    gpus: str | None = None                 # --gpus, e.g. "4" or "h100:4"
    gres: str | None = None                 # --gres, e.g. "gpu:2"
    time: str | None = None                 # --time, Slurm's formats
    account: str | None = None
    qos: str | None = None
    exclusive: bool | None = None           # None: for ncu and GPU metrics, yes
    sbatch_args: tuple[str, ...] = ()       # passed through as further #SBATCH lines
    # None: every rank; Ray: actor name patterns
    ranks: tuple[int, ...] | tuple[str, ...] | None = None
    launcher: str = "srun"                  # srun | torchrun | mpirun | ray
    # seconds before the time limit the profilers are stopped (None: 120, or half a shorter limit;
    # options.fit_stop_before)
    stop_before: int | None = None
    workdir: str | None = None              # the job's working directory (default: the submitter's)
    container: Container | None = None
