"""The run watch: the run's GPUs looked at through the whole run, not only at its start.

Runs ON THE NODE (standard library plus pynvml, Python 3.8), in a thread beside the relay
loop of :mod:`run`, from just after the profiler starts until it has exited. It does two things
with the same looks:

* finds a newcomer: anyone who joins the run's GPUs besides the workload, by the start check's
  signals (process lists, MPS servers, memory no listed process explains, utilization samples)
  and the rule :func:`fleet.policy.newcomers`. A run that programs counters yields to the first
  (:mod:`run` stops the profiler; this records when, and what was done); any other run notes
  each, since the kernel times it measured were shared from then on;
* records the node's conditions: the GPUs' identity, and about once a second their clocks,
  clock event reasons, temperature, power and every process on them, bounded in count.

A look reads NVML (tens of microseconds a call on an H200 test machine) and /proc only for the
pids NVML lists, never a scan of every process: the workload pays nothing measurable.
"""

from __future__ import annotations

import os
import threading
import time

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_gpus as nvml_gpus
    import fleet_agent_procs as procfs
    import fleet_policy as policy
    from fleet_planparts import WatchPart
except ImportError:  # as part of the installed package
    from . import gpus as nvml_gpus
    from . import procs as procfs
    from .. import policy
    from ..planparts import WatchPart

LOOK_EVERY = 0.25    # seconds between looks for a newcomer: the counters are to be free within 2 s
SAMPLE_EVERY = 1.0   # seconds between samples of the conditions
MAX_SAMPLES = 600    # beyond this, every other sample is dropped and the interval doubles
MAX_NOTES = 10       # newcomers noted in a run that does not yield
TREE_DEPTH = 64      # parents followed to find whether a pid is the workload's


class Processes:
    """pid -> (name, uid) read per pid when NVML lists it, and whether it is the workload's:
    below the profiler (``root``) or in its session (it was started in a session of its own)."""

    def __init__(self, root):
        self.root = root
        self._seen = {}  # pid -> (start time, (name, uid), in the workload's tree)
        # workload pids gone from /proc, which NVML may list a moment longer -> (name, uid)
        self._gone = {}

    def _entry(self, pid):
        lineage = procfs.lineage(pid)
        if lineage is None:
            hit = self._seen.pop(pid, None)
            if hit is not None and hit[2]:
                self._gone[pid] = hit[1]
            return (None, self._gone[pid], True) if pid in self._gone else None
        hit = self._seen.get(pid)
        if hit is None or hit[0] != lineage[2]:  # new, or the pid was reused
            hit = self._seen[pid] = (lineage[2], procfs.process(pid),
                                     self._below_root(pid, lineage))
        return hit

    def get(self, pid):
        entry = self._entry(pid)
        return entry[1] if entry else None

    def workload(self, pid):
        entry = self._entry(pid)
        return bool(entry and entry[2])

    def _below_root(self, pid, lineage):
        for _ in range(TREE_DEPTH):
            if pid == self.root or lineage[1] == self.root:
                return True
            if lineage[0] <= 1:
                return False
            pid, lineage = lineage[0], procfs.lineage(lineage[0])
            if lineage is None:
                return False
        return False


class Watch:
    """``begin(pid, started)`` once the profiler runs; ``newcomer`` is set (once) when someone
    joins a counter-using run; ``finish(released_at)`` after the profiler exited returns what
    goes in the result. ``gpus``: NVML indices, None for all."""

    def __init__(self, gpus, request, counters, contained=False, owner_uid=None):
        self.gpus, self.request, self.started = gpus, request, None
        self.counters, self.contained = counters, contained
        self.owner_uid = os.getuid() if owner_uid is None else owner_uid
        self.procs = None
        self.arrived = threading.Event()
        self.newcomer = None
        self.notes, self.samples, self.identities = [], [], []
        self.interval, self.error = SAMPLE_EVERY, None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fleet-watch", daemon=True)
        self._floor, self._known, self._noted = {}, frozenset(), set()
        self._last_look = None
        self._host_ns = procfs.host_pid_namespace()

    def begin(self, root_pid, started):
        self.procs, self.started = Processes(root_pid), started
        self._thread.start()

    def finish(self, released_at=None, action=None):
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        if self.newcomer is not None and released_at is not None:
            released = round(released_at - self.started, 3)
            self.newcomer.update(released_s=released,
                                 overlap_s=round(max(0.0, released - self.newcomer["appeared_s"]),
                                                 3))
        if self.newcomer is not None and action:
            self.newcomer["action"] = action
        conditions = {"gpus": self.identities, "interval_s": self.interval, "samples": self.samples}
        if self.error:
            conditions["error"] = self.error
        return {"newcomer": self.newcomer, "conditions": conditions, "notes": list(self.notes)}

    def _run(self):
        try:
            nv = self._nvml()
        except Exception as e:  # no NVML: nothing to watch, which the result says
            self.error = "the GPUs could not be watched: %s: %s" % (type(e).__name__, e)
            return
        try:
            handles = [(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in self._indices(nv)]
            self.identities = [nvml_gpus.identity(nv, h, i) for i, h in handles]
            next_sample, first = 0.0, True
            while True:
                stopping = self._stop.is_set()
                now = time.monotonic()
                looks = [nvml_gpus.look(nv, h, i, self.procs, self.owner_uid) for i, h in handles]
                if not stopping:  # the last look, after the profiler exited, is a sample only
                    self._judge(looks, now, first)
                if first or stopping or now >= next_sample:
                    self._sample(nv, handles, looks, now)
                    next_sample = now + self.interval
                first = False
                if stopping:
                    return
                self._stop.wait(LOOK_EVERY)  # set by finish(): one more look, the run's last sample
        except Exception as e:  # a fault in the watch must not end the run: it is said
            self.error = "the watch stopped: %s: %s" % (type(e).__name__, e)
        finally:
            nv.nvmlShutdown()

    @staticmethod
    def _nvml():
        import ctypes
        ctypes.CDLL("libnvidia-ml.so.1")  # as gpus.gpus: is there a driver at all?
        import pynvml as nv
        nv.nvmlInit()
        return nv

    def _indices(self, nv):
        count = nv.nvmlDeviceGetCount()
        wanted = self.gpus if self.gpus is not None else range(count)
        return [i for i in wanted if 0 <= i < count]

    def _state(self, looks):
        return policy.NodeState.read({"gpus": looks, "host_pid_namespace": self._host_ns})

    def _judge(self, looks, now, first):
        state = self._state(looks)
        workload = frozenset(p["pid"] for g in looks
                             for p in g["processes"] if self.procs.workload(p["pid"]))
        for gpu, unexplained in policy.unexplained_memory(state, self.request).items():
            self._floor[gpu] = min(self._floor.get(gpu, unexplained), unexplained)
        found = policy.newcomers(state, self.request, workload, self.contained, self._floor,
                                 self._known)
        # allowed to stay when the run began (a trace warned of them)
        if first and not self.counters:
            self._known = frozenset(n.key for n in found)
            found = []
        at = round(now - self.started, 3)
        clear = round(self._last_look - self.started, 3) if self._last_look is not None else None
        self._last_look = now
        for n in found:
            if self.counters and self.newcomer is None:
                self._arrived(n, at, clear)
            elif not self.counters and n.key not in self._noted and len(self._noted) < MAX_NOTES:
                self._note(n, at)

    def _arrived(self, n, at, clear):
        """A newcomer beside counters: recorded (``at``: seconds since the profiler started;
        ``clear``:
        the last look that saw none) and said at once, for the profiler to yield."""
        self.newcomer = {"gpu": n.gpu, "pid": n.pid, "user": n.user, "used_memory": n.used_memory,
                         "unseen": n.unseen, "why": n.why, "appeared_s": at, "last_clear_s": clear,
                         "overlap_s": None, "action": None}
        self.arrived.set()

    def _note(self, n, at):
        """A newcomer beside a trace: nothing to yield, but the times measured
        from then on were shared."""
        self._noted.add(n.key)
        who = n.why if n.unseen else str(policy.Tenant(n.gpu, n.pid, n.user, n.used_memory, n.why))
        self.notes.append("a newcomer joined the GPU %.1f s after the profiler started (%s): nsys "
                          "trace programs no counters and went on, but the kernel times it "
                          "measured from then on were shared" % (at, who))

    def _sample(self, nv, handles, looks, now):
        t = round(now - self.started, 3)
        for (i, h), g in zip(handles, looks):
            sample = dict({"t": t, "gpu": i}, **nvml_gpus.conditions(nv, h))
            sample["processes"] = [{"pid": p["pid"], "user": p.get("user"), "name": p.get("name"),
                                    "used_memory": p.get("used_memory"),
                                    "own": self.procs.workload(p["pid"])}
                                   for p in g["processes"]]
            self.samples.append(sample)
        if len(self.samples) > MAX_SAMPLES * max(1, len(handles)):
            # Thinned, never cut: the whole run stays covered, at half the rate.
            self.samples = self.samples[:len(handles)] + self.samples[len(handles)::2]
            self.interval *= 2


def for_plan(plan):
    """The run's watch, from the plan's ``watch`` (a planparts.WatchPart: its GPUs, --allow-own,
    the Slurm job, whether it programs counters), or, in a plan from a fleet without it, from the
    last-moment check's. None where neither is there."""
    spec = getattr(plan, "watch", None)
    if spec is None and plan.recheck is not None:
        spec = WatchPart(plan.recheck.gpus, plan.recheck.allow_own, counters=True)
    if spec is None:
        return None
    request = policy.Request(gpus=spec.gpus, allow_own=spec.allow_own, job=spec.job)
    return Watch(spec.gpus, request, spec.counters, contained=bool(plan.command.wrapper))
