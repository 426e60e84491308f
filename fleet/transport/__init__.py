"""How a command reaches a node: one interface, an SSH and a local implementation.

A :class:`Fanout` lives for one run. It holds at most one connection per host
(reused for every operation of the run), bounds how many hosts are worked on at
once, and turns every failure into that host's own :class:`Result`: one host
failing never stops the others.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable, Sequence

from .base import TAIL, TERM_GRACE, Result, Sink, StopRequest, Transport, drive

if TYPE_CHECKING:
    from ..inventory import Host
    from .settings import SSHSettings

__all__ = ["Result", "Sink", "StopRequest", "TAIL", "TERM_GRACE", "Transport", "drive", "Fanout",
           "DEFAULT_CONCURRENCY", "over_pool"]

DEFAULT_CONCURRENCY = 64  # as clush's default fanout


class Fanout:
    """The transports of one run, with bounded concurrency.

    Use as ``async with Fanout(settings) as fan: results = await fan.run_all(hosts, argv)``.
    """

    def __init__(self, settings: "SSHSettings | None" = None,
                 concurrency: int = DEFAULT_CONCURRENCY):
        from .local import LocalTransport

        self._settings = settings
        self._ssh: Transport | None = None
        self._local = LocalTransport()
        self.concurrency = max(1, concurrency)
        self._limit = asyncio.Semaphore(self.concurrency)

    def transport_for(self, host: "Host") -> Transport:
        if host.connection == "local":
            return self._local
        if self._ssh is None:
            from .ssh import SSHSettings, SSHTransport  # asyncssh is imported only when needed

            self._ssh = SSHTransport(self._settings or SSHSettings())
        return self._ssh

    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None, limit: int | None = None,
                  grace: float = TERM_GRACE,
                  later: asyncio.Future[bytes | None] | None = None) -> Result:
        """Run on one host, outside the bound (callers inside :meth:`each` use this). ``limit``:
        the bytes of each stream a command that is not streamed may send; past them it is
        stopped and its answer not believed (a node's answer is data, and bounded). ``grace``:
        the seconds a timed-out command gets between SIGTERM and its kill (0: ``timeout`` bounds
        the whole round trip). ``later``: more of stdin once known (Transport.run)."""
        try:
            if limit is not None and sink is None:
                return await self._bounded(host, argv, input, timeout, stop, limit)
            return await self.transport_for(host).run(host, argv, input=input, timeout=timeout,
                                                      sink=sink, stop=stop, grace=grace,
                                                      later=later)
        except Exception as e:  # a bug or an unforeseen failure stays this host's problem
            return Result(host.name, error=f"{type(e).__name__}: {e}", error_kind="internal")

    async def _bounded(self, host: "Host", argv: Sequence[str], input: bytes | None,
                       timeout: float | None, stop: asyncio.Event | None, limit: int) -> Result:
        bufs = {"stdout": bytearray(), "stderr": bytearray()}
        over, halt = [], asyncio.Event()

        def collect(stream: str, chunk: bytes) -> None:
            if over:
                return
            bufs[stream] += chunk
            if len(bufs[stream]) > limit:
                over.append(stream)
                del bufs[stream][limit:]
                halt.set()

        relay = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if relay is not None:
            relay.add_done_callback(lambda _: halt.set())
        try:
            r = await self.transport_for(host).run(host, argv, input=input, timeout=timeout,
                                                   sink=collect, stop=halt)
        finally:
            if relay is not None:
                relay.cancel()
        r.stdout, r.stderr = bytes(bufs["stdout"]), bytes(bufs["stderr"])
        if over:
            r.error, r.error_kind = (f"{host.name} sent more than {limit >> 20} MiB on {over[0]}: "
                                     "its answer is not believed, and the "
                                     "command was stopped"), "agent"
        return r

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None,
                    size: int | None = None) -> str:
        return await self.transport_for(host).fetch(host, remote, local, offset, on_block, size)

    async def run_all(self, hosts: Iterable["Host"], argv: Sequence[str], *,
                      input: bytes | None = None,
                      timeout: float | None = None,
                      on_result: Callable[[Result], None] | None = None,
                      last_use: bool = False) -> list[Result]:
        """Run ``argv`` on every host; results come back in the hosts' order."""
        return await self.each(hosts, lambda h: self.run(h, argv, input=input, timeout=timeout),
                               on_result, last_use=last_use)

    async def each(self, hosts: Iterable["Host"], work: Callable[["Host"], Awaitable[Result]],
                   on_result: Callable[[Result], None] | None = None, *,
                   last_use: bool = False) -> list[Result]:
        """Run a coroutine per host (one step or several), at most ``concurrency`` at once.

        ``last_use``: the run needs these hosts no more, so each host's connection is closed as
        soon as its work is done. Kept to the end of the run, thousands of idle connections cost
        about 40 KB of client memory and a socket each.
        """

        async def one(host: "Host") -> Result:
            async with self._limit:
                try:
                    result = await work(host)
                except Exception as e:
                    result = Result(host.name, error=f"{type(e).__name__}: {e}",
                                    error_kind="internal")
            if on_result:
                on_result(result)
            if last_use:
                try:
                    await self.transport_for(host).release(host)
                # closing a connection the run is done with must not fail the host
                except Exception:
                    pass
            return result

        return list(await asyncio.gather(*(one(h) for h in hosts)))

    async def close(self) -> None:
        if self._ssh is not None:
            await self._ssh.close()

    async def __aenter__(self) -> "Fanout":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


def over_pool(settings: "SSHSettings", concurrency: int, work: Callable[[Fanout], Awaitable]):
    """What ``work(fan)`` returns, run to its end in an event loop of its own over a pool of
    connections opened and closed around it: each command's network work, the pool below the CLI."""
    async def go():
        async with Fanout(settings, concurrency=concurrency) as fan:
            return await work(fan)

    return asyncio.run(go())
