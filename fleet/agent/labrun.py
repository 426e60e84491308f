"""A lab server's run in one call: look at the node, plan there, and carry the plan out.

Runs ON THE NODE (standard library, Python 3.8), as the agent's "lab" mode. A lab run used to
ask each node twice, the probe and then the plan to carry out, and each call started the node's
Python and the agent again (a fifth of a second on an H100 test machine, before the profiler).
Here the probe's document goes back first, as the probe's answer; the node is then planned by the
same planner and policy fleet runs, as a Slurm task plans its rank (:mod:`task`), and the plan is
carried out by :mod:`run`. fleet makes its own plan from the document it got and holds the result
to that plan: a node that planned otherwise gains nothing by it.
"""

from __future__ import annotations

import signal
import sys

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_node as node
    import fleet_agent_run as run
    import fleet_agent_wire as wire
    import fleet_plan as planner
    import fleet_policy as policy
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import node, run, wire
    from .. import plan as planner
    from .. import policy

PLAN_FAILED_EXIT = 1


def main(args):
    # A stop while the node is looked at or planned is remembered, not fatal: the run then starts
    # no profiler, and still answers (run.main).
    stops = []
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda s, f: stops.append(s))
    document = node.probe(args["probe"])
    sys.stdout.write(wire.frame("probe", document))
    sys.stdout.flush()
    try:
        plan = planner.plan(args["host"], policy.NodeState.read(document),
                            planner.ProfileRequest.from_json(args["request"]),
                            args["owned_sysctls"])
    except (TypeError, KeyError, AttributeError, ValueError) as e:
        # fleet's own plan from the same document says why, as for a probe it cannot plan on
        sys.stderr.write("fleet: this node could not be planned: %s: %s\n"
                         % (type(e).__name__, e))
        return PLAN_FAILED_EXIT
    if plan.status != "ok":
        return run.REFUSED_EXIT  # fleet's own plan, from the same document, says why
    return run.main({"plan": plan, "context": args["context"]}, stops)
