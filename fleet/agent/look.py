"""The live look (``fleet top``): who is on each GPU of this node and how hard it works, sampled
in place and streamed as one framed line per sample over the session fleet opened.

Runs ON THE NODE (standard library plus pynvml, Python 3.8). NVML is only read: GPM samples
(Hopper and newer), the plain utilization rates where GPM is not there, memory, clocks, power
and the process lists; no counter is programmed, no clock set, so the look may run beside
anyone's work, ncu included (seen on an H200 test machine: ncu profiled without an error while
GPM was sampled, tests/fixtures/gpm-h200). There is no daemon and no port: the look ends when
its reader goes away (the next line finds its pipe closed, or the session that started it has
gone), after ``samples`` lines, or at its ``lifetime``, whichever comes first.

The first line carries the node's probed state (``node.probe``, without ``nsys status -e``), so
the controller judges every GPU by the same policy as ``fleet profile``; each line after it
carries only what changes.
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import Optional

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_gpus as nvml_gpus
    import fleet_agent_node as node
    import fleet_agent_procs as procfs
    import fleet_agent_wire as wire
except ImportError:  # as part of the installed package
    from . import gpus as nvml_gpus
    from . import node
    from . import procs as procfs
    from . import wire

INTERVAL_BOUNDS = (0.2, 60.0)  # seconds between samples
LIFETIME_MAX = 24 * 3600.0     # no look outlives a day, whatever it was asked
COMMAND_CHARS = 200            # of a process's command line, enough to tell it apart
FIRST_WINDOW = 0.25            # seconds of the first sample's GPM window in a stream

# GPM metrics (nvml.h NVML_GPM_METRIC_*) -> the names the look gives them; percent of the GPU.
GPM_METRICS = {"sm_activity": 2, "sm_occupancy": 3, "tensor_activity": 5, "dram_bandwidth": 10,
               "fp32_activity": 12, "fp16_activity": 13, "fp64_activity": 11}

# How a process's cgroup path names the container or Slurm job it runs in.
CONTAINER_WORDS = ("docker", "containerd", "kubepods", "libpod", "lxc", "podman")


class OnDemand:
    """pid -> (name, uid), read from /proc only for the pids asked about: the look names the
    few processes on the GPUs, and never walks every process of the node each second."""

    def __init__(self):
        self.seen = {}

    def get(self, pid, default=None):
        if pid not in self.seen:
            self.seen[pid] = procfs.process(pid)
        return self.seen[pid] if self.seen[pid] is not None else default


def cgroup_of(pid):
    """(container, Slurm job) a process runs in, as its cgroup path says;
    (None, None) if neither."""
    text = procfs.read("/proc/%d/cgroup" % pid, "") or ""
    container = next((w for w in CONTAINER_WORDS if w in text), None)
    job = None
    for part in text.replace("\n", "/").split("/"):
        if part.startswith("job_") and part[4:].isdigit():
            job = part[4:]
    return container, job


def command_of(pid):
    argv = (procfs.read("/proc/%d/cmdline" % pid) or "").split("\0")
    text = " ".join(a for a in argv if a)
    return text[:COMMAND_CHARS] if text else None


def named(processes):
    """The GPU's processes with their command, container and Slurm job where /proc shows them."""
    for p in processes:
        if p.get("name") is None:  # not visible from here: nothing more to read
            continue
        container, job = cgroup_of(p["pid"])
        p["command"] = command_of(p["pid"])
        p["container"] = container
        # a workload fleet left running: by it
        p["session"] = (procfs.lineage(p["pid"]) or (None, None, None))[1]
        if job and not p.get("slurm_job"):
            p["slurm_job"] = job
    return processes


class Gpm:
    """GPM over one GPU: two samples alternate, and each look gives the metrics between the
    previous sample and this one. None of it where the GPU has no GPM (older than Hopper)."""

    def __init__(self, nv, h):
        self.nv, self.h, self.why = nv, h, None
        try:
            supported = nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice
        except Exception as e:  # an older driver or binding: the plain utilization is used
            supported, self.why = False, "GPM not available: %s" % e
        if not supported:
            self.why = self.why or "GPM not supported on this GPU (Hopper or newer has it)"
            self.samples = None
            return
        self.samples = []
        try:
            self.samples = [nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()]
            nv.nvmlGpmSampleGet(h, self.samples[0])
        except Exception as e:  # a GPU in MIG mode, or GPM refused here: the plain utilization then
            self.free()
            self.samples, self.why = None, "GPM not available here: %s" % e

    def metrics(self):
        """Metric name -> percent over the last interval (None: that metric failed), or None."""
        if self.samples is None:
            return None
        nv = self.nv
        nv.nvmlGpmSampleGet(self.h, self.samples[1])
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version, req.numMetrics = nv.NVML_GPM_METRICS_GET_VERSION, len(GPM_METRICS)
        req.sample1, req.sample2 = self.samples
        for i, metric in enumerate(GPM_METRICS.values()):
            req.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(req)
        self.samples.reverse()  # this sample is the next interval's first
        return {name: round(req.metrics[i].value, 2) if req.metrics[i].nvmlReturn == 0 else None
                for i, name in enumerate(GPM_METRICS)}

    def free(self):
        for s in self.samples or []:
            nvml_gpus._try(lambda: self.nv.nvmlGpmSampleFree(s))


def activity(nv, h, gpm):
    """How hard the GPU works: GPM's metrics where it has them, else the plain utilization,
    marked as such (it says 100 % for one tiny kernel at a time)."""
    util = nvml_gpus._try(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    plain = util.gpu if util is not None else None
    try:
        metrics = gpm.metrics()
    except Exception as e:  # a GPM call that fails now: the plain figure, and why
        metrics, gpm.why = None, "GPM failed: %s" % e
    if metrics is None:
        return {"source": "utilization", "utilization": plain, "why": gpm.why}
    return dict(metrics, source="gpm", utilization=plain)


def look_gpu(nv, h, index, gpm, owner_uid):
    mem = nvml_gpus._try(lambda: nv.nvmlDeviceGetMemoryInfo(h))
    seen = nvml_gpus.look(nv, h, index, OnDemand(), owner_uid)
    named(seen["processes"])
    seen.update(memory_total=mem.total if mem else None, memory_used=mem.used if mem else None,
                activity=activity(nv, h, gpm), conditions=nvml_gpus.conditions(nv, h))
    return seen


def sample(nv, handles, gpms, owner_uid, seq):
    # in a job's step: Slurm's name of the node
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    return {"host": host, "seq": seq, "time": round(time.time(), 3),
            "gpus": [look_gpu(nv, h, i, gpms[i], owner_uid) for i, h in handles.items()]}


def looked_at(state):
    """NVML's indices of the GPUs to look at: inside a Slurm job's step (fleet top --job), the
    GPUs Slurm gave the job here; else every GPU."""
    every = [g["index"] for g in state["gpus"]]
    if not os.environ.get("SLURM_JOB_ID"):
        return every
    try:
        import fleet_agent_task as task
        import fleet_policy as policy
    except ImportError:  # as part of the installed package
        from . import task
        from .. import policy
    chosen = policy.job_gpu_indices(task.slurm_gpu_ids(os.environ),
                                    policy.NodeState.read(state).gpus)
    return every if chosen is None else list(chosen)


def _send(body):
    """One line to the reader; False when it has gone (its end of the pipe closed)."""
    try:
        sys.stdout.write(wire.frame("look", body))
        sys.stdout.flush()
        return True
    except (BrokenPipeError, OSError):
        return False


def _bounded(value, low, high, default):
    try:
        return min(max(float(value), low), high)
    except (TypeError, ValueError):
        return default


@dataclass(frozen=True)
class LookArgs:
    """The live look's arguments, read once and bounded: an interval and a lifetime out of bounds
    are brought within them, a count of samples that is not a whole number reads as none (until
    the lifetime ends)."""
    interval: float
    lifetime: float
    samples: Optional[int] = None

    @classmethod
    def read(cls, args):
        interval = _bounded(args.get("interval"), INTERVAL_BOUNDS[0], INTERVAL_BOUNDS[1], 1.0)
        samples = args.get("samples")
        return cls(interval, _bounded(args.get("lifetime"), interval, LIFETIME_MAX, LIFETIME_MAX),
                   samples if isinstance(samples, int) and not isinstance(samples, bool) else None)


def stream(nv, asked, state):
    interval, lifetime, samples = asked.interval, asked.lifetime, asked.samples
    owner_uid = state["owner_uid"]
    handles = {i: nv.nvmlDeviceGetHandleByIndex(i) for i in looked_at(state)}
    gpms = {i: Gpm(nv, h) for i, h in handles.items()}
    # The first sample's GPM window: a whole interval for a single sample (--once), else short, so
    # that the first screen comes within a moment of the command and the next ones each interval.
    first = interval if samples == 1 else min(interval, FIRST_WINDOW)
    parent, started, seq = os.getppid(), time.monotonic(), 0
    try:
        while True:
            time.sleep(max(0.0, started + first + seq * interval - time.monotonic()))
            body = sample(nv, handles, gpms, owner_uid, seq)
            if seq == 0:
                body["state"] = state
            if not _send(body) or os.getppid() != parent:  # the reader, or the session, has gone
                return
            seq += 1
            if (samples is not None and seq >= samples) or time.monotonic() - started >= lifetime:
                return
    finally:
        for g in gpms.values():
            g.free()


def main(args):
    state = node.probe(dict(args, environment_check=False))
    if not state["nvml"].get("available"):
        _send({"host": state["host"], "seq": 0, "time": round(time.time(), 3), "gpus": [],
               "state": state})
        return 0
    import pynvml as nv  # shipped with the agent; the probe found the library

    nv.nvmlInit()
    try:
        stream(nv, LookArgs.read(args), state)
    finally:
        nv.nvmlShutdown()
    return 0
