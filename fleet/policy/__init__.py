"""What may run where: a pure function from a node's state and a request to verdicts.

No I/O here, and nothing newer than Python 3.8: the agent carries the policy to the nodes for
its last-moment check. The node state is the agent's JSON document (``fleet/agent/node.py``),
read once into ``nodestate.NodeState``; the request says what the user asks for. Every rule of
problems 4 (permissions) and 5 (neighbours) lives in this package and nowhere else, and every
verdict carries its reasons and a remedy a person can act on. Callers use ``policy.X``; the parts,
one concern each:

- ``nodestate``: ``NodeState`` and its parts (``Tool``, ``Mps``, ``PrologVerdict``, ...), each read
  from the agent's document once; ``gpustate``: each GPU's (``Gpu``, ``GpuProcess``, ``MigMode``,
  ...); ``nodefacts``: ``NodeFacts``, what a run's manifest records of its node;
- ``vocabulary``: ``Request``, ``Verdict``, ``Tenant``, ``Finding``, the statuses, ``WAYS``,
  ``COUNTER_OPTIONS`` (the profiler options only fleet may set), ``uses_counters``;
- ``permissions`` (problem 4): the tool, the report directory, counter access, CPU sampling
  (``nsys_cpu_sampling``, ``sampling_given_up``, ``held_sysctls``), ``docker_privileges``;
- ``neighbours`` (problem 5): ``tenants``, ``unseen_tenants``, ``free_gpus`` (what ``--gpu free``
  chooses from), ``newcomers`` (who joined a run's
  GPUs), ``prolog_tenants``, DCGM (``dcgm_pause``), ``job_gpu_indices``, ``exclusive_node`` and
  ``guards`` (GPU locks, the last-moment check, pinning GPUs, who changes node state);
- ``verdicts``: ``assess`` (a verdict for each way to profile) and the doctor's ``findings``.
"""

from __future__ import annotations

try:  # as shipped, the parts travel under flat names (fleet/agent/bundle.py)
    # each part's __all__ is the policy's API
    from fleet_policy_gpustate import *  # noqa: F401,F403
    from fleet_policy_neighbours import *  # noqa: F401,F403
    from fleet_policy_nodefacts import *  # noqa: F401,F403
    from fleet_policy_nodestate import *  # noqa: F401,F403
    from fleet_policy_permissions import *  # noqa: F401,F403
    from fleet_policy_verdicts import *  # noqa: F401,F403
    from fleet_policy_vocabulary import *  # noqa: F401,F403
except ImportError:
    from fleet.policy.gpustate import *  # noqa: F401,F403
    from fleet.policy.neighbours import *  # noqa: F401,F403
    from fleet.policy.nodefacts import *  # noqa: F401,F403
    from fleet.policy.nodestate import *  # noqa: F401,F403
    from fleet.policy.permissions import *  # noqa: F401,F403
    from fleet.policy.verdicts import *  # noqa: F401,F403
    from fleet.policy.vocabulary import *  # noqa: F401,F403
