"""fleet's exit statuses, one place for every command (documented in docs/user-guide.md).

When several apply, the highest number wins: a refusal says more than an
unreachable host, which says more than a command that exited non-zero.
"""

from .statuses import UNFINISHED, HostStatus, RunStatus

OK = 0              # every host did what was asked
FAILED = 1          # reached every host, but the command failed (non-zero exit, timeout) on some
USAGE = 2           # bad arguments or inventory; nothing was touched
UNREACHABLE = 3     # some hosts could not be reached (network, host key, auth); the others ran
DEGRADED = 4        # doctor: some way to profile works only with features given up
REFUSED = 5         # policy refused to run (e.g. ncu beside another tenant); nothing was started
PARTIAL = 6         # profile: some hosts brought reports home, others were refused or failed
REGRESSION = 7      # nightly report: some metric is called a Regression
# profile: the profiler gave the GPU's counters back to a newcomer mid-run (report kept)
YIELDED = 8
WORKLOAD_FAILED = 9  # profile: the workload exited non-zero or died by a signal (report kept)
# reports stats/compare: the run left nothing to read (refused, failed, none came home)
NO_REPORTS = 10
# nightly report: a recent slowdown that nothing fleet recorded explains (a person must look)
UNEXPLAINED = 11
# nightly confirm: the change did not hold when rerun, or the reruns could not tell
NOT_CONFIRMED = 12
# a second Ctrl-C left the run to finish on its own (128 + SIGINT, as shells say)
INTERRUPTED = 130


def fail(message: str, code: int = USAGE) -> None:
    """End a command with one line on stderr, ``fleet: message``, and ``code``."""
    import sys

    sys.stderr.write(f"fleet: {message}\n")
    sys.exit(code)


def of_error(e: BaseException) -> int:
    """The status for an error that ends a command: its own ``exit_status`` (a Slurm login node
    that cannot be reached is UNREACHABLE), else FAILED."""
    return getattr(e, "exit_status", FAILED)


def remote_status(result) -> int:
    """A host's status as ssh gives it: the command's own exit status, 128 + N for a command
    killed by signal N (the transports say it so); UNREACHABLE when the host was not reached,
    FAILED when no status came."""
    if not result.reached:
        return UNREACHABLE
    return result.exit_status if result.exit_status is not None else FAILED


def for_exec(results, *, maxrc: bool = False) -> int:
    """``fleet exec``: one host's own status, as ssh; for several, ``for_results``, or with
    ``maxrc`` (pdsh -S, clush --maxrc) the largest of their statuses."""
    if len(results) == 1 or maxrc and results:
        return max(remote_status(r) for r in results)
    return for_results(results)


def for_doctor(results, worst: str, *, strict: bool) -> int:
    """``fleet doctor``: its findings are reported, not failed on, once every node was examined;
    with ``strict``, the worst way to profile found (``worst``: the policy's "refused",
    "degraded" or "ok") is the status, unless a node could not be examined."""
    code = for_results(results)
    if not strict or code != OK:
        return code
    return {"refused": REFUSED, "degraded": DEGRADED}.get(worst, OK)


def for_host_keys(states) -> int:
    """``fleet hosts trust``: UNREACHABLE when a host's key could not be fetched, FAILED when one
    differs from the key recorded (never accepted), the higher of the two when both."""
    codes = {"error": UNREACHABLE, "changed": FAILED}
    return max((codes.get(s, OK) for s in states), default=OK)


def for_parts(failed) -> int:
    """A command over several parts (hosts to look at, files to copy, runs to push): FAILED when
    any part failed (``failed``: one bool a part), else OK; each failure is said on its own line."""
    return FAILED if any(failed) else OK


def for_nightly_report(*, unexplained: bool, regressions: bool) -> int:
    """``fleet nightly report``: an unexplained slowdown says more than a regression."""
    return UNEXPLAINED if unexplained else REGRESSION if regressions else OK


def for_confirm(*, failed: bool, held: bool) -> int:
    """``fleet nightly confirm``: FAILED when the reruns could not be run or the workload's
    checkout not restored; else whether the change held."""
    return FAILED if failed else OK if held else NOT_CONFIRMED


def for_results(results) -> int:
    """The status for a list of transport Results."""
    code = OK
    for r in results:
        if not r.reached:
            code = max(code, UNREACHABLE)
        elif not r.ok:
            code = max(code, FAILED)
    return code


# A host's (or rank's) status -> its exit status; any other is FAILED
# (docs/user-guide.md's table, held by a test).
FOR_HOST = {HostStatus.OK: OK, HostStatus.PLANNED: OK, HostStatus.REFUSED: REFUSED,
            HostStatus.UNREACHABLE: UNREACHABLE,
            HostStatus.YIELDED: YIELDED, HostStatus.WORKLOAD_FAILED: WORKLOAD_FAILED}


def for_hosts(statuses) -> int:
    """The exit status of a run that ended, from its hosts' statuses: OK when all are ok; PARTIAL
    when some are; REFUSED when every one was refused; else the highest of the others' (a failed
    workload, a newcomer, an unreachable host say more than a refusal beside them)."""
    codes = [FOR_HOST.get(str(s), FAILED) for s in statuses]
    done = [c for c in codes if c != OK]
    if not done:
        return OK
    if len(done) < len(codes):
        return PARTIAL
    if all(c == REFUSED for c in done):
        return REFUSED
    return max(c for c in done if c != REFUSED)


def for_run(manifest, *, waited: bool = True) -> int:
    """The status for a profiling run, from its manifest (a ``manifest.RunManifest``): lab
    servers, Slurm, ``gather``, nightly. ``waited``: the caller waited for the run to end;
    ``--no-wait`` did not, so a submitted run is then what was asked."""
    if manifest.status in UNFINISHED:
        return PARTIAL if waited else OK  # gather: the job has not ended yet
    # a cancelled job did not do its job, whatever its ranks did
    if manifest.status == RunStatus.CANCELLED:
        return FAILED
    if not manifest.hosts:  # a job that was never submitted, or left nothing at all
        return OK if manifest.status in (RunStatus.COMPLETE, RunStatus.DRY_RUN) else FAILED
    return for_hosts(h.status for h in manifest.hosts)
