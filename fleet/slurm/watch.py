"""Watching a submitted job until it ends (``fleet profile --partition``'s third step): one
batched status call per interval, with backoff; a stop request (Ctrl-C) passed on to Slurm; a job
that can never start cancelled; a silent slurmctld waited out, and said.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from .jobs import SlurmClient, SlurmctldSilent, SlurmError
from .jobstate import JobState
from .states import never_starts

POLL_FIRST = 0.5    # seconds; then each wait 1.5x longer, up to the poll interval
# status calls failing in a row before fleet gives up watching (the job goes on)
WATCH_FAILURES = 10
SILENT_POLL = 30    # seconds: the longest wait between asks while slurmctld does not answer
# a job that ran, back in line
REQUEUED = {"REQUEUED", "REQUEUE_FED", "REQUEUE_HOLD", "PENDING", "CONFIGURING"}


class NeverStarts(SlurmError):
    """The job pends for a reason Slurm never clears by itself: it was cancelled (or kept, with
    --keep-pending), and the run ends."""


async def watch(client: SlurmClient, job_id: str, *, poll: float = 5.0,
                stop: asyncio.Event | None = None,
                on_state: Callable[[JobState], None] = lambda s: None,
                submitted: float | None = None,
                keep_pending: bool = False, run_dir: str | None = None) -> JobState:
    """Until the job ends. A stop request (Ctrl-C) cancels a job that has not started, and sends
    SIGTERM to a running job's steps once: the profilers stop their applications and finish
    their reports, and the job ends. While slurmctld does not answer, the job's state is
    unknown: fleet keeps asking, less often, and says since when. A job pending for a reason
    Slurm never clears is cancelled (kept with ``keep_pending``): NeverStarts. The state
    returned carries ``requeues``, the times the job went back in line after it ran."""
    w, last = _Watching(job_id, POLL_FIRST), None
    while True:
        st = await w.ask(client, submitted)
        w.count_requeue(st.state)
        if (st.state, st.reason) != last:
            on_state(st)
            last = (st.state, st.reason)
        if st.terminal:
            st.requeues = w.requeues
            return st
        if st.state == "PENDING" and (why := never_starts(st.reason)):
            raise await _never_starts(client, job_id, st, why, keep_pending)
        if stop is not None and stop.is_set() and not w.stopping:
            await w.stop(client, st, run_dir, on_state)
        await w.wait(stop, poll)


@dataclass
class _Watching:
    """What :func:`watch` keeps from one status call to the next."""
    job_id: str
    interval: float                     # the wait before the next status call
    failures: int = 0                   # status calls failed in a row
    silent_since: float | None = None   # since when slurmctld does not answer
    ran: bool = False
    # a job that ran, seen COMPLETING: RUNNING again next means requeued between two asks
    completing: bool = False
    requeues: int = 0
    stopping: bool = False    # the job was asked to stop

    async def ask(self, client: SlurmClient, submitted: float | None) -> JobState:
        """The job's state: UNKNOWN, saying why, while slurmctld or the login node does not answer
        (the status call's SlurmError itself once WATCH_FAILURES calls in a row failed)."""
        try:
            st = (await client.states([self.job_id], {self.job_id: submitted} if submitted
                                      else None))[self.job_id]
            self.failures, self.silent_since = 0, None
        except SlurmctldSilent:
            self.silent_since = self.silent_since or time.time()
            st = JobState(self.job_id, "UNKNOWN", "slurmctld not answering since "
                          + time.strftime("%H:%M:%S", time.localtime(self.silent_since)))
        except SlurmError as e:  # the login node busy or unreachable for a moment: keep watching
            self.failures += 1
            if self.failures >= WATCH_FAILURES:
                raise
            st = JobState(self.job_id, "UNKNOWN", f"status call failed ({e}); asking again")
        return st

    def count_requeue(self, state: str) -> None:
        """A job that ran and is back in line, or RUNNING again after COMPLETING, was requeued."""
        if state == "RUNNING":
            self.requeues += self.completing
            self.ran, self.completing = True, False
        elif self.ran and state in REQUEUED:
            self.ran, self.completing, self.requeues = False, False, self.requeues + 1
        elif self.ran and state == "COMPLETING":
            self.completing = True

    async def stop(self, client: SlurmClient, st: JobState, run_dir: str | None,
                   on_state: Callable[[JobState], None]) -> None:
        """fleet's stop asked of Slurm: a pending job cancelled, a running one's steps sent
        SIGTERM."""
        try:  # a job that has not started has no profilers to stop: it goes from the queue
            await client.cancel([self.job_id], signal=None if st.state == "PENDING" else "TERM",
                                # fleet's stop recorded first
                                run_dirs=[run_dir] if run_dir else [])
            self.stopping = True
        except SlurmError as e:  # slurmctld silent: asked again at the next poll
            on_state(JobState(self.job_id, st.state,
                              f"could not stop the job yet ({e}); trying again"))
            await asyncio.sleep(self.interval)

    async def wait(self, stop: asyncio.Event | None, poll: float) -> None:
        """Until the next ask (sooner on a stop request), each wait longer, up to ``poll``."""
        try:
            await asyncio.wait_for(stop.wait() if stop is not None and not self.stopping
                                   else asyncio.sleep(self.interval), self.interval)
        except asyncio.TimeoutError:
            pass
        self.interval = min(self.interval * 1.5, max(poll, SILENT_POLL) if self.silent_since
                            else poll)


async def _never_starts(client: SlurmClient, job_id: str, st: JobState, why: str,
                        keep_pending: bool) -> NeverStarts:
    """A job that can never start, cancelled unless ``keep_pending``: the error ending the run."""
    if not keep_pending:
        await client.cancel([job_id])
    return NeverStarts(f"job {job_id} can never start: {st.reason} ({why}); "
                       + ("kept in the queue (--keep-pending)" if keep_pending else
                          "cancelled it (--keep-pending keeps such a job)"))
