"""A profiler's ``--version``, kept on the node for as long as the program is the same one.

Runs ON THE NODE (standard library, Python 3.8), for the probe (``fleet/agent/node.py``). Every
probe started the run's profiler for its ``--version`` and waited for it: a new process of a
large program on every call, on a node full of other people's work, before the run's profiler
may start. What a compiled program prints for ``--version`` is the program's own, so the answer
is kept in the account's code cache (``fleet/agent/codecache.py``: its folder checked as it is
there, each entry used only when it is a file of the account's, closed to others) under what the
program file is: its path, device, inode, size, and modification and change times, taken again
once it answered (an answer kept only when they did not change meanwhile). A program replaced,
upgraded, touched or moved is asked again. Not kept:

* a script (CUDA's ``bin/ncu`` is one), which may run whichever version it finds;
* a program another account could change (``writable_by_others``): it could be swapped for
  another one while it answers and put back after;
* an answer that did not name a version, or came with an exit status other than 0.

``fleet doctor`` asks every time (and keeps what it is told): it is where a broken install shows.
Entries are named by the node's host name too, so nodes that share a home (NFS) keep one each.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import stat

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_codecache as codecache
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import codecache

ELF = b"\x7fELF"
FORMAT = b"fleet-tool-version 2\n"
LONGEST = 4096  # characters of an answer kept: a version is a line or two


def program_key(path):
    """What the program at ``path`` is, as one line (None where no answer of it is kept: not a
    regular file, not a compiled program, or not readable). Opened without waiting: a FIFO put
    in its place is not read from."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
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


def _digest(text):
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


class Kept:
    """The answers kept in the account's code cache, opened the first time one is asked for;
    none kept or read where it has none."""

    def __init__(self):
        self.cache, self.opened = None, False

    def _open(self):
        if not self.opened:
            self.opened = True
            try:
                self.cache = codecache.CodeCache.open()
            except Exception:  # no home, a folder refused (UnsafePath): ask every time, as before
                self.cache = None
        return self.cache

    @staticmethod
    def _header(key):
        return FORMAT + key.encode("utf-8", "surrogateescape") + b"\n"

    @staticmethod
    def _entry(tool, key):
        where = _digest(socket.gethostname() + "\0" + key.split("\0", 1)[0])
        return "%s-version.%s.%s" % (tool, where[:16], _digest(key)[:32])

    def answer(self, tool, key):
        """The kept answer of the program ``key`` names, or None."""
        if key is None or self._open() is None:
            return None
        data = self.cache.kept(self._entry(tool, key), self._header(key))
        try:  # an entry cut short (a writer that died) is no JSON: asked again
            text = json.loads(data.decode("utf-8")) if data is not None else None
        except ValueError:
            return None
        return text if isinstance(text, str) else None

    def keep(self, tool, key, text):
        """Keep ``text``, the program's whole answer, as the one of its path on this node (an
        older one of the same goes)."""
        if key is None or self._open() is None:
            return
        entry = self._entry(tool, key)
        self.cache.keep(entry, self._header(key) + json.dumps(text[:LONGEST]).encode("utf-8"))
        same_place = entry.rsplit(".", 1)[0] + "."
        try:
            others = [n for n in os.listdir(self.cache.fd)
                      if n.startswith(same_place) and n != entry and not n.endswith(".tmp")]
        except OSError:
            return
        for other in others:
            try:
                os.unlink(other, dir_fd=self.cache.fd)
            except OSError:  # another probe removed it first
                pass

    def close(self):
        if self.cache is not None:
            self.cache.close()
