"""What a run's manifest records of the node it ran on (:class:`NodeFacts`): its name, its GPUs'
name, the driver, the profiler's version and the processes seen on the run's GPUs, made from the
node's state (``NodeState.facts``) and read back from a rank's result or a manifest.

Pure and Python 3.8, like the rest of the policy: it travels to the nodes, where a Slurm rank
writes it into its result.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Tuple

try:  # as shipped, the policy's parts travel under flat names (fleet/agent/bundle.py)
    from fleet_policy_readers import dicts_of, str_of
except ImportError:
    from .readers import dicts_of, str_of

__all__ = ["NodeFacts"]



@dataclass(frozen=True)
class NodeFacts:
    """What a run's manifest records of the node it ran on (``NodeState.facts``), the same whether
    fleet read the state over SSH (lab servers) or a rank made it on the node and wrote it into its
    result (Slurm), where :meth:`read` reads it back. ``processes_seen``: each process on the run's
    GPUs as the store's ``ProcessSeen`` reads it."""
    node: str | None = None
    gpu: str | None = None
    driver: str | None = None
    tool_version: str | None = None
    processes_seen: Tuple[Dict[str, Any], ...] = ()

    @classmethod
    def read(cls, d: Dict[str, Any]) -> "NodeFacts":
        return cls(str_of(d.get("node")), str_of(d.get("gpu")), str_of(d.get("driver")),
                   str_of(d.get("tool_version")), tuple(dicts_of(d.get("processes_seen"))))

    def to_json(self) -> Dict[str, Any]:
        return {"node": self.node, "gpu": self.gpu, "driver": self.driver,
                "tool_version": self.tool_version,
                "processes_seen": [dict(p) for p in self.processes_seen]}
