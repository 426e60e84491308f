"""Ctrl-C during a run, the same on lab servers and Slurm.

The first Ctrl-C (or SIGTERM) asks the run to stop: the profilers get SIGTERM, finish their
reports, and fleet waits to bring them home (on Slurm, a job that has not started yet is
cancelled). A second one leaves at once: the run's task is cancelled, so every connection and
every task beside it ends cleanly (no asyncio noise, no traceback), and :func:`run` raises
KeyboardInterrupt for the command to say so and exit 130. The nodes or the job finish on their
own and ``fleet gather RUN`` brings the reports home later.

Where the run can leave its workloads running (nsys in a session of its own on lab servers) and
fleet is in a terminal, the first Ctrl-C asks first: leave the workload running, nsys alone
stopping its collection (its report kept), or end both. SIGTERM, and a Ctrl-C with no terminal
to ask on, end both, as before.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

from ..transport import StopRequest

QUESTION = ("fleet: Ctrl-C: leave the workload running, nsys stopping its collection and its "
            "report kept (l), or end both (e, Enter)? Ctrl-C again leaves the "
            "nodes to finish on their own: ")


def stop_on_signals(message: str, leave: str | None = None) -> StopRequest:
    """A stop request set by the first SIGINT/SIGTERM (after ``message`` on stderr); the second
    cancels the task that called this (the run's main task: see :func:`run`). ``leave``: what to
    say where the user chose, at a Ctrl-C in a terminal, to leave the workloads running (the
    request then asks for USR1: fleet's agent stops the collection alone). Call it inside the
    running event loop."""
    stop = StopRequest()
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    asking = []  # the terminal's fd while its answer is awaited

    def decided(sig: str, said: str) -> None:
        if asking:
            loop.remove_reader(asking.pop())
        stop.signal = sig
        sys.stderr.write(f"fleet: {said}\n")
        stop.set()

    def answered() -> None:
        try:
            answer = os.read(asking[0], 256).decode(errors="replace").strip().lower()
        except OSError:
            answer = ""
        decided("USR1", leave) if answer.startswith("l") else decided("TERM", message)

    def interrupted(sig: int) -> None:
        if asking and sig == signal.SIGTERM:  # no one to wait for: end both
            decided("TERM", message)
            return
        if stop.is_set() or asking:
            if main is not None:
                main.cancel()
            return
        if sig == signal.SIGINT and leave is not None and _terminal():
            try:
                loop.add_reader(sys.stdin.fileno(), answered)
            # no way to hear the answer: end both
            except (OSError, ValueError, NotImplementedError):
                decided("TERM", message)
                return
            asking.append(sys.stdin.fileno())
            sys.stderr.write(QUESTION)
            sys.stderr.flush()
            return
        decided("TERM", message)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupted, sig)
    return stop


def _terminal() -> bool:
    """Whether there is someone to ask: stdin and stderr both a terminal, fleet in its foreground
    (a fleet in the background that read it would be stopped, SIGTTIN)."""
    try:
        return (sys.stdin.isatty() and sys.stderr.isatty()
                and os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp())
    except (AttributeError, ValueError, OSError):
        return False


def run(main):
    """``asyncio.run(main)``; KeyboardInterrupt when a second Ctrl-C cancelled it."""
    try:
        return asyncio.run(main)
    except asyncio.CancelledError:
        raise KeyboardInterrupt from None
