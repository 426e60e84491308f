"""What a plan gives nsys for a run: its flags (output, CPU sampling, GPU metrics, its session,
how its collection ends), what the run gives up, the owned sysctls to set, and the name of the
run's nsys session that a yield stops.

Pure and Python 3.8: shipped with the agent, for :mod:`fleet.plan`, which plans the rest of the
run; the policy's verdicts say what is allowed (:mod:`fleet.policy`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

try:  # as shipped by fleet, modules travel under flat names (fleet/agent/bundle.py)
    import fleet_policy as policy
    from fleet_request import ProfileRequest
    from fleet_userflags import option_values, without_overridden
    import fleet_wrapping_windows as windows
except ImportError:
    from . import policy
    from .request import ProfileRequest
    from .userflags import option_values, without_overridden
    from .wrapping import windows

DEGRADED = policy.DEGRADED
# nsys options under which its --duration no longer counts from the workload's start: fleet's
# --timeout is then the agent's signal at the time, not --duration.
DURATION_MOVED_BY = ("--delay", "--capture-range", "--kill")


@dataclass(frozen=True)
class NsysPart:
    """What fleet gives nsys for a run: its flags, what was given up, the owned sysctls to set, and
    the name of the run's nsys session (None: none)."""
    flags: tuple[str, ...]
    given_up: list[str]
    sysctls: dict[str, Any]
    session: str | None


def nsys_part(host: str, req: ProfileRequest, verdicts: dict, chosen: tuple[policy.Gpu, ...],
              output: str) -> NsysPart:
    sampling = verdicts["nsys-cpu-sampling"]
    flags = [f"--output={output}", *sampling.flags]
    # One nsys on the node itself, which `nsys stop` there reaches: not under a launcher (each
    # rank's nsys would need a session of its own) nor in a container. Those yield with SIGTERM, as
    # before. The session is every such run's: a yield stops it, and so does Ctrl-C's "leave the
    # workload running".
    reachable = req.launcher is None and req.docker_image is None
    if req.gpu_metrics:
        flags.append("--gpu-metrics-devices=" + ",".join(str(g.index) for g in chosen))
    if reachable:
        flags.append("--session-new=" + session_name(req.run_id, host))
    flags = without_overridden("nsys", flags + _nsys_end(req), req.profiler_args)
    return NsysPart(tuple(flags), _given_up(verdicts), dict(sampling.sysctls),
                    _session(req, flags, reachable))


def _given_up(verdicts: dict) -> list[str]:
    """What the nsys run gives up, by the policy's verdicts: CPU sampling, GPU activity."""
    base, sampling = verdicts["nsys-trace"], verdicts["nsys-cpu-sampling"]
    given_up = ([policy.sampling_given_up(sampling.reasons[0].split(":")[0])[1]]
                if sampling.status == DEGRADED else [])
    return given_up + (["GPU activity: " + base.reasons[0]] if base.status == DEGRADED else [])


def _nsys_end(req: ProfileRequest) -> list[str]:
    """How nsys's collection ends: a window's (fleet.wrapping.windows: the report written, the
    workload going on), or the timeout's own --duration, which keeps the kernels where SIGTERM or
    SIGINT to nsys or to the workload lost every one of them on an H200
    (tests/fixtures/tools-2025.3-h200). A Slurm rank's time bound with a window the workload opens
    is the agent's signal, not --duration."""
    if (flags := windows.nsys_flags(req)):
        return flags
    if req.timeout and not option_values("nsys", req.profiler_args, DURATION_MOVED_BY):
        return [f"--duration={-int(-req.timeout // 1)}"]
    return []


def _session(req: ProfileRequest, flags: list[str], reachable: bool) -> str | None:
    """The run's nsys session a yield stops: fleet's, or the one the user named with -X."""
    ours = [f.split("=", 1)[1] for f in flags if f.startswith("--session-new=")]
    theirs = [v for v in option_values("nsys", req.profiler_args, ("--session-new",)) if v
              and reachable]
    return (ours or theirs or [None])[0]


def session_name(run_id: str, host: str) -> str:
    """The run's nsys session on a host (``fleet-RUN-HOST``): a newcomer on a GPU whose metrics nsys
    samples is yielded to by ``nsys stop`` of it, which keeps the report's kernels and leaves the
    workload running (tests/fixtures/nsys-sessions-h100), where SIGTERM ended the workload and lost
    them. Unique on the node while the run is, and of letters, digits, '.', '_' and '-' only."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"fleet-{run_id}-{host}")[:120]
