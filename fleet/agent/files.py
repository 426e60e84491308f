"""Files fleet writes on a node: only in directories that are the user's own, never through a link.

Runs ON THE NODE (standard library, Python 3.8). On a shared node /var/tmp, scratch and NFS
folders are open to other accounts. One who creates the report directory before fleet, or
plants a link in it, could redirect a report onto any file the run can write (for root, any
file) and read every report. So:

* the directories fleet writes into are real directories (not links) owned by the running
  user; fleet creates them 0700, narrows its own to 0700, and refuses one that belongs to
  another account, naming it;
* above them, no directory may let other accounts swap the path: one writable by everybody
  needs the sticky bit (as /tmp and /var/tmp have), and one owned by another account (not
  root) is refused. Group-writable directories are trusted: the user chose that group;
* fleet's own files are written under a new temporary name (O_EXCL, O_NOFOLLOW) and renamed
  into place; reports are opened without following links and made 0600.

The same checks run when the node is probed (``problem``, so the plan can refuse before
anything runs) and every time a directory is used (``private_dir``).
"""

from __future__ import annotations

import os
import pwd
import stat


class UnsafePath(OSError):
    """A path fleet will not write through; ``str()`` is one line naming it and its owner."""

    def __str__(self):
        return self.args[0]


def account(uid):
    try:
        return "%s (uid %d)" % (pwd.getpwuid(uid).pw_name, uid)
    except KeyError:
        return "uid %d" % uid


def _shared_parent(st):
    """A report root shared by every user, as /var/tmp is: root's, with the sticky bit, so no
    account can move what another made in it. Runs then go in directories of the user's below it
    (also root's: one shared directory is never narrowed to 0700 by a run as root)."""
    return st.st_uid == 0 and stat.S_ISDIR(st.st_mode) and bool(st.st_mode & stat.S_ISVTX)


def _own_dir_problem(path, st, uid):
    if stat.S_ISLNK(st.st_mode):
        return "%s is a symbolic link, not a directory of yours" % path
    if not stat.S_ISDIR(st.st_mode):
        return "%s is not a directory" % path
    if st.st_uid != uid:
        return "%s belongs to %s, not to you" % (path, account(st.st_uid))
    return None


def _ancestor_problem(path, uid):
    """Why a directory above ``path`` lets another account swap it, or None."""
    current = os.path.dirname(os.path.realpath(path))
    while True:
        try:
            st = os.stat(current)
        except FileNotFoundError:
            st = None
        if st is not None:
            if st.st_uid not in (0, uid):
                return "%s, above it, belongs to %s" % (current, account(st.st_uid))
            if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
                return "%s, above it, is writable by every account (mode %o, no sticky bit)" % (
                    current, stat.S_IMODE(st.st_mode))
        parent = os.path.dirname(current)
        if parent == current:
            return None
        current = parent


def _followed(root, uid):
    """A report directory given as a link of the user's own (or root's) is their choice of
    place: what it leads to is what gets checked. Any other link is checked, and refused, as is."""
    try:
        if os.path.islink(root) and os.lstat(root).st_uid in (0, uid):
            return os.path.realpath(root)
    except OSError:
        pass
    return root


def problem(path, uid=None):
    """Why fleet would refuse to write reports under ``path``, or None; changes nothing. A missing
    directory is no problem (fleet creates it); one of the user's own that is open to others is
    none either (fleet narrows it to 0700 before use)."""
    uid = os.getuid() if uid is None else uid
    path = _followed(os.path.normpath(path), uid)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as e:
        return "%s cannot be examined: %s" % (path, e.strerror)
    why = _own_dir_problem(path, st, uid) if st is not None and not _shared_parent(st) else None
    return why or _ancestor_problem(path, uid)


def private_dir(path, root, what="the report directory"):
    """Make sure ``root`` and every directory from it down to ``path`` are real directories of
    the user's, 0700: created so, narrowed when ours and open, refused otherwise (UnsafePath).
    ``root`` may also be a shared parent (root's, sticky, as /var/tmp). Returns the directories
    that were narrowed, for a note. ``what`` names ``root`` in the messages (the controller's
    store is checked by the same rule)."""
    path, root = os.path.normpath(path), os.path.normpath(root)
    if path != root and not path.startswith(root.rstrip("/") + "/"):
        raise UnsafePath("%s is not under %s %s" % (path, what, root))
    uid = os.getuid()
    real = _followed(root, uid)
    path, root = real + path[len(root):], real
    why = _ancestor_problem(root, uid)
    if why:
        raise UnsafePath("refusing %s %s: %s" % (what, root, why))
    narrowed = []
    parts = [p for p in os.path.relpath(path, root).split("/") if p not in ("", ".")]
    current = root
    for level, part in enumerate([None] + parts):
        if part is not None:
            current = os.path.join(current, part)
        _made(current)
        shared_root_above = level == 0 and bool(parts)
        narrowed += _held_private(current, uid, what, shared_root_above)
    return narrowed


def _made(directory):
    """``directory`` made, 0700, where nothing is at its path yet."""
    if os.path.lexists(directory):
        return
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        pass  # made by a concurrent run (or planted): checked by the caller either way
    except FileNotFoundError:
        os.makedirs(directory, 0o700)  # the root's own missing parents (a fresh scratch path)


def _held_private(directory, uid, what, shared_root_above):
    """``directory`` opened without following a link and held to the user's own, 0700 (narrowed
    where it was open: said in the list returned); a shared parent (root's, sticky) passes as the
    root above a path (``shared_root_above``). UnsafePath where it is anything else."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as e:
        raise UnsafePath("refusing %s %s: %s" % (what, directory, _lstat_problem(directory, uid)
                                                 or e.strerror))
    try:
        st = os.fstat(fd)
        if shared_root_above and _shared_parent(st):
            return []
        why = _own_dir_problem(directory, st, uid)
        if why:
            raise UnsafePath("refusing %s %s" % (what, why))
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
            return ["%s (was %o)" % (directory, stat.S_IMODE(st.st_mode))]
        return []
    finally:
        os.close(fd)


def _lstat_problem(path, uid):
    try:
        return _own_dir_problem(path, os.lstat(path), uid)
    except OSError:
        return None


def write_private(path, text, mode=0o600):
    """Whole or not at all (renamed into place: a reader never sees half; synced first, so a
    crash leaves the one before, not an empty file), under a name nobody else made (O_EXCL) and
    never through a planted link (O_NOFOLLOW)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def open_report(path):
    """A report the profiler wrote, opened for reading without following a link, checked to be a
    regular file of the user's, and made 0600 (nsys and ncu write with the umask: 0644). Opened
    without waiting: a named pipe put in its place is refused, not waited on for ever."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafePath("%s is not a regular file of yours: not taken as a report" % path)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def root_owned_problem(path):
    """Why root should not run ``path`` (a program the node's config names), or None: it must be a
    regular file of root's, writable by root alone, in directories no other account controls."""
    try:
        st = os.stat(path)
    except OSError as e:
        return "%s: %s" % (path, e.strerror)
    if not stat.S_ISREG(st.st_mode):
        return "%s is not a regular file" % path
    if st.st_uid != 0 or st.st_mode & 0o022:
        return ("%s must belong to root and be writable by root alone (it belongs to %s, "
                "mode %o)" % (path, account(st.st_uid), stat.S_IMODE(st.st_mode)))
    why = _ancestor_problem(path, 0)
    return "%s: %s" % (path, why) if why else None


def open_partial(path, offset):
    """The file a transfer writes into, from ``offset`` on (a resumed copy appends to it). A new
    one is made afresh under its name (O_EXCL: never a file or link someone planted there), 0600;
    one resumed must be a regular file of the user's, not a link, exactly ``offset`` bytes long."""
    if not offset:
        try:
            os.unlink(path)  # a stale copy, or something planted: unlinking never follows a link
        except FileNotFoundError:
            pass
        return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600),
                         "wb")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_size != offset:
            raise UnsafePath("%s is not the partial copy fleet left there (a regular file of "
                             "yours, %d bytes): not resumed" % (path, offset))
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb")


def rename_private(src, dst):
    """Rename ``src`` onto ``dst``, both in one directory, checked on the open directory to be a
    real one of the user's that no other account can write (so nobody can swap it between the
    check and the rename)."""
    folder = os.path.dirname(dst) or "."
    if (os.path.dirname(src) or ".") != folder:
        raise ValueError("%s and %s are not in one directory" % (src, dst))
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise UnsafePath("refusing to rename into %s: it belongs to %s, mode %o (not a "
                             "directory of yours closed to others)" % (folder, account(st.st_uid),
                                                                       stat.S_IMODE(st.st_mode)))
        os.replace(os.path.basename(src), os.path.basename(dst), src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)
