"""The stand-in nsys's named sessions: `profile --session-new=NAME` and `stop --session=NAME`, as
nsys 2025.3 answered on an H100 test machine (tests/fixtures/nsys-sessions-h100). The real nsys
keeps its sessions in a daemon of the user's; the stand-in keeps each as files of the user's."""
import os
import signal
import sys
import time

SESSIONS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "recorded", "nsys-sessions-h100")


class Session:
    """The run's named session (--session-new), known to `stop --session` by a file of this user's
    (the real nsys keeps them in its daemon): NAME.pid while it runs, NAME.done once it stopped,
    holding what the stop prints."""

    def __init__(self, name):
        self.name, self.stopped = name, False
        if name:
            with open(session_file(name, ".pid.tmp"), "w") as f:
                f.write(str(os.getpid()))
            os.replace(session_file(name, ".pid.tmp"), session_file(name, ".pid"))

    def done(self, said):
        with open(session_file(self.name, ".done.tmp"), "w") as f:
            f.write(said)
        os.replace(session_file(self.name, ".done.tmp"), session_file(self.name, ".done"))

    def close(self):
        for ext in (".pid", ".done") if self.name else ():
            try:
                os.unlink(session_file(self.name, ext))
            except FileNotFoundError:
                pass


def session_file(name, ext):
    folder = f"/tmp/.nsys-standin-sessions-{os.getuid()}"
    os.makedirs(folder, mode=0o700, exist_ok=True)
    return os.path.join(folder, name.replace("/", "_") + ext)


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
