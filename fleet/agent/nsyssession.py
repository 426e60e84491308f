"""Yielding without ending the workload: ``nsys stop`` of the run's named nsys session.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`profiler`. A run whose nsys samples GPU
metrics is started in a session of its own (``--session-new``, fleet.nsyspart.session_name).
Yielding to a newcomer through it stops the collection alone; SIGTERM to nsys ended the workload
and lost every kernel not yet saved (tests/fixtures/tools-2025.3-h200, nsys-sigterm).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

# seconds `nsys stop` may take (2.9 s on an H100 test machine) before SIGTERM after all
SESSION_STOP_WAIT = 20.0
STATE_EVERY = 0.2  # seconds between looks at the session's state while the stop runs
LIST_WAIT = 2.0    # seconds one `nsys sessions list` may take (0.05 s on an H100 test machine)
# The states nsys 2025.3 gave a session once its collection had ended (`nsys sessions list`, on an
# H200 test machine during a stop: Collection, then Generation while the stop writes the report,
# then Launched; a session whose workload ended is Shutdown): the GPU metrics are no longer sampled.
COLLECTION_OVER = ("Generation", "Launched", "Shutdown")


class SessionStop:
    """``nsys stop --session=NAME``: nsys stops collecting, writes the report with what it had
    (kernels too), releases the GPU metrics, and the workload goes on; ``nsys profile`` then ends
    with it (tests/fixtures/nsys-sessions-h100: 2.9 s on an H100 test machine, with GPU metrics).
    Its output goes to an unnamed file in the run's private TMPDIR, relayed once it ended. Done
    only where it said ``Generated:``: nsys 2025.3 stopping a session it does not have exited 0
    and printed nothing while another session was listed.

    The stop returns only once it has written the report (5.5 s on an H200 test machine), but the
    collection ends at once: the session's state, read meanwhile from ``nsys sessions list`` (with
    the run's TMPDIR: nsys keeps its sessions by it), was Generation 0.16 s after the newcomer was
    seen (docs/examples/h200-acceptance/9c3958b/2-session-states-h200). ``collection_ended`` is when
    that was seen: the GPU is the newcomer's from then."""

    def __init__(self, nsys, session, env):
        self.nsys, self.name = nsys, session
        self.argv, self.env = [nsys, "stop", "--session=" + session], env
        self.proc = self.out = self.began = self.collection_ended = None
        self.looked, self.done = 0.0, False
        self.failure = "it did not start"

    @classmethod
    def of(cls, plan, env):
        return cls(plan.nsys, plan.session,
                   env) if plan.tool == "nsys" and plan.session and plan.nsys else None

    def start(self, now):
        self.began = now
        try:
            self.out = tempfile.TemporaryFile(dir=self.env.get("TMPDIR"))
            self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL,
                                         stdout=self.out,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            self.failure = "it could not be started: %s" % e

    def poll(self, now, relay):
        """None while it runs; True once nsys said it wrote the report; False where it failed, or
        ran past SESSION_STOP_WAIT (then killed)."""
        if self.proc is None:
            self.done = True
            return False
        if self.proc.poll() is None:
            self._look_at_state(now)
            if now - self.began < SESSION_STOP_WAIT:
                return None
            self.failure = "no answer in %gs" % SESSION_STOP_WAIT
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
            # gone, or stuck in the kernel: not waited on longer
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.out.seek(0)
        said = self.out.read(1 << 20)
        self.out.close()
        relay.write(sys.stdout.buffer, said)
        self.done = True
        code = self.proc.returncode
        if code == 0 and b"Generated:" in said:
            return True
        if code == 0:
            self.failure = "exit status 0 and no report written"
        elif code > 0:  # nsys's last line: "There are no active sessions.", say
            last = said.decode(errors="replace").strip().splitlines()[-1:]
            self.failure = "exit status %d: %s" % (code, last[0][:200] if last else "nothing said")
        return False

    def _look_at_state(self, now):
        """The session's state, every STATE_EVERY seconds until its collection is seen over."""
        if self.collection_ended is not None or now - self.looked < STATE_EVERY:
            return
        self.looked = now
        if session_state(self.nsys, self.name, self.env) in COLLECTION_OVER:
            self.collection_ended = now


def session_state(nsys, name, env):
    """The state ``nsys sessions list`` gives the session ``name`` (Collection, Generation, ...), or
    None (not listed, or nsys did not answer in LIST_WAIT seconds). Its rows end in the name: ID,
    TIME, STATE, LAUNCH, NAME."""
    try:
        listed = subprocess.run([nsys, "sessions", "list"], env=env, stdin=subprocess.DEVNULL,
                                capture_output=True,
                                timeout=LIST_WAIT).stdout.decode(errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return None
    rows = [line.split() for line in listed.splitlines()]
    return next((row[2] for row in rows if len(row) == 5 and row[4] == name), None)

