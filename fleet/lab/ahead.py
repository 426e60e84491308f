"""A lab run's agents started ahead of their plans: each node's agent is started while the node is
probed, loads its modules, and waits; it runs only what it is sent once fleet has planned every
host and saved the run (so that `fleet gather` can always finish what a node ran).

The node's interpreter and the agent's imports are most of what the run's second call cost before
its profiler started (0.2 s on an H100 test machine): started ahead, they overlap the probe and the
plan. A host that is refused, unreachable or left out by --count is sent nothing as soon as the
plans are made: its agent ends at once, having done nothing (fleet/agent/bundle.py:
BOOTSTRAP_AHEAD). What an agent prints before it is sent its plan is held, and shown only once it
is: a host that runs nothing says nothing.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Callable

from .. import agentcall
from ..transport import Result
from .sink import LINE_LIMIT, LineSink

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout

# Hosts whose agents start ahead, at most, and only where the pool runs them all at once: each is a
# second session beside its probe's, outside the pool's bound, and waits for its plan only a while
# (bundle.AHEAD_WAIT); a larger run, or a smaller pool, starts its agents after the plan, as before.
AHEAD_MOST = 32
# Seconds the agents sent nothing get to end on their own before their calls are cancelled.
RELEASE_WAIT = 10.0


class Ahead:
    """One host's agent, started: its call, what it is sent later, and its output until then."""

    def __init__(self, later: "asyncio.Future[bytes | None]", sink: LineSink):
        self.later, self.sink = later, sink
        self.call: asyncio.Future[Result]  # its run: set as it starts (start)
        self.held: list[tuple[str, bytes]] = []  # output before the plan, at most LINE_LIMIT
        self.held_bytes = 0

    def output(self, stream: str, chunk: bytes) -> None:
        """The agent's output as it comes: to the sink once it is sent its plan, else held."""
        if self.sent:
            self.sink(stream, chunk)
        elif self.held_bytes < LINE_LIMIT:
            self.held.append((stream, chunk[:LINE_LIMIT - self.held_bytes]))
            self.held_bytes += len(self.held[-1][1])

    def send(self, args: dict) -> "asyncio.Future[Result]":
        """The agent's arguments sent (its stdin then ends), what it printed so far shown; its call,
        to await."""
        self.later.set_result(agentcall.arguments(args))
        for stream, chunk in self.held:
            self.sink(stream, chunk)
        self.held.clear()
        return self.call

    @property
    def waiting(self) -> bool:
        """Started, still running, and sent nothing yet: it may be sent its plan."""
        return not self.later.done() and not self.call.done()

    @property
    def sent(self) -> bool:
        return self.later.done() and self.later.result() is not None


def start(fan: "Fanout", hosts: list["Host"], *, write: Callable[[str, str], None],
          stop: asyncio.Event | None, bound: float | None) -> dict[str, Ahead]:
    """Each host's agent in "profile" mode, started now, waiting for its plan; none where the run
    has more hosts than AHEAD_MOST or than the pool runs at once. ``bound``: the run's own
    (--timeout and --finish-timeout), counted from when its plan is sent."""
    if len(hosts) > min(AHEAD_MOST, fan.concurrency):
        return {}
    loop = asyncio.get_running_loop()
    started = {}
    for host in hosts:
        later: asyncio.Future[bytes | None] = loop.create_future()
        argv, stdin = agentcall.agent_call_ahead(host, "profile")
        agent = started[host.name] = Ahead(later, LineSink(host.name, False, write))
        # the run's bound counts from when the plan is sent (Transport.run's ``later``)
        agent.call = asyncio.ensure_future(fan.run(host, argv, input=stdin, later=later,
                                                   sink=agent.output, stop=stop, timeout=bound,
                                                   grace=0))
    return started


def tell_none(started: dict[str, Ahead], but: set[str] = frozenset()) -> None:
    """Every agent not sent its plan, but those named, told there is none: it ends at once."""
    for name, agent in started.items():
        if name not in but and not agent.later.done():
            agent.later.set_result(None)


async def release(started: dict[str, Ahead]) -> None:
    """Every agent not sent a plan is told there is none and waited for a moment; a call still going
    after RELEASE_WAIT is cancelled. Done on every way out of the run."""
    tell_none(started)
    waiting = [agent.call for agent in started.values() if not agent.sent]
    if waiting:
        _, late = await asyncio.wait(waiting, timeout=RELEASE_WAIT)
        abandon_calls(late)
        await asyncio.gather(*late, return_exceptions=True)


def abandon(started: dict[str, Ahead]) -> None:
    """The run cancelled (a second Ctrl-C): every agent not sent a plan told there is none, and its
    call cancelled without waiting."""
    tell_none(started)
    abandon_calls(agent.call for agent in started.values() if not agent.sent)


def abandon_calls(calls) -> None:
    for call in calls:
        call.cancel()
