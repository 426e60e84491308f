"""Accepting a host's SSH key: the one explicit act that strict checking asks for."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncssh

from ..agent import files
from .. import exitcodes
from ..errors import FleetError

if TYPE_CHECKING:
    from ..inventory import Host
    from .ssh import SSHTransport


@dataclass
class OfferedKey:
    host: str
    file: str            # the known_hosts file the key would go to
    pattern: str         # how known_hosts names the host: addr or [addr]:port
    line: str | None     # the known_hosts line to add; None when nothing to add
    fingerprint: str | None
    state: str           # new | known | changed | error
    error: str | None = None


async def offered_key(ssh: "SSHTransport", host: "Host") -> OfferedKey:
    """Fetch the key the host offers and compare it with known_hosts."""
    file = (ssh.known_hosts_files(host) or [os.path.expanduser("~/.ssh/known_hosts")])[0]
    name, port = ssh.key_name(host)  # ssh_config's HostName and Port, as ssh records them
    pattern = f"[{name}]:{port}" if port != 22 else name
    opts = {k: v for k, v in ssh.options(host).items() if k in ("config", "port")}
    try:
        key = await asyncssh.get_server_host_key(host.address, **opts)
    except (OSError, asyncssh.Error) as e:
        return OfferedKey(host.name, file, pattern, None, None, "error", f"{type(e).__name__}: {e}")
    if key is None:
        return OfferedKey(host.name, file, pattern, None, None, "error",
                          "the server offered no host key")
    fingerprint = key.get_fingerprint("sha256")
    line = f"{pattern} {key.export_public_key('openssh').decode().strip()}"
    known = ssh.known_keys(host)  # the transport's own view
    if any(k.public_data == key.public_data for k in known):
        return OfferedKey(host.name, file, pattern, None, fingerprint, "known")
    return OfferedKey(host.name, file, pattern, line, fingerprint, "changed" if known else "new")


class KnownHostsError(FleetError, OSError):
    """A known_hosts file fleet will not write; ``str()`` is one line naming it."""

    exit_status = exitcodes.FAILED

    def __str__(self):
        return self.args[0]


def record(keys: list[OfferedKey]) -> None:
    """Add the accepted keys to their known_hosts files: each file written whole under a new name
    (O_EXCL, O_NOFOLLOW) and renamed into place, in a folder of the user's that no other account
    can write (made 0700 when missing). A known_hosts that is a link of the user's own (a dotfile
    manager's) is written where it leads; a link or a file of another account's is refused."""
    by_file: dict[str, list[str]] = {}
    for k in keys:
        if k.line is not None:
            by_file.setdefault(k.file, []).append(k.line)
    for file, lines in by_file.items():
        try:
            _add_lines(file, lines)
        except OSError as e:
            raise KnownHostsError(f"cannot record host keys in {file}: {e.strerror or e}") from None


def _add_lines(file: str, lines: list[str]) -> None:
    path = _followed(os.path.abspath(os.path.expanduser(file)))
    folder = os.path.dirname(path)
    why = files.problem(folder)
    if why:
        raise files.UnsafePath(why)
    if not os.path.lexists(folder):
        files.private_dir(folder, folder, what="the known_hosts folder")
    before, mode = _current(path)
    text = before + ("" if not before
                     or before.endswith("\n") else "\n") + "".join(line + "\n" for line in lines)
    tmp = f"{path}.{os.getpid()}.tmp"
    with files.open_partial(tmp, 0) as f:  # made afresh: O_EXCL, O_NOFOLLOW, never a planted link
        f.write(text.encode("utf-8", errors="surrogateescape"))
        f.flush()
        os.fsync(f.fileno())
        os.fchmod(f.fileno(), mode)
    try:
        files.rename_private(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _followed(path: str) -> str:
    """Where a known_hosts that is a link of the user's own leads (their choice of place); any
    other path as it is (a link of another account's is then refused when opened)."""
    try:
        if os.path.islink(path) and os.lstat(path).st_uid == os.geteuid():
            return os.path.realpath(path)
    except OSError:
        pass
    return path


def _current(path: str) -> tuple[str, int]:
    """The file's text and mode (``ssh`` makes it 0600), read without following a link; it must be
    a regular file of the user's."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return "", 0o600
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise files.UnsafePath(f"{path} is not a regular file of yours")
        return f.read().decode("utf-8", errors="surrogateescape"), stat.S_IMODE(st.st_mode) & 0o644
