"""The node's processes as /proc shows them, and the few files the agent reads there.

Runs ON THE NODE (standard library, Python 3.8). The bottom of the agent's probe: the node's
document (:mod:`node`) and the GPUs' processes (:mod:`gpus`) both read processes through it.
"""

from __future__ import annotations

import glob
import os
import pwd
import signal
import time

PID_NS_INIT = 0xEFFFFFFC  # inode of the initial pid namespace (PROC_PID_INIT_INO)
# seconds between looks at the processes a profiler started, killed with it if it comes to that
LOOK_EVERY = 0.5


def read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return default


def user_name(uid):
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def processes():
    """pid -> (name, uid) for every process this agent can see (see ``process``)."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            found = process(int(entry))
            if found is not None:
                out[int(entry)] = found
    return out


def process(pid):
    """(name, uid) of one process, or None when it is gone or hidden.

    The kernel cuts ``comm`` to 15 characters, so nvidia-cuda-mps-control and
    nvidia-cuda-mps-server both read "nvidia-cuda-mps" (seen on an H200 test
    machine); for names that are cut, argv[0] from cmdline tells them apart.
    """
    comm = (read("/proc/%d/comm" % pid) or "").strip()
    try:
        uid = os.stat("/proc/%d" % pid).st_uid
    except OSError:
        return None
    if len(comm) == 15:
        argv0 = (read("/proc/%d/cmdline" % pid) or "").split("\0")[0]
        if os.path.basename(argv0).startswith(comm):
            comm = os.path.basename(argv0)
    return comm, uid


def stat_fields(pid, *which):
    """Fields of /proc/PID/stat as ints, counted from the state after the command's ")" (the
    command may hold spaces and parentheses), or None when the process is gone."""
    text = read("/proc/%d/stat" % pid)
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    try:
        return tuple(int(fields[i]) for i in which)
    except (IndexError, ValueError):
        return None


def lineage(pid):
    """(parent pid, session id, start time in ticks) of one process, or None when it is gone."""
    return stat_fields(pid, 1, 3, 19)


def started_below(root, words, depth=64):
    """The pids below ``root`` (its children's children too) whose command line holds ``words``
    together within its first few words (an interpreter may come first, as for a script)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == root:
            continue
        argv = (read("/proc/%s/cmdline" % entry) or "").split("\0")
        if not any(argv[i:i + len(words)] == list(words) for i in range(3)):
            continue
        pid = int(entry)
        for _ in range(depth):
            up = lineage(pid)
            if up is None or up[0] <= 1:
                break
            if up[0] == root:
                found.append(int(entry))
                break
            pid = up[0]
    return found


def age():
    """Seconds since this process started, or None where /proc does not say: the time spent
    before a program's first line (the interpreter, the bundle's imports). The kernel counts in
    clock ticks (10 ms)."""
    started, uptime = stat_fields(os.getpid(), 19), read("/proc/uptime")
    try:
        return max(0.0, float(uptime.split()[0]) - started[0] / os.sysconf("SC_CLK_TCK"))
    except (AttributeError, IndexError, TypeError, ValueError, OSError):
        return None


class Clock:
    """The moments of a run on the node (its result's ``phases``): each name's seconds since the
    agent's process started, so that what fleet adds to the profiler's own
    time can be told apart."""

    def __init__(self):
        self.zero = time.monotonic() - (age() or 0.0)
        self.marks = {}

    def begin(self):
        """A run's own marks, the first its start: a new mapping, as one process may run several."""
        self.marks = {}
        return self.mark("started")

    def mark(self, name):
        self.marks[name] = round(time.monotonic() - self.zero, 3)
        return self.marks


def host_pid_namespace():
    """NVML reports host pids: they only mean something in the host's namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino == PID_NS_INIT
    except OSError:
        return None


def group(pid):
    """(process group id, start time in ticks) of one process, or None when it is gone."""
    return stat_fields(pid, 2, 19)


def children(pid):
    """The pids of a process's live children: as the kernel lists them for each of its threads
    (/proc/PID/task/TID/children), else (a kernel without that file) found by their parent."""
    lists = glob.glob("/proc/%d/task/*/children" % pid)
    if not lists and os.path.isdir("/proc/%d" % pid):
        return {p for p in (int(e) for e in os.listdir("/proc") if e.isdigit())
                if (lineage(p) or (None,))[0] == pid}
    return {int(c) for path in lists for c in (read(path) or "").split()}


def descendants(pid):
    """Every live process below ``pid``: its children, theirs, and so on."""
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for p in frontier for c in children(p)} - found
        found |= frontier
    return found


class Started:
    """The processes the profiler started, remembered while it runs (pid -> its process group and
    start time): a workload in a process group (or a session) of its own, as under the nsys
    stand-in, outlives a killed profiler unless it is killed with it."""

    def __init__(self, pid):
        self.pid, self.seen, self.looked = pid, {}, None

    def look(self, now):
        if self.looked is not None and now - self.looked < LOOK_EVERY:
            return
        self.looked = now
        for child in children(self.pid) - set(self.seen):
            found = group(child)
            if found is not None:
                self.seen[child] = found

    def kill(self, reaped=False):
        """SIGKILL to the profiler's process group, to every live process below it, and to the group
        of each child that led one; never a pid reused since (its start time differs). Once the
        profiler is ``reaped`` its pid may be another process's: only the children
        remembered are then killed."""
        groups, pids = (set(), set()) if reaped else ({self.pid}, descendants(self.pid))
        for child, (pgid, start) in self.seen.items():
            now = group(child)
            if now is not None and now[1] != start:
                continue
            if pgid == child:
                groups.add(child)
            if now is not None:
                pids |= {child} | descendants(child)
        for send, target in [(os.killpg, g) for g in sorted(groups)] + [(os.kill,
                                                                         p) for p in sorted(pids)]:
            try:
                send(target, signal.SIGKILL)
            # gone meanwhile (ProcessLookupError), or a setuid one not ours to signal
            except OSError:
                pass
