"""What a run holds on the node while its profiler runs, all given back at its end (or early,
once a yield ended the collection and the workload goes on): the GPUs' counter locks, the owned
sysctls and DCGM's profiling paused.

Runs ON THE NODE (standard library, Python 3.8), for the agent's run (:mod:`run`).
"""

from __future__ import annotations

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_asroot as asroot
    import fleet_agent_locks as gpu_locks
    import fleet_agent_owned as owned
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import asroot
    from . import locks as gpu_locks
    from . import owned


def give_back(changes, locks, result):
    """Once a yield has ended the collection alone (nsys's session stop) and the workload goes on:
    the owned sysctls and DCGM's profiling are put back and the GPUs' counter locks released now,
    not when the workload ends, which may be hours later."""
    changes.put_back(result)
    while locks:
        locks.pop().release()


def lock_gpus(plan, locks):
    """Takes the plan's GPU counter locks, each into ``locks``; why not where
    another run holds one."""
    for uuid in plan.gpu_locks:
        lock = gpu_locks.GPULock(uuid)
        if not lock.acquire(plan.lock_wait):
            h = lock.holder() or {}
            return "GPU %s is being profiled by pid %s (user %s: %s)" % (
                uuid, h.get("pid", "?"), h.get("user") or "?", h.get("command") or "?")
        locks.append(lock)
    return None


class NodeChanges:
    """What the run changes on the node (owned sysctls, DCGM profiling paused), always put back."""

    def __init__(self, holder):
        self.holder, self.made = holder, False

    def make(self, plan, result):
        """Sets the plan's owned sysctls and pauses DCGM; the plan to run, without CPU sampling
        where the sysctls could not be set (trace without it rather than not at all)."""
        if plan.sysctls:
            try:
                self.made = True
                result["changed"] = asroot.privileged("acquire_sysctls", wanted=plan.sysctls,
                                                      owned=plan.owned_sysctls, holder=self.holder)
            except (owned.OwnedError, OSError) as e:
                # Root never answered: nothing was changed, so there is nothing to put back.
                self.made = not isinstance(e, asroot.NoRoot)
                plan = plan.without_sampling("could not set %s (%s)" % (", ".join(plan.sysctls), e))
                result["given_up"] = list(plan.given_up)
        if plan.pause_dcgm:
            self.made = True
            asroot.privileged("pause_dcgm", holder=self.holder)
            result["changed"]["dcgm"] = "profiling paused"
        return plan

    def put_back(self, result):
        if not self.made:
            return
        # once: early where a yield gave the node back (give_back), else at the run's end
        self.made = False
        try:
            result["restored"] = asroot.privileged("release", holder=self.holder)
        except Exception as e:  # reported; the next run or `fleet repair` puts it back
            result["notes"].append("could not put back node state now "
                                   "(%s); `fleet repair` will" % e)
