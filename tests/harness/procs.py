"""Processes a test started, found and stopped by their pids: never by name or pattern, which
reaches every matching process on the machine, other people's included."""

from __future__ import annotations

import os
import pwd
import signal
import subprocess
from pathlib import Path

from tests.harness.sshd import STANDINS

# The other account on the test machine: its processes are a neighbour's, on a GPU fleet must not take.
TENANT_USER = "fleettenant"


def children(pid: int) -> list[int]:
    """The live children of ``pid``, read from /proc (each process's parent is in its stat)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # The command name in parentheses may hold spaces: the fields after its ')' are fixed.
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == pid:
            found.append(int(entry.name))
    return found


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``: its children, theirs, and so on."""
    found, frontier = [], [pid]
    while frontier:
        below = [c for p in frontier for c in children(p)]
        found += below
        frontier = below
    return found


def cmdline(pid: int) -> list[str]:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"))[:-1]
    except OSError:
        return []


def kill_recorded(pidfile: Path, argv: list[str], sig: int = signal.SIGKILL) -> bool:
    """Kill the process whose pid a test's workload wrote to ``pidfile`` (``echo $$ > FILE; exec
    ...``), only if it still runs ``argv``: a pid reused since by another process is left alone."""
    try:
        pid = int(pidfile.read_text().strip())
    except (OSError, ValueError):
        return False
    if cmdline(pid) != argv:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def spawn(user: str | None, argv: list[str]) -> subprocess.Popen:
    """A real long-lived process (the pid NVML will name), optionally under another account."""
    ids = {}
    if user:
        pw = pwd.getpwnam(user)
        ids = {"user": pw.pw_uid, "group": pw.pw_gid, "extra_groups": []}
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd="/", **ids)


def stop(procs):
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


def end_frozen(proc: subprocess.Popen, stopped: list[int]) -> None:
    """After a test that froze processes (SIGSTOP) under ``proc``: ``proc`` killed if it still
    runs, and each frozen pid let go and killed (only those this test stopped)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in stopped:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass


def local_env(extra: dict) -> dict:
    """This machine as a node: stand-in profilers on PATH."""
    return {"PATH": f"{STANDINS}:{os.environ['PATH']}", **extra}
