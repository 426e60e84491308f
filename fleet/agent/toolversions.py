"""A profiler's ``--version``, kept on the node for as long as the program is the same one.

Runs ON THE NODE (standard library, Python 3.8), for the probe (``fleet/agent/node.py``). Every
probe started the run's profiler for its ``--version`` and waited for it: a new process of a
large program on every call, on a node full of other people's work, before the run's profiler
may start. What a compiled program prints for ``--version`` is the program's own, so the answer
is kept in the account's code cache (``fleet/agent/codecache.py``: its folder checked as it is
there, each entry used only when it is a file of the account's, closed to others) under what the
program file is: its path, device, inode, size, and modification and change times. A program
replaced, upgraded, touched or moved is asked again. Only a compiled program (ELF) is kept: a
script (CUDA's ``bin/ncu`` is one) may run whichever version it finds, so it is asked every time.
"""

from __future__ import annotations

import hashlib
import os
import stat

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_codecache as codecache
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import codecache

ELF = b"\x7fELF"
FORMAT = b"fleet-tool-version 1\n"
LONGEST = 4096  # bytes of an answer kept: a version is a line or two


def program_key(path):
    """What the program at ``path`` is, as one line (None where no answer of it is kept: not a
    regular file, not a compiled program, or not readable)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or os.read(fd, len(ELF)) != ELF:
            return None
    except OSError:
        return None
    finally:
        os.close(fd)
    return "%s\0%d %d %d %d %d" % (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns,
                                    st.st_ctime_ns)


class Kept:
    """The answers kept in the account's code cache; none kept or read where it has none."""

    def __init__(self, cache):
        self.cache = cache

    @classmethod
    def open(cls):
        try:
            return cls(codecache.CodeCache.open())
        except Exception:  # no home, a folder refused (UnsafePath): ask every time, as before
            return cls(None)

    @staticmethod
    def _header(key):
        return FORMAT + key.encode("utf-8", "surrogateescape") + b"\n"

    @staticmethod
    def _entry(tool, key):
        path = key.split("\0", 1)[0].encode("utf-8", "surrogateescape")
        return "%s-version.%s.%s" % (tool, hashlib.sha256(path).hexdigest()[:16],
                                     hashlib.sha256(key.encode("utf-8", "surrogateescape"))
                                     .hexdigest()[:32])

    def answer(self, tool, key):
        """The kept answer of the program ``key`` names, or None."""
        if self.cache is None or key is None:
            return None
        data = self.cache.kept(self._entry(tool, key), self._header(key))
        return data.decode("utf-8", "replace") if data is not None else None

    def keep(self, tool, key, text):
        """Keep ``text``, the program's whole answer, as the one of its path (an older one of the
        same path goes)."""
        if self.cache is None or key is None:
            return
        entry = self._entry(tool, key)
        self.cache.keep(entry, self._header(key) + text.encode("utf-8", "replace")[:LONGEST])
        same_path = entry.rsplit(".", 1)[0] + "."
        try:
            for other in os.listdir(self.cache.fd):
                if other.startswith(same_path) and other != entry and not other.endswith(".tmp"):
                    os.unlink(other, dir_fd=self.cache.fd)
        except OSError:  # another probe removed it first: nothing to do
            pass

    def close(self):
        if self.cache is not None:
            self.cache.close()
