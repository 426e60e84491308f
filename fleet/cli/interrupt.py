"""Ctrl-C during a run, the same on lab servers and Slurm.

The first Ctrl-C (or SIGTERM) asks the run to stop: the profilers get SIGTERM, finish their
reports, and fleet waits to bring them home (on Slurm, a job that has not started yet is
cancelled). A second one leaves at once: the run's task is cancelled, so every connection and
every task beside it ends cleanly (no asyncio noise, no traceback), and :func:`run` raises
KeyboardInterrupt for the command to say so and exit 130. The nodes or the job finish on their
own and ``fleet gather RUN`` brings the reports home later.
"""

from __future__ import annotations

import asyncio
import signal
import sys


def stop_on_signals(message: str) -> asyncio.Event:
    """An event set by the first SIGINT/SIGTERM (after ``message`` on stderr); the second
    cancels the task that called this (the run's main task: see :func:`run`). Call it inside
    the running event loop."""
    stop = asyncio.Event()
    main = asyncio.current_task()

    def interrupted() -> None:
        if stop.is_set():
            if main is not None:
                main.cancel()
            return
        sys.stderr.write(f"fleet: {message}\n")
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted)
    return stop


def run(main):
    """``asyncio.run(main)``; KeyboardInterrupt when a second Ctrl-C cancelled it."""
    try:
        return asyncio.run(main)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
