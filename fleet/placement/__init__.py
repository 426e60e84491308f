"""Problem 1, placement: is the profiler where the workload runs, and which GPU does the run go to?

The door to where fleet answers it. Its rules:

* the profiler found on the node: the agent looks on PATH, in Nsight's own install folders and
  the CUDA toolkit's, or where the inventory says (``nsys_path``, ``ncu_path``), and records each
  one's version (fleet/agent/node.py); the policy refuses a run early, saying where it looked,
  when it is missing, and never runs one as root that another account could change
  (``policy.tool_refused``);
* in a container the node's own Nsight install is mounted read-only at the same path, so the
  profiler inside is the node's (:func:`fleet.wrapping.containers.nsight_dirs`);
* ``--gpu free``: a GPU nobody else is on now, by the neighbours' own rule (:mod:`.free`).

:func:`finding` is what ``fleet doctor`` says of it for one node.
"""

from __future__ import annotations

from .. import policy

TOOLS = ("nsys", "ncu")


def finding(state: policy.NodeState) -> policy.Finding:
    """Whether nsys and ncu were found on the node, and whether root could run them safely."""
    found = [policy.tool_found(state, t) for t in TOOLS]
    tools = [f"{t} {f.version or ''} at {f.path}".replace("  ", " ") if f else f"{t} missing"
             for t, f in zip(TOOLS, found)]
    changeable = [f"{t} at {f.path}: {f.writable_by_others}" for t, f in zip(TOOLS, found)
                  if f and f.writable_by_others and policy.privileged(state)]
    if changeable:  # root would run code another account chose: never "placement ok"
        return policy.Finding("bad", "; ".join(changeable) + ": as root fleet will not run it")
    return policy.Finding(policy.OK if all(found) else ("warn" if any(found) else "bad"),
                          "; ".join(tools))
