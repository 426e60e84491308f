"""The machine fleet runs on, reached through asyncio subprocesses.

Used for the embedded default (no inventory), for Slurm prolog/epilog entry
points, and for hosts with ``ansible_connection: local``. It gives the same
:class:`Result` as SSH, so callers never care which one ran.
"""

from __future__ import annotations

import asyncio
import os
import signal
from typing import TYPE_CHECKING, Sequence

from . import Result, Transport

if TYPE_CHECKING:
    from ..inventory import Host

# How long a command gets to stop after SIGTERM before SIGKILL: profilers need
# this time to write their report (nsys finishes its report on SIGTERM).
TERM_GRACE = 10.0


class LocalTransport(Transport):
    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None) -> Result:
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                start_new_session=True)  # its own process group, so a stop reaches its children too
        except OSError as e:
            return Result(host.name, exit_status=127, stderr=f"{argv[0]}: {e.strerror}\n".encode(),
                          error=f"cannot start {argv[0]}: {e.strerror}", error_kind="exec")
        try:
            out, err = await asyncio.wait_for(proc.communicate(input), timeout)
        except asyncio.TimeoutError:
            out, err = await _stop(proc)
            return Result(host.name, exit_status=proc.returncode, stdout=out, stderr=err,
                          error=f"timed out after {timeout:g} s; the command was stopped", error_kind="timeout")
        except asyncio.CancelledError:
            await asyncio.shield(_stop(proc))
            raise
        status = proc.returncode
        if status is not None and status < 0:  # killed by a signal, as a shell would say it
            return Result(host.name, exit_status=128 - status, stdout=out, stderr=err,
                          signal=signal.Signals(-status).name)
        return Result(host.name, exit_status=status, stdout=out, stderr=err)


async def _stop(proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
    """SIGTERM the process group, then SIGKILL after a grace period; collect output."""
    for sig, wait in ((signal.SIGTERM, TERM_GRACE), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            return await asyncio.wait_for(proc.communicate(), wait)
        except asyncio.TimeoutError:
            continue
    return await proc.communicate()
