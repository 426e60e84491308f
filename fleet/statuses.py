"""fleet's one vocabulary of status, for both paths: what a host, a Slurm rank or a Ray worker did
(``HostStatus``), and what a whole run is (``RunStatus``). Both are spelled as the manifest, the
host and run lines and ``--json`` spell them (each is a ``str``); :mod:`fleet.exitcodes` maps both
to exit statuses, and the user guide's tables are held to them by a test. The agent's own words for
its result are read into a ``HostStatus`` in one place, :func:`fleet.outcome.of_result`."""

from __future__ import annotations

from enum import StrEnum


class HostStatus(StrEnum):
    """One host's or rank's outcome."""
    PLANNED = "planned"                  # --dry-run: what would run
    PENDING = "pending"                  # not yet run
    OK = "ok"                            # the job was done and nothing went wrong while it ran
    REFUSED = "refused"                  # the policy refused: nothing was started
    # counters given back to a newcomer mid-run; what was profiled kept
    YIELDED = "yielded"
    # the workload exited non-zero or died by a signal; report kept
    WORKLOAD_FAILED = "workload-failed"
    PROFILER_ERROR = "profiler-error"    # the profiler said it failed at something; report kept
    STOPPED = "stopped"                  # told to stop before the profiler started
    FAILED = "failed"                    # the agent failed, or a report did not come home
    UNREACHABLE = "unreachable"          # the node could not be reached, or went silent
    # a Slurm rank that left no result, a lab launcher's rank no report
    MISSING = "missing"


class RunStatus(StrEnum):
    """A whole run's status, from its hosts' (:func:`fleet.outcome.run_status`) or its job's
    state."""
    RUNNING = "running"                  # begun: its hosts or its job have not all ended
    SUBMITTED = "submitted"              # a Slurm job submitted, not yet waited for (--no-wait)
    COMPLETE = "complete"                # every host or rank ok
    PARTIAL = "partial"                  # some ok, some not
    YIELDED = "yielded"                  # every host yielded to a newcomer
    WORKLOAD_FAILED = "workload-failed"  # every host's workload failed
    FAILED = "failed"                    # none ok (or the job could not be submitted)
    CANCELLED = "cancelled"              # the Slurm job was cancelled, whatever its ranks did
    DRY_RUN = "dry-run"                  # --dry-run: nothing was run


UNFINISHED = (RunStatus.RUNNING, RunStatus.SUBMITTED)   # a run whose reports may still come
