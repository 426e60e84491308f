"""A run's time limit on the node: when fleet's own stop is due, when nsys's --duration is up, and
whether it was nsys's --duration that ended the run.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`profiler`. Where nsys stops the
workload at the limit itself (fleet's --duration, which keeps the kernels a signal loses), fleet's
own signal is only a late backstop, while nsys writes its report.
"""

from __future__ import annotations

import signal

# nsys stopping the workload itself (--duration) then writes its report: stop it only this late
NSYS_BACKSTOP = 300.0


def time_up(plan, elapsed, by_nsys):
    """(fleet's time limit is up, nsys's own --duration is up). ``by_nsys``: nsys stops the
    workload at the limit itself, so fleet's signal waits NSYS_BACKSTOP seconds more; not after
    nsys's session was stopped, where its --duration may no longer count."""
    if not plan.timeout:
        return False, False
    return (elapsed >= plan.timeout + (NSYS_BACKSTOP if by_nsys else 0),
            by_nsys and elapsed >= plan.timeout)


def duration_was_up(plan, ran, started, duration_up, by_nsys):
    """Whether nsys's own --duration was up when the profiler ended: seen by the loop, or by the
    time the profiler's exit was seen. Its --duration counts from its own start, after ``started``,
    so an exit at or past the limit came no sooner than its stop, though no look at the clock fell
    between the limit and the exit (one look every 0.1 s or more)."""
    if duration_up or ran.exited_at is None:
        return duration_up
    return time_up(plan, ran.exited_at - started, by_nsys)[1]


def by_duration(plan, proc, duration_up, ranks_stop):
    """Why nsys's own --duration stopped the run (its --kill sigterm, not an end of the workload's
    own; under a launcher each rank's 143 made 0 by RanksStop), or None."""
    if duration_up and (proc.returncode == 128 + signal.SIGTERM or ranks_stop.marked
                        and proc.returncode == 0):
        return ("at its time limit of %gs, by nsys (--duration), its kernels "
                "until then kept" % plan.timeout)
    return None
