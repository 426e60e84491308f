"""A run that is done with a host lets go of its connection at once (``last_use``), so that a
probe of thousands of hosts does not hold thousands of idle connections to its end."""

from __future__ import annotations

import asyncio

from fleet.inventory import Host
from fleet.transport import Fanout, Result, Transport


class Recording(Transport):
    def __init__(self):
        self.events: list[tuple[str, str]] = []

    async def run(self, host, argv, **kw):
        self.events.append(("run", host.name))
        return Result(host.name, exit_status=0)

    async def release(self, host):
        self.events.append(("release", host.name))


def hosts(n: int) -> list[Host]:
    return [Host(f"h{i}", {"ansible_connection": "local"}, (), "(test)") for i in range(n)]


def run(last_use: bool) -> list[tuple[str, str]]:
    async def go():
        fan = Fanout(concurrency=1)
        fan._local = rec = Recording()
        await fan.run_all(hosts(3), ["true"], last_use=last_use)
        return rec.events

    return asyncio.run(go())


def test_last_use_releases_each_host_right_after_its_work():
    assert run(last_use=True) == [("run", "h0"), ("release", "h0"), ("run", "h1"), ("release", "h1"),
                                  ("run", "h2"), ("release", "h2")]


def test_without_last_use_connections_stay_for_the_next_step():
    assert run(last_use=False) == [("run", "h0"), ("run", "h1"), ("run", "h2")]
