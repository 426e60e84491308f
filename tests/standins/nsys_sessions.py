"""The stand-in nsys's named sessions: `profile --session-new=NAME` and `stop --session=NAME`, as
nsys 2025.3 answered on an H100 test machine (tests/fixtures/nsys-sessions-h100). The real nsys
keeps its sessions in a daemon of the user's; the stand-in keeps each as files of the user's."""
import os
import signal
import sys
import time

SESSIONS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "recorded", "nsys-sessions-h100")


class Session:
    """The run's named session (--session-new), known to `stop --session` and `sessions list` by
    files of this user's under its TMPDIR (the real nsys keeps them in a daemon it finds by TMPDIR:
    a `sessions list` without the run's TMPDIR listed none, docs/examples/h200-acceptance/9c3958b):
    NAME.pid while it runs, NAME.state its state as `sessions list` gives it, NAME.done once it
    stopped, holding what the stop prints."""

    def __init__(self, name):
        self.name, self.stopped = name, False
        if name:
            _write(session_file(name, ".pid"), str(os.getpid()))
            self.state("Collection")

    def state(self, state):
        """Collection while it collects, Generation while the stop writes the report, then Launched."""
        if self.name:
            _write(session_file(self.name, ".state"), "%s %s" % (time.time(), state))

    def done(self, said):
        _write(session_file(self.name, ".done"), said)
        self.state("Launched")

    def close(self):
        for ext in (".pid", ".state", ".done") if self.name else ():
            try:
                os.unlink(session_file(self.name, ext))
            except FileNotFoundError:
                pass
        if self.name:  # the stand-in's own bookkeeping goes with its last session
            try:
                os.rmdir(os.path.dirname(session_file(self.name, "")))
            except OSError:
                pass


def _write(path, text):
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def session_file(name, ext):
    folder = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".nsys-standin-sessions-%d" % os.getuid())
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, name.replace("/", "_") + ext)


def sessions_list():
    """`nsys sessions list`: its header and a row a session, in the widths nsys 2025.3 printed them
    (profile-stop/output.txt)."""
    print("%16s %12s %42s %6s %s" % ("ID", "TIME", "STATE", "LAUNCH", "NAME"))
    folder = os.path.dirname(session_file("x", ""))
    for entry in sorted(f for f in os.listdir(folder) if f.endswith(".state")):
        name = entry[: -len(".state")]
        try:
            since, state = open(os.path.join(folder, entry)).read().split()
            pid = int(open(session_file(name, ".pid")).read())
        except (OSError, ValueError):
            continue
        elapsed = int(time.time() - float(since))
        print("%16d %12s %42s %6d %s" % (pid, "%02d:%02d" % divmod(elapsed, 60), state, 1, name))
    return 0


def stop_session(args):
    """`nsys stop --session=NAME`, as nsys 2025.3 answered (tests/fixtures/nsys-sessions-h100)."""
    name = next((a.split("=", 1)[1] for a in args if a.startswith("--session=")), None)
    folder = os.path.dirname(session_file("x", ""))
    if not any(f.endswith(".pid") for f in os.listdir(folder)):  # no-session: nothing at all to stop
        sys.stdout.write(open(os.path.join(SESSIONS, "no-session", "output.txt")).read().split("\n")[0] + "\n")
        return int(open(os.path.join(SESSIONS, "no-session", "status.txt")).read().split()[0])
    if name is None or not os.path.exists(session_file(name, ".pid")):
        return 0  # launch-sample-refused: a name it did not have, beside another session: nothing said, exit 0
    os.kill(int(open(session_file(name, ".pid")).read()), signal.SIGUSR1)
    deadline = time.time() + 60
    while not os.path.exists(session_file(name, ".done")) and time.time() < deadline:
        time.sleep(0.05)
    if os.path.exists(session_file(name, ".done")):
        sys.stdout.write(open(session_file(name, ".done")).read())
    return 0
