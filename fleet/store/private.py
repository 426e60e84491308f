"""The store's folders and files are the user's own, checked every time: the node's rules
(:mod:`fleet.agent.files`, shipped to nodes; one rule serves both sides) applied to the store.

* every folder from the store's root down to the one written is a real directory of the user's,
  0700: created so, narrowed when the user's and open (an older fleet made them 0755, or the
  umask was 000), refused when another account's or a link of another account's;
* no folder above the root lets another account swap it: one writable by every account needs the
  sticky bit, and one owned by another account (not root) is refused, naming it. The root itself
  must not be a folder every account can create entries in (``--store /tmp``): its catalog and
  the catalog's journal would be theirs to plant;
* files are written under a new name (O_EXCL, O_NOFOLLOW), 0600, and renamed into place; files
  read (manifests, the catalog) must be regular files of the user's, never a link.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..agent import files
from .errors import StoreWriteError, UnsafeStore

WHAT = "the store"
CATALOG_NAME = "catalog.sqlite"


def check_store(store: Path) -> None:
    """The store's root: created 0700, or checked (and narrowed) as the user's; UnsafeStore else."""
    try:
        st = os.stat(store)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UnsafeStore(f"refusing the store {store}: {e.strerror}") from None
    if (st is not None and stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX
        and st.st_mode & 0o002):
        raise UnsafeStore(f"refusing the store {store}: every account can create files in it (mode "
                          f"{stat.S_IMODE(st.st_mode):o}); give a folder of your own below it")
    why = files.problem(str(store))  # changes nothing: checked before any folder is made
    if why:
        raise UnsafeStore(f"refusing the store {store}: {why}")
    if st is None:
        try:
            _make_parents(store)
        except OSError as e:
            raise StoreWriteError(f"cannot make the store {store}: {e.strerror or e}") from None
    check_folder(store, store)


def _make_parents(store: Path) -> None:
    """The missing folders above a new store, made 0700 (``os.makedirs`` would make them with the
    umask: 0777 under umask 000, and the check above would then refuse the store it made)."""
    missing = []
    for parent in store.absolute().parents:
        if os.path.lexists(parent):
            break
        missing.append(parent)
    for parent in reversed(missing):
        try:
            os.mkdir(parent, 0o700)
        except FileExistsError:
            pass  # made meanwhile: checked with the rest


def check_folder(folder: Path, store: Path) -> None:
    """``folder`` and every folder from ``store`` down to it: the user's, 0700 (see the module)."""
    try:
        files.private_dir(str(folder), str(store), what=WHAT)
    except files.UnsafePath as e:
        raise UnsafeStore(str(e)) from None
    # a read-only or full store, a folder fleet may not enter: said, not a traceback
    except OSError as e:
        raise StoreWriteError("cannot use the store's folder "
                              f"{folder}: {e.strerror or e}") from None


def write_file(path: Path, text: str) -> None:
    """``text`` as ``path``, whole or not at all, 0600, never through a link (its
    folder checked first)."""
    files.write_private(str(path), text)


def _checked(fd: int, path: Path) -> os.stat_result:
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise UnsafeStore(f"refusing {path}: it is not a regular file")
    if st.st_uid != os.geteuid():
        raise UnsafeStore(f"refusing {path}: it belongs to {files.account(st.st_uid)}, not to you")
    return st


def _open(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | os.O_NOFOLLOW)
    except OSError as e:
        if os.path.islink(path):
            raise UnsafeStore(f"refusing {path}: it is a symbolic link, "
                              "not a file of yours") from None
        raise


def read_text(path: Path, limit: int = 256 << 20) -> str:
    """A file of the store, opened without following a link and checked to be a regular file of
    the user's; at most ``limit`` bytes (past it: a ValueError, as for any damaged file)."""
    with os.fdopen(_open(path, os.O_RDONLY), "rb") as f:
        _checked(f.fileno(), path)
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit >> 20} MiB")
    return data.decode("utf-8", errors="replace")


def catalog_file(store: Path) -> Path:
    """The catalog's file, made by fleet (O_EXCL, 0600) before SQLite opens it, or checked to be
    a regular file of the user's (narrowed to 0600): SQLite would follow a link planted there."""
    check_store(store)
    path = store / CATALOG_NAME
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        fd = _open(path, os.O_RDONLY)
    except OSError as e:
        raise UnsafeStore(f"cannot make the catalog {path}: {e.strerror}") from None
    try:
        if stat.S_IMODE(_checked(fd, path).st_mode) & 0o077:
            os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    return path


def new_file(path: Path) -> Path:
    """``path`` made empty by fleet (O_EXCL, O_NOFOLLOW, 0600), for a writer
    that opens it by name."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    return path


def rename_into_place(src: Path, dst: Path) -> None:
    """A file written beside ``dst`` under another name takes its place (one
    folder of the user's)."""
    files.rename_private(str(src), str(dst))


def copy_file(src: Path, dst: Path) -> None:
    """``src`` copied to ``dst`` through a new file (O_EXCL, O_NOFOLLOW,
    0600) renamed into place."""
    tmp = dst.with_name(f"{dst.name}.{os.getpid()}.tmp")
    try:
        with open(src, "rb") as f, files.open_partial(str(tmp), 0) as out:
            while block := f.read(1 << 20):
                out.write(block)
        rename_into_place(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
