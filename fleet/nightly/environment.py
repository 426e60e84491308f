"""What each nightly point ran on, as fleet recorded it (never typed by a person): the environment a
change point is judged against (:mod:`.changes`).

Read from the run's manifest, per device (a GPU on a host, a rank): the GPU's model and UUID, the
driver, the profiler's and fleet's versions, the node, the SM clock while the GPU was busy, the
reasons its clocks were held down, who else was on it, and the workload's own version where the
playbook says how to get it. A manifest is data: each value is kept only where it has its type.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..visible import visible

if TYPE_CHECKING:
    from ..agent.messages import ProfileResult
    from ..store.manifest import HostEntry, RunManifest

# Clock event reasons that mean the GPU ran slower than it could (fleet/agent/gpus.py names them as
# nvml.h does); idle, sync boost, an application clock setting and the display clock do not.
# A power cap is left out: GPUs under a full load sit at it as a matter of course (a cap that moves
# the clocks shows as a change of the busy SM clock instead).
SLOWDOWNS = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
CLOCK_CHANGE = 0.05  # busy SM clocks this much apart (relative) are a change of the environment


@dataclass(frozen=True)
class Environment:
    gpu: str | None = None
    gpu_uuid: str | None = None
    driver: str | None = None
    tool_version: str | None = None
    fleet_version: str | None = None
    node: str | None = None
    sm_clock_mhz: float | None = None      # the median over the samples where the GPU was not idle
    throttled: tuple[str, ...] = ()        # slowdown reasons seen in any sample
    # tenants seen and profiler flags given up (the run's flags)
    tenants: tuple[str, ...] = ()
    workload_version: str | None = None

    def contaminated_by(self) -> list[str]:
        """Why a point with this environment is kept out of detection: what it shared or lost."""
        why = list(self.tenants)
        if self.throttled:
            why.append("clocks held down (" + ", ".join(self.throttled) + ")")
        return why


def device_of(h: "HostEntry") -> str:
    """The device a metric is tracked on: the GPU's model on the host, and the
    rank where there is one."""
    return f"{h.gpu or 'no GPU'} on {h.host}" + (f" rank {h.rank}" if h.rank is not None else "")


def _text(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _strings(value) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()




def _whom(user, pid) -> str:
    """'user pid N', a name from the node shown as a field (its control characters as escapes)."""
    return f"{visible(user) if isinstance(user, str) and user else 'another user'} pid {pid}"


def tenants_of(h: "HostEntry", user: str | None = None) -> tuple[str, ...]:
    """Who else was on the run's GPUs, as 'tenant: ...' words: the tenants the plan weighed, the
    other users' processes on its GPUs when the node was looked at, and those the run watch saw
    while it ran. A tracing plan weighs no tenant (nsys beside one is allowed), yet a neighbour
    still slows the workload: that night is no measure of the code. ``user``: the run's user where
    the result does not name it (a Slurm rank's): the manifest's."""
    found = [str(t) for t in _strings(h.tenants_seen)]
    found += [_whom(p.user, p.pid) for p in h.processes_seen if p.foreign is True
              and _is_pid(p.pid)]
    found += _others_watched(h.answer, user)
    return tuple(f"tenant: {t}" for t in dict.fromkeys(found))


def _is_pid(value) -> bool:
    return type(value) is int and value > 0  # not a bool, not 0 or below


def _others_watched(result: ProfileResult | None, user: str | None) -> list[str]:
    """Other users' processes among those the run watch's samples list, each as 'user pid N'. The
    watch marks as not its own whatever is not below the run's profiler: the user's other ranks of a
    Slurm step and its other processes too, which the policy excuses and which are no neighbour of
    another user; a process whose user is unknown, or a run whose user is,
    counts (unsure is shared)."""
    if result is None:
        return []
    runner = result.user if result.user is not None else user
    return [_whom(q.user, q.pid) for sample in result.samples for q in sample.processes
            if q.own is False and _is_pid(q.pid) and (runner is None or q.user != runner)]


def of_host(h: "HostEntry", m: "RunManifest") -> Environment:
    answer = h.answer
    busy = [s.conditions for s in answer.samples if s.busy] if answer is not None else []
    clocks = [c.sm_clock_mhz for c in busy if c.sm_clock_mhz is not None]
    throttled = sorted({why for c in busy for why in c.throttle or () if why in SLOWDOWNS})
    uuids = answer.gpu_uuids if answer is not None else ()
    return Environment(
        gpu=_text(h.gpu), gpu_uuid=",".join(uuids) or None, driver=_text(h.driver),
        tool_version=_text(h.tool_version), fleet_version=_text(m.fleet),
        node=_text(h.node) or _text(h.host),
        sm_clock_mhz=statistics.median(clocks) if clocks else None, throttled=tuple(throttled),
        tenants=tenants_of(h, _text(m.user)) + _strings(h.given_up),
        workload_version=_text(m.playbook_run.version))


def of_manifest(m: "RunManifest") -> dict[str, Environment]:
    """Each device's environment in run ``m``."""
    return {device_of(h): of_host(h, m) for h in m.hosts if isinstance(h.host, str)}


# What changed is named by these, in this order; the workload's version is the code, not the
# environment. The GPU's UUID is recorded but names no change: a lab host hands out whichever of its
# GPUs of one model is free, night by night, and a change of model, node or clock says what matters.
NAMED = (("gpu", "GPU"), ("node", "node"), ("driver", "driver"), ("tool_version", "profiler"),
         ("fleet_version", "fleet"))


def differences(before: Environment, after: Environment) -> list[str]:
    """What of the environment differs between two points, each as 'driver 580.95.05 -> 580.159.04';
    a value one side did not record is no difference (an older run may lack it)."""
    changed = [f"{label} {getattr(before, key)} -> {getattr(after, key)}" for key, label in NAMED
               if getattr(before, key) and getattr(after,
                                                   key) and getattr(before, key) != getattr(after,
                                                                                            key)]
    a, b = before.sm_clock_mhz, after.sm_clock_mhz
    if a and b and abs(b - a) / a >= CLOCK_CHANGE:
        changed.append(f"SM clock {a:.0f} -> {b:.0f} MHz")
    return changed


def run_facts(m: "RunManifest") -> dict:
    """What the nightly report shows of a run and judges it by, from its manifest, whichever store
    holds it: when it started, its hosts' names, GPUs, drivers and profiler versions (each joined
    when hosts differ), its straggler shares, and each device's environment."""
    def joined(key: str) -> str | None:
        return ", ".join(dict.fromkeys(str(getattr(h, key)) for h in m.hosts
                                       if getattr(h, key))) or None

    return {"started": m.started, "host": joined("host"), "gpu": joined("gpu"),
            "driver": joined("driver"), "tool_version": joined("tool_version"),
            "stragglers": m.playbook_run.stragglers,
            "environments": of_manifest(m)}
