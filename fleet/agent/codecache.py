"""The agent's compiled modules, kept on the node between calls in a folder of the user's own.

Runs ON THE NODE (standard library, Python 3.8), used by the bundle's loader
(``fleet/agent/bundle.py``). The agent travels as source and every module it imports was
compiled again on every call: the NVML binding alone (about 8,000 lines) took most of a probe's
CPU. Here the compiled code is kept, as Python keeps ``.pyc`` files, under
``~/.cache/fleet/agent-code`` (``$XDG_CACHE_HOME/fleet/agent-code`` where that is set), the home
being the account's own from the password database, not ``$HOME``.

Loading code from a file runs whatever the file holds, so the cache is trusted exactly as far as
fleet trusts the folders it writes reports into (``fleet/agent/files.py``), checked on every call:

* the folder and ``fleet`` above it are real directories of the user's, 0700 (created so,
  narrowed when the user's own and open, refused when another account's or a link to elsewhere);
  no directory above them lets another account swap them;
* the folder is then held open (``O_NOFOLLOW``) and every file is opened through it without
  following a link, and used only when it is a regular file of the user's, closed to others,
  written by this format for exactly this source (its SHA-256, named by the controller that sent
  it) and this interpreter (its bytecode magic number and ``cache_tag``) and optimisation level;
* anything else is not used: the module is compiled from its source, as before, and the entry
  written afresh under a new name (``O_EXCL``) and renamed into place.

A cache that cannot be made or used (no home, a read-only one, a planted folder,
``PYTHONDONTWRITEBYTECODE``) costs nothing but the compile: the agent runs as it would without.
"""

from __future__ import annotations

import marshal
import os
import pwd
import stat
import sys
from importlib.util import MAGIC_NUMBER

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files

FORMAT = b"fleet-agent-code 1\n"
CODE = type((lambda: None).__code__)
WHAT = "the agent's code cache"


def folder(uid):
    """Where the cache of account ``uid`` lives, and the folder of fleet's above it (its root)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # the XDG rule: a relative value is ignored
        base = os.path.join(pwd.getpwuid(uid).pw_dir, ".cache")
    root = os.path.join(base, "fleet")
    return os.path.join(root, "agent-code"), root


class CodeCache:
    """The cache folder, checked and held open; ``code`` gives a module's compiled code."""

    def __init__(self, fd, uid):
        self.fd, self.uid = fd, uid
        self.suffix = ".%s%s.code" % (sys.implementation.cache_tag,
                                      "-O%d" % sys.flags.optimize if sys.flags.optimize else "")

    @classmethod
    def open(cls):
        """The current account's cache, or None where there is none to use; UnsafePath when its
        folder is refused (the caller then compiles as it would without)."""
        uid = os.getuid()
        if uid != os.geteuid() or sys.implementation.cache_tag is None or sys.dont_write_bytecode:
            return None
        path, root = folder(uid)
        files.private_dir(path, root, WHAT)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        st = os.fstat(fd)  # the folder held open is the one checked: nobody swapped it since
        if st.st_uid != uid or stat.S_IMODE(st.st_mode) & 0o077:
            os.close(fd)
            raise files.UnsafePath("refusing %s %s: it changed while being checked" % (WHAT, path))
        return cls(fd, uid)

    def code(self, name, digest, filename, source):
        """The compiled code of module ``name`` whose source (``source()``, unpacked only when
        needed) has SHA-256 ``digest``: from the cache when a good entry is there, else compiled
        and written there."""
        entry = name + "." + digest + self.suffix
        header = FORMAT + MAGIC_NUMBER + digest.encode("ascii") + b"\n"
        found = self._read(entry, header)
        if found is not None:
            return found
        code = compile(source(), filename, "exec")
        try:
            self._write(entry, header + marshal.dumps(code))
            self._prune(name, entry)
        except OSError:  # a full disk, a concurrent writer: the next call tries again
            pass
        return code

    def _read(self, entry, header):
        data = self.kept(entry, header)
        if data is None:
            return None
        try:
            code = marshal.loads(data)
        except (EOFError, ValueError, TypeError):  # cut short: written by a writer that died
            return None
        return code if type(code) is CODE else None

    def kept(self, entry, header):
        """What the entry ``entry`` holds after ``header``, when it is a regular file of this
        account's, closed to others, that starts with ``header``; else None."""
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd)
        except OSError:
            return None
        try:
            st = os.fstat(fd)
            if (not stat.S_ISREG(st.st_mode) or st.st_uid != self.uid
                or stat.S_IMODE(st.st_mode) & 0o077):
                return None  # not one this account wrote for itself: never used
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read()
        except OSError:
            return None
        finally:
            os.close(fd)
        return data[len(header):] if data.startswith(header) else None

    def keep(self, entry, data):
        """Write ``data`` as the entry ``entry`` (a new file renamed into place); a full disk or
        a concurrent writer leaves it for the next call."""
        try:
            self._write(entry, data)
        except OSError:
            pass

    def _write(self, entry, data):
        # No fsync: an entry a crash leaves short fails its reading above and is written again.
        partial = "%s.%s.%d.tmp" % (entry, os.uname().nodename, os.getpid())
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(partial, entry, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException:
            try:
                os.unlink(partial, dir_fd=self.fd)
            except OSError:
                pass
            raise

    def _prune(self, name, kept):
        """Entries of the same module and interpreter for sources fleet no longer sends."""
        for other in os.listdir(self.fd):
            if other != kept and other.startswith(name + ".") and other.endswith(self.suffix) \
                    and other.count(".") == kept.count("."):
                try:
                    os.unlink(other, dir_fd=self.fd)
                except OSError:
                    pass

    def close(self):
        os.close(self.fd)
