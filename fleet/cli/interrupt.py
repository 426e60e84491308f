"""Ctrl-C during a run, the same on lab servers and Slurm.

The first Ctrl-C (or SIGTERM) asks the run to stop: the profilers get SIGTERM, finish their
reports, and fleet waits to bring them home. A second one leaves at once (KeyboardInterrupt,
exit 130): the nodes or the job finish on their own and ``fleet gather RUN`` brings the
reports home later.
"""

from __future__ import annotations

import asyncio
import signal
import sys


def stop_on_signals(message: str) -> asyncio.Event:
    """An event set by the first SIGINT/SIGTERM (after ``message`` on stderr); the second raises
    KeyboardInterrupt. Call it inside the running event loop."""
    stop = asyncio.Event()

    def interrupted() -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        sys.stderr.write(f"fleet: {message}\n")
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted)
    return stop
