"""Under a launcher on a lab server (an nsys per rank), stopping the ranks without the launcher
taking the first rank's stop for a failure and cutting the others' reports short.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`profiler`.
"""

from __future__ import annotations

import os

# Run by the launcher in front of each rank's nsys: nsys's own exit status, except once the stop
# file is there, when 0. Open MPI's mpirun takes a rank's non-zero exit for a failed job and
# SIGTERMs, then SIGKILLs, the other ranks' process groups; nsys exits 143 when its rank dies of the
# stop's SIGTERM (tests/standins/nsys, nsys-app-exit3), so the first rank to stop would cut the
# others' reports short. A SIGTERM from the launcher still reaches nsys (the same process group); sh
# waits for it.
RANK_SCRIPT = ('stop=$1; shift; trap : TERM; "$@"; status=$?; if [ -e "$stop" ]; then exit 0; fi; '
               'exit $status')
STOP_FILE = "fleet-ranks-stop"


class RanksStop:
    """Under a launcher (nsys per rank), the stop file in the run's private TMPDIR: written
    (O_NOFOLLOW) before fleet stops the run, or as nsys's --duration comes up, so that no rank
    stopping makes the launcher abort the others. A rank that fails on its own before that still
    fails the run."""

    def __init__(self, plan, env):
        tmp = env.get("TMPDIR")
        self.path = (os.path.join(tmp, STOP_FILE)
                     if plan.command.launcher and plan.tool == "nsys" and tmp else None)
        self.plan, self.marked = plan, False
        if self.path:
            try:
                os.unlink(self.path)  # one left by an earlier agent of this run
            except FileNotFoundError:
                pass

    def argv(self):
        command = self.plan.command
        if not self.path:
            return command.argv()
        k = len(command.wrapper) + len(command.launcher)
        argv = command.argv()
        return (*argv[:k], "sh", "-c", RANK_SCRIPT, "fleet-rank", self.path, *argv[k:])

    def mark(self):
        if not self.path or self.marked:
            return
        try:
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                             0o600))
        except OSError:
            return  # no stop file: a rank's exit is then taken as it is, as before
        self.marked = True
