"""One run of a playbook at a time, per store: a scheduled ``fleet run`` that fires while ``fleet
nightly confirm`` has checked the workload out at another version, or while another run of the same
playbook is still on the GPU, would measure the wrong code or a shared GPU and file it as a night of
the history. So both take the playbook's lock, and the second is refused at once, naming the first.

The lock is ``flock`` on a file in the store's own ``.locks`` folder (the user's, 0700, checked as
every store folder is; the file opened without following a link, a regular file of the user's): the
kernel drops it when the holder exits, however it ends, so no lock outlives its process. The file
keeps who holds it (pid, what, since when), for the refusal's line only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from pathlib import Path
from typing import Iterator

from .. import exitcodes
from ..errors import FleetError
from ..safenames import join
from ..store.private import check_folder, check_store
from ..visible import visible

FOLDER = ".locks"
# characters of the holder's line shown (the file is the user's own, but a line is a line)
HOLDER_MOST = 200


class PlaybookBusy(FleetError):
    """Another fleet holds the playbook's lock: nothing was started."""

    exit_status = exitcodes.REFUSED


def _open_lock(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as e:  # a link planted there (ELOOP), a full or read-only store: said in a line
        raise FleetError(f"refusing the lock {path}: {e.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
        os.close(fd)
        raise FleetError(f"refusing the lock {path}: not a regular file of yours")
    return fd


def _holder(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return visible(os.read(fd, HOLDER_MOST).decode("utf-8",
                                                   errors="replace").strip()) or "another fleet"


@contextlib.contextmanager
def playbook_lock(store_root: Path, name: str, what: str) -> Iterator[None]:
    """Hold playbook ``name``'s lock in ``store_root`` for ``what`` (``a run``, ``a confirmation``);
    PlaybookBusy at once where another holds it."""
    check_store(store_root)
    # a dot first: no site's name (a Slurm cluster's included) can be it
    folder = store_root / FOLDER
    check_folder(folder, store_root)
    path = join(folder, f"playbook-{name}.lock", what="a playbook's name")
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise PlaybookBusy(f"playbook {name} is busy: {_holder(fd)}; {what} was not started "
                               "(it can start once that ends)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd,
                  f"{what} by pid {os.getpid()} since "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}".encode(), 0)
        yield
    finally:
        os.close(fd)  # the lock goes with the file's last descriptor
