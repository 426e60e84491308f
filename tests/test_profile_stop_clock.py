"""When nsys's own --duration stopped a run: the agent looks at its clock every 0.1 s or more, and
nsys may end the workload between two looks. Its --duration counts from its own start, after the
agent's, so an exit seen at or past the limit is its stop (exit 143), said as such; an exit before
the limit is the workload's own. A test suite on a loaded machine once saw the 143 of nsys's stop
called the workload's own end ("killed by SIGTERM") because no look fell between limit and exit."""

from __future__ import annotations

import signal

from fleet.agent import timelimit


class Plan:
    """The little of a plan that the stop's reading looks at: a 3 s limit (nsys's --duration=3)."""
    timeout = 3.0


class Exited:
    """A profiler seen to exit ``after`` seconds from the agent's start (None: not seen)."""

    def __init__(self, after):
        self.exited_at = None if after is None else 100.0 + after


def test_an_exit_at_the_limit_that_no_look_saw_coming_is_nsys_own_stop():
    assert timelimit.duration_was_up(Plan(), Exited(3.05), 100.0, False, True)
    assert timelimit.duration_was_up(Plan(), Exited(3.0), 100.0, False, True)


def test_the_stop_is_said_only_for_nsys_own_143_past_the_limit():
    class Proc:
        returncode = 128 + signal.SIGTERM
    up = timelimit.duration_was_up(Plan(), Exited(3.05), 100.0, False, True)
    assert "by nsys (--duration)" in timelimit.by_duration(Plan(), Proc(), up, _Unmarked())
    early = timelimit.duration_was_up(Plan(), Exited(2.9), 100.0, False, True)
    assert not early and timelimit.by_duration(Plan(), Proc(), early, _Unmarked()) is None


def test_a_limit_fleet_signals_itself_or_an_exit_not_seen_is_no_nsys_stop():
    assert not timelimit.duration_was_up(Plan(), Exited(3.05), 100.0, False, False)  # fleet's signal, not nsys
    assert not timelimit.duration_was_up(Plan(), Exited(None), 100.0, False, True)
    assert timelimit.duration_was_up(Plan(), Exited(None), 100.0, True, True)  # the loop saw it: kept


class _Unmarked:
    marked = False
