"""Problem 2, wrapping: which process must the profiler be put in front of?

The door to where fleet answers it. A runtime that starts its own workers (torchrun, mpirun, Ray)
must have the profiler in front of each worker, not of itself; a container must have it inside.
Its rules, each pure text, on both paths:

* :mod:`.launchers`: where a launcher's own arguments end and the worker's program begins, how
  many ranks it starts, and the words that put nsys in front of each rank on a lab server (the
  Slurm batch script's own are :mod:`fleet.slurm.launchers`; Ray's, its ``runtime_env``,
  :mod:`fleet.slurm.ray_hook`);
* :mod:`.containers`: the words that put the workload in pyxis, Apptainer or Docker, the node's
  Nsight mounted inside, with the least privilege the plan needs;
* :mod:`.nsysopts`: what ``nsys profile`` takes on its command line, and what it refuses;
* :mod:`.windows`: the part of a long run nsys is told to collect (``--window``, capture ranges).

:func:`finding` is what ``fleet doctor`` says of it for one node: the wrapping itself is chosen per
command, so the node can only say where its agent ran.
"""

from __future__ import annotations

from .. import policy


def finding(state: policy.NodeState) -> policy.Finding:
    """Where the agent ran (host, container, Slurm job): the wrapping itself
    is chosen per command."""
    where = f"in a {state.container} container" if state.container else "on the host"
    return policy.Finding("n/a", f"chosen per command (srun, torchrun, mpirun); agent ran {where}"
                                 + (f" inside Slurm job {state.slurm_job}" if state.slurm_job
                                    else ""))
