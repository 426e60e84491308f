"""One GPU as the node's state describes it: what it is (its MIG mode and instances, its
utilization) and who is on it (the processes NVML lists), read once into :class:`Gpu` and its
parts, a part of :class:`nodestate.NodeState`.

The agent's probe (``fleet/agent/gpus.py``), its run's watch and the live look send each GPU as a
dict of the document; :meth:`Gpu.read` reads it, on the controller and on the node alike, and never
fails: a value not of its type reads as absent, and a process of unknown owner is someone else's.
Pure and Python 3.8, like the rest of the policy: it travels to the nodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

try:  # as shipped, the policy's parts travel under flat names (fleet/agent/bundle.py)
    from fleet_policy_readers import dict_of, dicts_of, int_of, ints_of, is_int, str_of, strs_of
except ImportError:
    from .readers import dict_of, dicts_of, int_of, ints_of, is_int, str_of, strs_of

__all__ = ["Gpu", "GpuProcess", "MigMode", "Utilization", "MigInstance"]



@dataclass(frozen=True)
class GpuProcess:
    """A process NVML lists on a GPU (gpus.gpu_processes)."""
    pid: int | None = None
    kinds: Tuple[str, ...] = ()         # compute, graphics, mps: the lists that name it
    used_memory: int | None = None
    gpu_instance: int | None = None     # MIG only
    compute_instance: int | None = None
    user: str | None = None
    uid: int | None = None
    name: str | None = None             # its comm
    foreign: bool = True                # not the run owner's, or not visible (unsaid: someone else)
    why: str | None = None              # only where its pid is not visible from the agent
    slurm_job: str | None = None        # only for the owner's own processes

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "GpuProcess":
        foreign = d.get("foreign")
        return cls(int_of(d.get("pid")), strs_of(d.get("kinds")), int_of(d.get("used_memory")),
                   int_of(d.get("gpu_instance")), int_of(d.get("compute_instance")),
                   str_of(d.get("user")),
                   int_of(d.get("uid")), str_of(d.get("name")), foreign if isinstance(foreign, bool)
                   else True, str_of(d.get("why")), str_of(d.get("slurm_job")))


@dataclass(frozen=True)
class MigMode:
    current: int | None = None
    pending: int | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "MigMode":
        return cls(int_of(d.get("current")), int_of(d.get("pending")))


@dataclass(frozen=True)
class Utilization:
    gpu: int | None = None
    memory: int | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Utilization":
        return cls(int_of(d.get("gpu")), int_of(d.get("memory")))


@dataclass(frozen=True)
class MigInstance:
    uuid: str | None = None
    name: str | None = None
    gpu_instance: int | None = None
    compute_instance: int | None = None
    memory_total: int | None = None

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "MigInstance":
        return cls(str_of(d.get("uuid")), str_of(d.get("name")), int_of(d.get("gpu_instance")),
                   int_of(d.get("compute_instance")), int_of(d.get("memory_total")))


@dataclass(frozen=True)
class Gpu:
    """One GPU: who is on it (all that the run's watch and the live look send again, gpus.look),
    and, from the probe, what it is (gpus.gpu)."""
    index: int
    processes: Tuple[GpuProcess, ...] = ()
    process_list_error: str | None = None
    memory_used_by_processes: int | None = None  # NVML memory v2: every PID namespace's processes
    sampled_pids: Tuple[int, ...] | None = None
    uuid: str | None = None
    name: str | None = None
    minor: int | None = None            # /dev/nvidiaN: how Slurm's gres names it
    architecture: int | None = None     # NVML's number; HOPPER and later share counters with DCGM
    architecture_name: str | None = None
    mig_mode: MigMode = MigMode()
    compute_mode: str | int | None = None  # a name, or NVML's number where it has none
    memory_total: int | None = None
    memory_used: int | None = None
    memory_reserved: int | None = None
    utilization: Utilization | None = None
    mig_instances: Tuple[MigInstance, ...] = ()

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "Gpu":
        """``d`` holds an int ``index`` (the wire's shape, checked before)."""
        sampled, mode, util = d.get("sampled_pids"), d.get("compute_mode"), d.get("utilization")
        return cls(
            d["index"], tuple(GpuProcess.read(p) for p in dicts_of(d.get("processes"))),
            str_of(d.get("process_list_error")), int_of(d.get("memory_used_by_processes")),
            ints_of(sampled) if isinstance(sampled, list) else None, str_of(d.get("uuid")),
            str_of(d.get("name")),
            int_of(d.get("minor")), int_of(d.get("architecture")),
            str_of(d.get("architecture_name")),
            MigMode.read(dict_of(d.get("mig_mode"))), mode if isinstance(mode, str) or is_int(mode)
            else None,
            int_of(d.get("memory_total")), int_of(d.get("memory_used")),
            int_of(d.get("memory_reserved")),
            Utilization.read(util) if isinstance(util, dict) else None,
            tuple(MigInstance.read(m) for m in dicts_of(d.get("mig_instances"))))

    @property
    def mig(self) -> bool:
        return self.mig_mode.current == 1

