"""A lab run's agents started ahead of their plans: each node's agent is started while the node is
probed, loads its modules, and waits; it runs only what it is sent once fleet has planned every
host and saved the run (so that `fleet gather` can always finish what a node ran).

The node's interpreter and the agent's imports are most of what the run's second round trip
cost before its profiler started (0.2 s on an H100 test machine): started ahead, they overlap the
probe and the plan. A host that is refused, unreachable or left out by --count is sent nothing:
its agent ends at once, having done nothing (fleet/agent/bundle.py: BOOTSTRAP_AHEAD).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from .. import agentcall
from ..transport import Result
from .sink import LineSink

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout

# Hosts whose agents start ahead, at most: each is a second session beside its probe's, outside
# the pool's bound, so a larger run starts its agents after the plan, within the bound, as before.
AHEAD_MOST = 32
# Seconds the agents sent nothing get to end on their own before their calls are cancelled.
RELEASE_WAIT = 10.0


@dataclass
class Ahead:
    """One host's agent, started: its call, what it is sent later, and its output's sink."""
    call: "asyncio.Future[Result]"
    later: "asyncio.Future[bytes | None]"
    sink: LineSink

    def send(self, args: dict) -> "asyncio.Future[Result]":
        """The agent's arguments sent (its stdin then ends); its call, to await (already ended
        where the agent did not wait for them)."""
        if not self.later.done():
            self.later.set_result(agentcall.arguments(args))
        return self.call

    @property
    def sent(self) -> bool:
        return (self.later.done() and not self.later.cancelled()
                and self.later.result() is not None)


def start(fan: "Fanout", hosts: list["Host"], *, write: Callable[[str, str], None],
          stop: asyncio.Event | None, bound: float | None) -> dict[str, Ahead]:
    """Each host's agent in "profile" mode, started now, waiting for its plan; none where the run
    has more than AHEAD_MOST hosts. ``bound``: the run's own (--timeout and --finish-timeout),
    counted from when its plan is sent."""
    if len(hosts) > AHEAD_MOST:
        return {}
    loop = asyncio.get_running_loop()
    started = {}
    for host in hosts:
        later: asyncio.Future[bytes | None] = loop.create_future()
        sink = LineSink(host.name, False, write)
        argv, stdin = agentcall.agent_call_ahead(host, "profile")
        # the run's bound counts from when the plan is sent (Transport.run's ``later``)
        call = asyncio.ensure_future(fan.run(host, argv, input=stdin, later=later, sink=sink,
                                             stop=stop, timeout=bound, grace=0))
        started[host.name] = Ahead(call, later, sink)
    return started


async def release(started: dict[str, Ahead]) -> None:
    """Every agent not sent a plan is told there is none (its stdin ends) and waited for a moment;
    a call still going after RELEASE_WAIT is cancelled. Done on every way out of the run."""
    waiting = []
    for ahead in started.values():
        if not ahead.later.done():
            ahead.later.set_result(None)
        if not ahead.sent:
            waiting.append(ahead.call)
    if not waiting:
        return
    _, late = await asyncio.wait(waiting, timeout=RELEASE_WAIT)
    for call in late:
        call.cancel()
    await asyncio.gather(*late, return_exceptions=True)
