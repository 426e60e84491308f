"""The machine fleet runs on, reached through asyncio subprocesses.

Used for the embedded default (no inventory), for Slurm prolog/epilog entry
points, and for hosts with ``ansible_connection: local``. It gives the same
:class:`Result` as SSH, so callers never care which one ran.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Callable, Sequence

from .base import TERM_GRACE, Result, Sink, Transport, drive, feed_later, stop_signal

if TYPE_CHECKING:
    from ..inventory import Host


class LocalTransport(Transport):
    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None, grace: float = TERM_GRACE,
                  later: asyncio.Future[bytes | None] | None = None) -> Result:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if input is not None or later is not None
                else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # its own process group, so a stop reaches its children too
        except OSError as e:
            return Result(host.name, exit_status=127, stderr=f"{argv[0]}: {e.strerror}\n".encode(),
                          error=f"cannot start {argv[0]}: {e.strerror}", error_kind="exec")
        feeder = None
        if input is not None:
            proc.stdin.write(input)
        if later is not None:
            feeder = asyncio.ensure_future(feed_later(proc.stdin.write, proc.stdin.close, later,
                                                      (OSError,)))
        elif input is not None:
            proc.stdin.close()

        def signal_group(sig: int) -> None:
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                pass

        try:
            out, err, why, abandoned = await drive(proc.stdout.read, proc.stderr.read, proc.wait(),
                                        lambda: signal_group(getattr(signal, "SIG"
                                                                     + stop_signal(stop))),
                                        lambda: signal_group(signal.SIGKILL),
                                        timeout=timeout, grace=grace, sink=sink, stop=stop,
                                        timeout_from=later)
        # a second Ctrl-C: the first one's signal (USR1 leaves the workload running)
        except asyncio.CancelledError:
            signal_group(getattr(signal, "SIG" + stop_signal(stop)))
            raise
        finally:
            if feeder is not None:
                feeder.cancel()
        status = proc.returncode
        died_of = signal.Signals(-status).name if status is not None and status < 0 else None
        result = Result.ended(host.name, status, out, err, signal_name=died_of, why=why)
        # killed, and still not reaped (a process stuck in the kernel): left, not awaited
        if abandoned:
            result.error, result.error_kind = (f"{why}; the command did not end when "
                                               "killed: left running", "timeout")
        return result

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None,
                    size: int | None = None) -> str:
        """From ``offset`` on, appended, to resume; ``local`` made afresh (O_EXCL, 0600) or the copy
        resumed, never written through a link (``open_partial``)."""
        from ..agent.files import open_partial

        def copy() -> None:
            with open(remote, "rb") as src, open_partial(local, offset) as dst:
                src.seek(offset)
                while block := src.read(1 << 20):
                    dst.write(block)
                    if on_block is not None:
                        on_block(block)

        await asyncio.to_thread(copy)
        return "local"
