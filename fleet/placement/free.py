"""``--gpu free``: where a run goes on lab servers, by its neighbours. On each host, a GPU nobody
else is on now, by the same rule that refuses ncu beside a tenant (``policy.free_gpus``); with
``--count N``, the N least busy free GPUs across the hosts, one a host, and the others left out.
Chosen from the states the run's own probe found, so the last-moment check on the node judges
the GPU again right before the profiler starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import policy


@dataclass
class FreeGpus:
    """What ``--gpu free [--count N]`` asked, and the hosts it left out of the run (host -> why)."""
    count: int | None = None
    left_out: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Choice:
    gpu: int | None          # the GPU chosen on the host; None: none (see ``refused``)
    why: str
    # True: the host is refused (no free GPU); False with no GPU: left out by --count
    refused: bool = False
    busy: tuple = ()         # the chosen GPU's policy.busyness, to rank hosts by


def _gib(n) -> str:
    return f"{(n or 0) / 2**30:.1f} GiB"


def _chosen_line(g: policy.Gpu, free_here: int) -> str:
    util = g.utilization.gpu if g.utilization is not None else None
    busy = f"{_gib(g.memory_used_by_processes)} in use" + (f", {util} % utilization"
                                                           if util is not None else "")
    return (f"GPU {g.index} chosen: nobody else is on it ({busy}; "
            f"{free_here} free GPU(s) on this host)")


def per_host(states: dict[str, policy.NodeState], request: policy.Request) -> dict[str, Choice]:
    """A free GPU on each host, the least busy; a host with none is refused, naming who is where."""
    out = {}
    for host, state in states.items():
        free = policy.free_gpus(state, request)
        if free:
            out[host] = Choice(free[0].index, _chosen_line(free[0], len(free)),
                               busy=policy.busyness(free[0]))
        else:
            taken = policy.not_free(state, request) or ["the node lists no GPU"]
            out[host] = Choice(None, "--gpu free: no free GPU here: " + "; ".join(taken),
                               refused=True)
    return out


def across(states: dict[str, policy.NodeState], request: policy.Request,
           count: int) -> dict[str, Choice]:
    """The ``count`` least busy free GPUs across the hosts, one a host; every host refused when
    fewer are free (the run asked for that many)."""
    each = per_host(states, request)
    best = {h: c for h, c in each.items() if not c.refused}
    ranked = sorted(best, key=lambda h: (best[h].busy, h))
    if len(ranked) < count:
        why = (f"--gpu free --count {count}: only {len(ranked)} host(s) have a free GPU now"
               + (f" ({', '.join(ranked)})" if ranked else ""))
        return {h: Choice(None, why, refused=True) for h in states}
    chosen = set(ranked[:count])
    return {h: best[h] if h in chosen else
            Choice(None, f"left out: {count} less busy free GPU(s) elsewhere" if h in best
                   else each[h].why)
            for h in states}
