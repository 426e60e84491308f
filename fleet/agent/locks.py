"""GPU counter locks: one counter-using profiler per GPU across all users of the node.

Runs ON THE NODE (standard library, Python 3.8). The lock is an flock on a file in LOCK_DIR
(/var/lock), one per GPU UUID, shared by every user of the node; it dies with its process.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import stat
import time

try:  # as shipped by fleet, every module travels under a flat name
    from fleet_agent_owned import OwnedError
except ImportError:  # as part of the installed package
    from .owned import OwnedError

LOCK_DIR = os.environ.get("FLEET_LOCK_DIR", "/var/lock")


class GPULock:
    """One counter-using profiler per GPU across all users of the node (flock; dies with us).

    The lock file is shared by every user, so nothing in it is trusted: who holds the lock is
    read from the kernel (/proc/locks), and the file is opened read-only (flock needs no more),
    so one another user created cannot be made unusable by its mode."""

    def __init__(self, uuid, lock_dir=None):
        self.path = os.path.join(lock_dir or LOCK_DIR, "fleet-gpu-%s.lock" % uuid)
        self.fd = None

    def holder(self):
        """The process the kernel says holds the lock: pid, user and command, or None."""
        try:
            st = os.stat(self.path)
            with open("/proc/locks") as f:
                lines = f.read().splitlines()
        except OSError:
            return None
        for line in lines:
            fields = line.split()
            if len(fields) < 6 or fields[1] != "FLOCK" or "->" in fields:
                continue
            dev_major, dev_minor, inode = fields[5].split(":")
            if int(inode) == st.st_ino and (int(dev_major, 16), int(dev_minor, 16)) == (
                    os.major(st.st_dev), os.minor(st.st_dev)):
                pid = int(fields[4])
                return {"pid": pid, "user": _process_user(pid), "command": _process_command(pid)}
        return None

    def acquire(self, wait=0.0):
        """True once held; False if another run holds it after ``wait`` seconds."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as e:
            raise OwnedError("cannot open the GPU lock %s: %s%s" % (self.path, e.strerror,
                                                                    _made_by(self.path)))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise OwnedError("the GPU lock %s is not a regular file%s" % (self.path,
                                                                          _made_by(self.path)))
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    return False
                time.sleep(0.2)
        self.fd = fd
        return True

    def release(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _made_by(path):
    try:
        uid = os.lstat(path).st_uid
        return (" (made by %s; an admin can remove it)" % pwd.getpwuid(uid).pw_name
                if uid != os.geteuid() else "")
    except (OSError, KeyError):
        return ""


def _process_user(pid):
    try:
        return pwd.getpwuid(os.stat("/proc/%d" % pid).st_uid).pw_name
    except (OSError, KeyError):
        return None


def _process_command(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            return f.read(200).replace(b"\0", b" ").decode(errors="replace").strip() or None
    except OSError:
        return None
