"""How a command reaches a node: one interface, an SSH and a local implementation.

A :class:`Fanout` lives for one run. It holds at most one connection per host
(reused for every operation of the run), bounds how many hosts are worked on at
once, and turns every failure into that host's own :class:`Result`: one host
failing never stops the others.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Iterable, Sequence

if TYPE_CHECKING:
    from ..inventory import Host
    from .settings import SSHSettings

__all__ = ["Result", "Transport", "Fanout", "DEFAULT_CONCURRENCY"]

DEFAULT_CONCURRENCY = 64  # as clush's default fanout


@dataclass
class Result:
    """What happened on one host.

    ``exit_status`` is the command's status when it ran to the end; ``error``
    says why it did not (unreachable, host key, timeout, ...), with
    ``error_kind`` a short stable word for scripts.
    """

    host: str
    exit_status: int | None = None
    stdout: bytes = b""
    stderr: bytes = b""
    error: str | None = None
    error_kind: str | None = None
    signal: str | None = None
    extra: dict = field(default_factory=dict)

    def killed_by(self, name: str) -> None:
        """The command died of signal ``name`` ("KILL" as SSH says it, "SIGKILL" as Python does):
        said the same on every transport, as a shell says it: SIGKILL, exit status 128 + 9."""
        import signal

        self.signal = "SIG" + name.removeprefix("SIG")
        number = signal.Signals.__members__.get(self.signal)
        self.exit_status = 128 + number.value if number is not None else None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_status == 0

    @property
    def reached(self) -> bool:
        return self.error_kind not in ("unreachable", "host-key-unknown", "host-key-changed", "auth", "connect-timeout")

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "exit_status": self.exit_status,
            "stdout": self.stdout.decode("utf-8", "surrogateescape"),
            "stderr": self.stderr.decode("utf-8", "surrogateescape"),
            "error": self.error,
            "error_kind": self.error_kind,
            "signal": self.signal,
            **self.extra,
        }


Sink = Callable[[str, bytes], None]  # ("stdout" | "stderr", chunk), as output arrives
TAIL = 1 << 20  # bytes of each stream a streamed Result keeps
# How long a stopped command gets after SIGTERM before it is killed (local) or its channel
# closed (ssh): profilers need this time to write their report.
TERM_GRACE = 10.0


class Transport:
    """Runs an argument vector on one host. Implementations: ssh, local.

    ``sink`` receives output as it arrives (the Result then keeps only the
    last ``TAIL`` bytes of each stream). When ``stop`` is set or ``timeout``
    passes, the command gets SIGTERM once; with a timeout it is killed
    ``grace`` seconds later, without one it is waited for (a profiler needs
    that time to write its report).
    """

    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None) -> Result:
        raise NotImplementedError

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None) -> None:
        """Copy a file from the host to this machine, appending from ``offset`` when it is
        not 0 (a resumed transfer); ``on_block`` sees every block written, in order (to hash
        while copying). Raises OSError on failure."""
        raise NotImplementedError

    async def release(self, host: "Host") -> None:
        """The run is done with this host: let go of what it holds open (its connection)."""

    async def close(self) -> None:
        pass


async def drive(read_out: Callable[[int], Awaitable[bytes]], read_err: Callable[[int], Awaitable[bytes]],
                wait: Awaitable, terminate: Callable[[], None], kill: Callable[[], None], *,
                timeout: float | None, grace: float, sink: Sink | None,
                stop: asyncio.Event | None) -> tuple[bytes, bytes, str | None]:
    """Pump a running command's output until it exits; stop it when asked or when time is up.

    Returns (stdout, stderr, why it was stopped or None). Shared by the transports
    so that they stop commands the same way.
    """
    bufs = {"stdout": bytearray(), "stderr": bytearray()}

    async def pump(name: str, read: Callable[[int], Awaitable[bytes]]) -> None:
        while chunk := await read(65536):
            bufs[name] += chunk
            if sink is not None:
                sink(name, chunk)
                del bufs[name][:-TAIL]

    pumps = asyncio.gather(pump("stdout", read_out), pump("stderr", read_err), wait)
    waiters = [asyncio.ensure_future(asyncio.sleep(timeout))] if timeout is not None else []
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop.wait()))
    why = None
    try:
        done, _ = await asyncio.wait([pumps, *waiters], return_when=asyncio.FIRST_COMPLETED)
        if pumps not in done:
            why = "stop requested" if stop is not None and stop.is_set() else f"timed out after {timeout:g} s"
            terminate()
            if timeout is None:
                await pumps
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(pumps), grace)
                except asyncio.TimeoutError:
                    kill()
                    await pumps
        else:
            pumps.result()
    finally:
        for w in waiters:
            w.cancel()
        if not pumps.done():
            pumps.cancel()
    return bytes(bufs["stdout"]), bytes(bufs["stderr"]), why


class Fanout:
    """The transports of one run, with bounded concurrency.

    Use as ``async with Fanout(settings) as fan: results = await fan.run_all(hosts, argv)``.
    """

    def __init__(self, settings: "SSHSettings | None" = None, concurrency: int = DEFAULT_CONCURRENCY):
        from .local import LocalTransport

        self._settings = settings
        self._ssh: Transport | None = None
        self._local = LocalTransport()
        self._limit = asyncio.Semaphore(max(1, concurrency))

    def transport_for(self, host: "Host") -> Transport:
        if host.connection == "local":
            return self._local
        if self._ssh is None:
            from .ssh import SSHSettings, SSHTransport  # asyncssh is imported only when needed

            self._ssh = SSHTransport(self._settings or SSHSettings())
        return self._ssh

    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None, limit: int | None = None) -> Result:
        """Run on one host, outside the bound (callers inside :meth:`each` use this). ``limit``:
        the bytes of each stream a command that is not streamed may send; past them it is
        stopped and its answer not believed (a node's answer is data, and bounded)."""
        try:
            if limit is not None and sink is None:
                return await self._bounded(host, argv, input, timeout, stop, limit)
            return await self.transport_for(host).run(host, argv, input=input, timeout=timeout, sink=sink,
                                                      stop=stop)
        except Exception as e:  # a bug or an unforeseen failure stays this host's problem
            return Result(host.name, error=f"{type(e).__name__}: {e}", error_kind="internal")

    async def _bounded(self, host: "Host", argv: Sequence[str], input: bytes | None, timeout: float | None,
                       stop: asyncio.Event | None, limit: int) -> Result:
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
            r = await self.transport_for(host).run(host, argv, input=input, timeout=timeout, sink=collect, stop=halt)
        finally:
            if relay is not None:
                relay.cancel()
        r.stdout, r.stderr = bytes(bufs["stdout"]), bytes(bufs["stderr"])
        if over:
            r.error, r.error_kind = (f"{host.name} sent more than {limit >> 20} MiB on {over[0]}: its answer is not "
                                     "believed, and the command was stopped"), "agent"
        return r

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None) -> None:
        await self.transport_for(host).fetch(host, remote, local, offset, on_block)

    async def run_all(self, hosts: Iterable["Host"], argv: Sequence[str], *, input: bytes | None = None,
                      timeout: float | None = None, on_result: Callable[[Result], None] | None = None,
                      last_use: bool = False) -> list[Result]:
        """Run ``argv`` on every host; results come back in the hosts' order."""
        return await self.each(hosts, lambda h: self.run(h, argv, input=input, timeout=timeout), on_result,
                               last_use=last_use)

    async def each(self, hosts: Iterable["Host"], work: Callable[["Host"], Awaitable[Result]],
                   on_result: Callable[[Result], None] | None = None, *, last_use: bool = False) -> list[Result]:
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
                    result = Result(host.name, error=f"{type(e).__name__}: {e}", error_kind="internal")
            if on_result:
                on_result(result)
            if last_use:
                try:
                    await self.transport_for(host).release(host)
                except Exception:  # closing a connection the run is done with must not fail the host
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
