"""What NVML says of each GPU and who is on it: the part of the node's document the neighbour
rules read.

Runs ON THE NODE (standard library plus pynvml, Python 3.8), for the probe, the last-moment
check and the Slurm prolog. Besides the process lists it records what still shows processes
the lists hide: the driver lists only the caller's PID namespace (seen on an H200 test machine:
from ``unshare --pid`` a tenant's process is not listed), but its memory in use
(``nvmlDeviceGetMemoryInfo`` v2 ``used``, which leaves out the driver's reservation) and the
process-utilization samples count every process. :func:`fleet.policy.unseen_tenants` compares
them. Each GPU is a dict of the document, read as ``policy.gpustate.Gpu``.
"""

from __future__ import annotations

import ctypes

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_procs as procfs
except ImportError:  # as part of the installed package
    from . import procs as procfs

ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing", 7: "Ampere",
                 8: "Ada", 9: "Hopper", 10: "Blackwell"}
COMPUTE_MODES = {0: "default", 1: "exclusive-thread", 2: "prohibited", 3: "exclusive-process"}
NO_ID = 0xFFFFFFFF  # gpuInstanceId/computeInstanceId of a process outside MIG


def gpus(procs, owner_uid) -> tuple[dict, list[dict]]:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")  # before paying for pynvml: is there a driver at all?
    except OSError as e:
        return {"available": False,
                "error": "libnvidia-ml.so.1 cannot be loaded (no NVIDIA driver?): %s" % e}, []
    import pynvml as nv  # shipped with the agent

    try:
        nv.nvmlInit()
    except nv.NVMLError as e:
        return {"available": False, "error": "nvmlInit failed: %s" % e}, []
    try:
        info: dict = {"available": True, "error": None,
                      "driver": _s(nv.nvmlSystemGetDriverVersion()),
                      "cuda_driver": _try(nv.nvmlSystemGetCudaDriverVersion),
                      "nvml_version": _try(lambda: _s(nv.nvmlSystemGetNVMLVersion()))}
        return info, [gpu(nv, i, procs, owner_uid) for i in range(nv.nvmlDeviceGetCount())]
    finally:
        nv.nvmlShutdown()


def _s(v):
    return v.decode() if isinstance(v, bytes) else v


def _try(fn, default=None):
    try:
        return fn()
    except Exception:
        return default


def gpu(nv, index, procs, owner_uid) -> dict:
    h = nv.nvmlDeviceGetHandleByIndex(index)
    arch = _try(lambda: nv.nvmlDeviceGetArchitecture(h))
    mig = _try(lambda: nv.nvmlDeviceGetMigMode(h), [None, None])
    mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h))
    by_processes = _try(lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2))
    util = _try(lambda: nv.nvmlDeviceGetUtilizationRates(h))
    mode = _try(lambda: nv.nvmlDeviceGetComputeMode(h))
    listed, list_error = gpu_processes(nv, h, procs, owner_uid)
    out: dict = {"index": index, "uuid": _s(nv.nvmlDeviceGetUUID(h)),
                 "name": _s(nv.nvmlDeviceGetName(h)),
                 # /dev/nvidiaN: how Slurm's gres names it
                 "minor": _try(lambda: nv.nvmlDeviceGetMinorNumber(h)),
                 "architecture": arch,
                 "architecture_name": ARCHITECTURES.get(arch, "arch %s" % arch),
                 "mig_mode": {"current": mig[0], "pending": mig[1]},
                 "compute_mode": COMPUTE_MODES.get(mode, mode),
                 "memory_total": mem.total if mem else None, "memory_used": mem.used if mem
                 else None,
                 # v2: what processes hold, every PID namespace's (v1's used
                 # also counts the reservation)
                 "memory_used_by_processes": by_processes.used if by_processes else None,
                 "memory_reserved": by_processes.reserved if by_processes else None,
                 "utilization": {"gpu": util.gpu, "memory": util.memory} if util else None,
                 "sampled_pids": sampled_pids(nv, h),
                 "mig_instances": mig_instances(nv, h) if mig[0] == 1 else [],
                 "processes": listed, "process_list_error": list_error}
    return out


def sampled_pids(nv, h):
    """The pids in the GPU's process-utilization samples (recent seconds): host pids, also of
    processes the lists hide. [] when there are none, None when the driver gives none."""
    try:
        return sorted(set(s.pid for s in nv.nvmlDeviceGetProcessUtilization(h, 0)))
    except nv.NVMLError_NotFound:
        return []
    except Exception:
        return None


def mig_instances(nv, h) -> list[dict]:
    out: list[dict] = []
    for i in range(_try(lambda: nv.nvmlDeviceGetMaxMigDeviceCount(h), 0)):
        m = _try(lambda: nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i))
        if m is None:
            continue
        mem = _try(lambda: nv.nvmlDeviceGetMemoryInfo(m))
        out.append({"uuid": _s(_try(lambda: nv.nvmlDeviceGetUUID(m))),
                    "name": _s(_try(lambda: nv.nvmlDeviceGetName(m))),
                    "gpu_instance": _try(lambda: nv.nvmlDeviceGetGpuInstanceId(m)),
                    "compute_instance": _try(lambda: nv.nvmlDeviceGetComputeInstanceId(m)),
                    "memory_total": mem.total if mem else None})
    return out


def gpu_processes(nv, h, procs, owner_uid) -> tuple[list[dict], str | None]:
    lists = (("compute", nv.nvmlDeviceGetComputeRunningProcesses),
             ("graphics", nv.nvmlDeviceGetGraphicsRunningProcesses),
             ("mps", nv.nvmlDeviceGetMPSComputeRunningProcesses))
    found, list_error = {}, None
    for kind, fn in lists:
        try:
            entries = fn(h)
        except nv.NVMLError as e:  # a list NVML will not give: whoever is on it cannot be seen
            if kind == "compute" or not isinstance(e, nv.NVMLError_NotSupported):
                list_error = "%s processes: %s" % (kind, e)
            continue
        for p in entries:
            entry = found.setdefault(p.pid, {"pid": p.pid, "kinds": [], "used_memory": None})
            entry["kinds"].append(kind)
            if p.usedGpuMemory is not None:
                entry["used_memory"] = max(entry["used_memory"] or 0, p.usedGpuMemory)
            for field, name in (("gpuInstanceId", "gpu_instance"),
                                ("computeInstanceId", "compute_instance")):
                value = getattr(p, field, None)
                entry[name] = None if value in (None, NO_ID) else value
    # The driver lists only processes of the caller's PID namespace, under that namespace's pids
    # (measured on an H200 test machine: inside `unshare --pid`, a CUDA child of pid 2 is listed
    # as 2): a listed pid names the process our /proc shows, whatever namespace we are in.
    for entry in found.values():
        comm_uid = procs.get(entry["pid"])
        if comm_uid is None:  # gone meanwhile, or not ours to see: cannot be vouched for
            entry.update(user=None, uid=None, name=None, foreign=True,
                         why="pid not visible from the agent")
        else:
            entry.update(user=procfs.user_name(comm_uid[1]), uid=comm_uid[1], name=comm_uid[0],
                         foreign=comm_uid[1] != owner_uid)
            if not entry["foreign"]:
                entry["slurm_job"] = slurm_job_of(entry["pid"])
    return sorted(found.values(), key=lambda e: e["pid"]), list_error


def slurm_job_of(pid):
    """The Slurm job an own process belongs to (its environment is readable to its owner)."""
    env = procfs.read("/proc/%d/environ" % pid) or ""
    for item in env.split("\0"):
        if item.startswith("SLURM_JOB_ID="):
            return item[len("SLURM_JOB_ID="):]
    return None


# --- what the run watch reads (fleet/agent/watch.py) ---

# Clock event reasons (nvml.h's nvmlClocksEventReason*, formerly ...ThrottleReason*): bit -> name.
CLOCK_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap",
                 0x8: "hw_slowdown",
                 0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                 0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}


def identity(nv, h, index):
    """The GPU a run's conditions are of: index, UUID, model and PCI bus id."""
    pci = _try(lambda: nv.nvmlDeviceGetPciInfo(h))
    return {"index": index, "uuid": _s(_try(lambda: nv.nvmlDeviceGetUUID(h))),
            "name": _s(_try(lambda: nv.nvmlDeviceGetName(h))), "pci_bus_id": _s(pci.busId) if pci
            else None}


def clock_reasons(nv, h):
    """The reasons the clocks are held where they are, by name; None where the driver gives none."""
    for name in ("nvmlDeviceGetCurrentClocksEventReasons",
                 "nvmlDeviceGetCurrentClocksThrottleReasons"):
        fn = getattr(nv, name, None)
        bits = _try(lambda: fn(h)) if fn else None
        if bits is not None:
            return [why for bit, why in sorted(CLOCK_REASONS.items()) if bits & bit] + (
                ["other (0x%x)" % (bits & ~0x1FF)] if bits & ~0x1FF else [])
    return None


def conditions(nv, h):
    """Clocks, their reasons, temperature and power now: each call that fails is left out."""
    out = {"sm_clock_mhz": _try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
           "mem_clock_mhz": _try(lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
           "throttle": clock_reasons(nv, h),
           "temperature_c": _try(lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))}
    milliwatts = _try(lambda: nv.nvmlDeviceGetPowerUsage(h))
    if milliwatts is not None:
        out["power_w"] = round(milliwatts / 1000.0, 1)
    return {k: v for k, v in out.items() if v is not None}


def look(nv, h, index, procs, owner_uid) -> dict:
    """Who is on one GPU now, in the shape ``gpu`` gives and the policy reads: its process lists,
    the memory processes hold and the utilization samples. The memory is read before and after
    the lists and the lesser kept, so a workload allocating meanwhile is not taken for memory
    nobody explains."""
    used = lambda: _try(lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used)
    before = used()
    listed, list_error = gpu_processes(nv, h, procs, owner_uid)
    after = used()
    by_processes = min(before, after) if before is not None and after is not None else None
    return {"index": index, "processes": listed, "process_list_error": list_error,
            "memory_used_by_processes": by_processes, "sampled_pids": sampled_pids(nv, h)}
