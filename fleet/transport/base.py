"""What every transport shares: a host's :class:`Result`, the :class:`Transport` interface, and
:func:`drive`, which pumps a running command's output and stops it the same way on each.

Its own module so that the transports (``ssh``, ``local``) and the package's :class:`Fanout`,
which picks one, import it and never each other.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Awaitable, Callable, Sequence

# why drive ended a command whose caller asked it to stop: no error
STOP_REQUESTED = "stop requested"

if TYPE_CHECKING:
    from ..inventory import Host

__all__ = ["ABANDON_AFTER", "Result", "Sink", "TAIL", "TERM_GRACE", "Transport", "drive"]


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

    @classmethod
    def ended(cls, host: str, exit_status: int | None, stdout: bytes, stderr: bytes, *,
              signal_name: str | None, why: str | None) -> "Result":
        """A command that ended, as every transport says it: its status, or the signal it died of;
        and where ``drive`` had to stop it (``why``: its deadline), a timeout. A stop
        asked for is no error."""
        result = cls(host, exit_status=exit_status, stdout=stdout, stderr=stderr)
        if signal_name:
            result.killed_by(signal_name)
        if why and why != STOP_REQUESTED:
            result.error, result.error_kind = f"{why}; the command was stopped", "timeout"
        return result

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_status == 0

    @property
    def reached(self) -> bool:
        return self.error_kind not in ("unreachable", "host-key-unknown", "host-key-changed",
                                       "auth", "connect-timeout")

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
# How long a killed command's end is listened for. A node gone silent (no keepalives to say so)
# never answers the channel's close: past this the command is abandoned, never awaited.
ABANDON_AFTER = 1.0


class StopRequest(asyncio.Event):
    """A stop asked of running commands (Ctrl-C): set once, and the signal they then get, by name:
    TERM, they end; USR1, fleet's agent stops the profiler's collection and leaves the workload
    running (fleet.cli.interrupt asks which)."""
    signal = "TERM"


def stop_signal(stop: asyncio.Event | None) -> str:
    """The signal that ends a command: its stop request's once that is set,
    else TERM (a timeout)."""
    return getattr(stop, "signal", "TERM") if stop is not None and stop.is_set() else "TERM"


async def feed_later(write: Callable[[bytes], object], end: Callable[[], object],
                     later: asyncio.Future[bytes | None],
                     gone: tuple[type[BaseException], ...]) -> None:
    """The command's stdin ``later``'s bytes once they come, then its end (also when cancelled: the
    command ended first, or its call was). A command already gone (``gone``) is told nothing."""
    try:
        data = await asyncio.shield(later)  # cancelled, this leaves ``later`` to its owner
        if data:
            write(data)
    except gone:
        return
    finally:
        try:
            end()
        except gone:
            pass


class Transport:
    """Runs an argument vector on one host. Implementations: ssh, local.

    ``sink`` receives output as it arrives (the Result then keeps only the
    last ``TAIL`` bytes of each stream). When ``stop`` is set or ``timeout``
    passes, the command gets SIGTERM once; with a timeout it is killed
    ``grace`` seconds later (0: the timeout bounds it all), without one it is
    waited for (a profiler needs that time to write its report). A killed
    command whose end is not heard within ``ABANDON_AFTER`` is abandoned. ``later``: stdin does
    not end after ``input``; what the future gives follows it, then stdin ends (an agent started
    ahead of its arguments).
    """

    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None, grace: float = TERM_GRACE,
                  later: asyncio.Future[bytes | None] | None = None) -> Result:
        raise NotImplementedError

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None,
                    size: int | None = None) -> str:
        """Copy a file from the host to this machine, appending from ``offset`` when it is
        not 0 (a resumed transfer); ``on_block`` sees every block written, in order (to hash
        while copying). ``size``: what the node's result says the file holds, where known.
        Returns the way the bytes came (for the tests and benchmarks). Raises OSError on failure."""
        raise NotImplementedError

    async def release(self, host: "Host") -> None:
        """The run is done with this host: let go of what it holds open (its connection)."""

    async def close(self) -> None:
        pass


async def _ended(pumps: asyncio.Future, within: float) -> bool:
    """Whether the command's output and status are all in within ``within`` seconds."""
    try:
        await asyncio.wait_for(asyncio.shield(pumps), within)
        return True
    except asyncio.TimeoutError:
        return False


async def _time_up(timeout: float, timeout_from: asyncio.Future | None) -> None:
    if timeout_from is not None:
        await asyncio.wait([timeout_from])  # its outcome is the feeder's; only its end counts here
    await asyncio.sleep(timeout)


async def drive(read_out: Callable[[int], Awaitable[bytes]],
                read_err: Callable[[int], Awaitable[bytes]],
                wait: Awaitable, terminate: Callable[[], None], kill: Callable[[], None], *,
                timeout: float | None, grace: float, sink: Sink | None,
                stop: asyncio.Event | None, timeout_from: asyncio.Future | None = None
                ) -> tuple[bytes, bytes, str | None, bool]:
    """Pump a running command's output until it exits; stop it when asked or when time is up.

    Returns (stdout, stderr, why it was stopped or None, whether it was abandoned: killed, and
    its end not heard within ``ABANDON_AFTER``, as from a node gone silent). With a ``timeout``
    nothing here waits past ``timeout + grace + ABANDON_AFTER`` (counted from when
    ``timeout_from`` is done, where given: a command told what to do later). Shared by the
    transports so that they stop commands the same way.
    """
    bufs = {"stdout": bytearray(), "stderr": bytearray()}

    async def pump(name: str, read: Callable[[int], Awaitable[bytes]]) -> None:
        while chunk := await read(65536):
            bufs[name] += chunk
            if sink is not None:
                sink(name, chunk)
                del bufs[name][:-TAIL]

    pumps = asyncio.gather(pump("stdout", read_out), pump("stderr", read_err), wait)
    waiters = [asyncio.ensure_future(_time_up(timeout, timeout_from))] if timeout is not None \
        else []
    if stop is not None:
        waiters.append(asyncio.ensure_future(stop.wait()))
    why, abandoned = None, False
    try:
        done, _ = await asyncio.wait([pumps, *waiters], return_when=asyncio.FIRST_COMPLETED)
        if pumps not in done:
            why = (STOP_REQUESTED if stop is not None
                   and stop.is_set() else f"timed out after {timeout:g} s")
            terminate()
            # the profiler's time to write its report; keepalives bound a dead link
            if timeout is None:
                await pumps
            elif not await _ended(pumps, grace):
                kill()
                abandoned = not await _ended(pumps, ABANDON_AFTER)
        else:
            pumps.result()
    finally:
        for w in waiters:
            w.cancel()
        if not pumps.done():
            pumps.cancel()
    return bytes(bufs["stdout"]), bytes(bufs["stderr"]), why, abandoned
