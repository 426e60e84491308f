"""``fleet top`` on lab servers: a live look at every GPU of the hosts named, who is on each, how
hard it works, and whether fleet would let ncu run there now (judged in fleet/look.py).

One agent session per host, opened once (fleet/agent/look.py): it samples in place and sends a
framed line per sample over the SSH session, so a refresh costs no new connection. Each line is a
node's answer, held to its shape (``wire``) before anything reads it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

from ..agent import wire
from ..agent.bundle import bundle
from ..agentcall import agent_argv, agent_args
from ..look import CLOSE_GRACE, START_BOUND, HostView, Lines, take

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout


def _take(view: HostView, text: str, on_view: Callable[[HostView], None]) -> None:
    for body in wire.answers(text, "look"):
        take(view, body, on_view)


def _ended(view: HostView, r, stopped: bool) -> None:
    """Why a host's look ended, when it was not the look's own end."""
    if view.error or stopped:
        return
    if r.error and not r.reached:
        view.error = r.error
    elif view.seq is None:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        view.error = r.error or (f"the agent ended before its first sample: {err[-1]}" if err else
                                 "the agent ended before its first sample "
                                 f"(exit status {r.exit_status})")


async def look_host(fan: "Fanout", host: "Host", *, interval: float, samples: int | None,
                    lifetime: float,
                    on_view: Callable[[HostView], None], stop: asyncio.Event) -> HostView:
    """One host's look, until ``samples`` came, ``lifetime`` passed or ``stop`` is set."""
    view = HostView(host.name)
    lines = Lines(lambda text: _take(view, text, on_view))
    args = dict(agent_args(host, environment_check=False, versions=()), mode="look",
                interval=interval, lifetime=lifetime, samples=samples)
    halt = asyncio.Event()  # the look's stop, or this host's answer no longer believed
    relay = asyncio.ensure_future(stop.wait())
    relay.add_done_callback(lambda _: halt.set())

    def feed(stream: str, chunk: bytes) -> None:
        lines.feed(stream, chunk)
        # an overlong line or a malformed sample: its session ends here
        if lines.error or view.error:
            halt.set()

    try:
        r = await fan.run(host, agent_argv(host, args), input=bundle(), sink=feed, stop=halt,
                          timeout=lifetime + START_BOUND, grace=CLOSE_GRACE)
    finally:
        relay.cancel()
    if lines.error:
        view.error = f"{host.name} {lines.error}"
    _ended(view, r, stop.is_set())
    if view.error or view.seq is None:  # its samples were each shown as they came
        on_view(view)
    return view


async def look(fan: "Fanout", hosts: list["Host"], *, interval: float = 1.0,
               samples: int | None = None,
               lifetime: float = 8 * 3600.0, on_view: Callable[[HostView], None] = lambda v: None,
               stop: asyncio.Event | None = None) -> list[HostView]:
    """Every host's look side by side, each in its own session for the whole look (not bounded by
    the fan-out: a look holds its session open)."""
    stop = stop or asyncio.Event()
    return list(await asyncio.gather(*(look_host(fan, h, interval=interval, samples=samples,
                                                 lifetime=lifetime,
                                                 on_view=on_view, stop=stop) for h in hosts)))

