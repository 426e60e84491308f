"""fleet's exit statuses, one place for every command (documented in docs/user-guide.md).

When several apply, the highest number wins: a refusal says more than an
unreachable host, which says more than a command that exited non-zero.
"""

OK = 0              # every host did what was asked
FAILED = 1          # reached every host, but the command failed (non-zero exit, timeout) on some
USAGE = 2           # bad arguments or inventory; nothing was touched
UNREACHABLE = 3     # some hosts could not be reached (network, host key, auth); the others ran
DEGRADED = 4        # doctor: some way to profile works only with features given up
REFUSED = 5         # policy refused to run (e.g. ncu beside another tenant); nothing was started
PARTIAL = 6         # profile: some hosts brought reports home, others were refused or failed
REGRESSION = 7      # nightly report: some metric is called a Regression
NO_REPORTS = 10     # reports stats/compare: the run left nothing to read (refused, failed, none came home)
INTERRUPTED = 130   # a second Ctrl-C left the run to finish on its own (128 + SIGINT, as shells say)


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
    killed by signal N; UNREACHABLE when the host was not reached, FAILED when no status came."""
    import signal

    if not result.reached:
        return UNREACHABLE
    if result.signal:
        try:
            return 128 + signal.Signals["SIG" + result.signal.removeprefix("SIG")].value
        except KeyError:
            return FAILED
    return result.exit_status if result.exit_status is not None else FAILED


def for_exec(results, *, maxrc: bool = False) -> int:
    """``fleet exec``: one host's own status, as ssh; for several, ``for_results``, or with
    ``maxrc`` (pdsh -S, clush --maxrc) the largest of their statuses."""
    if len(results) == 1 or maxrc and results:
        return max(remote_status(r) for r in results)
    return for_results(results)


def for_results(results) -> int:
    """The status for a list of transport Results."""
    code = OK
    for r in results:
        if not r.reached:
            code = max(code, UNREACHABLE)
        elif not r.ok:
            code = max(code, FAILED)
    return code


def for_run(manifest, *, waited: bool = True) -> int:
    """The status for a profiling run, from its manifest (a ``manifest.RunManifest``): lab
    servers, Slurm, ``gather``, nightly. ``waited``: the caller waited for the run to end;
    ``--no-wait`` did not, so a submitted run is then what was asked."""
    from .store.manifest import run_status

    if manifest.status in ("running", "submitted"):
        return PARTIAL if waited else OK  # gather: the job has not ended yet
    statuses = ["ok" if h.status == "planned" else h.status for h in manifest.hosts]
    status = manifest.status
    if status == "dry-run":  # what would happen: planned hosts count as done
        status = run_status(statuses) if statuses else "complete"
    if status == "complete":
        return OK
    if statuses and all(s == "refused" for s in statuses):
        return REFUSED
    if status == "partial":
        return PARTIAL
    return UNREACHABLE if "unreachable" in statuses else FAILED
