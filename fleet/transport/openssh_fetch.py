"""The bulk bytes of a large file through OpenSSH's own client, where this machine has one.

asyncssh stays fleet's one SSH stack for control, and for every file where this path cannot be
used. For the bytes of a large report it costs about 1.5 s of CPU per GiB to receive them in
Python, where ``ssh`` (C, AES-NI) does the same for a fraction: with two cores shared by sshd,
the hash and the writes, that decides the rate (docs/performance.md, Gathering).

The ``ssh`` command is made from what fleet resolved for asyncssh, and nothing else reaches it:
the same ssh_config file (``-F``), the inventory's user, port, keys, timeouts and keepalives as
``-o`` options, each value checked to be one plain word; fleet's own known_hosts files only,
checked strictly (never accept-new, never updated); no prompt, no forwarding, no multiplexing,
no escape character, no local or remote command from the config; the destination after ``--``
so that no name becomes an option. Where any of that cannot be said (a ProxyJump or
ProxyCommand, a value with spaces or ``%`` tokens, no ``ssh`` here) the answer is None and
asyncssh carries the file as before.

The node runs ``ssh_fetch.read_command`` (dd: no link followed, never more than the bytes the
node's result named). ssh's stdout is the ``.partial`` the store opened (O_NOFOLLOW, 0600,
appended to when resuming); a thread here reads each block back as it lands and hashes it.
Whatever a cut leaves is a clean prefix to resume from. Nothing for STALL_SECONDS ends it, and
ssh is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Callable

from ..errors import FleetError
from . import compressed, ssh_fetch
from .ssh_fetch import check_end, read_command

# Below this ssh's own start and handshake (0.28 s on the test bed, a third of it OpenSSH's
# default post-quantum key exchange) cost more than its faster stream saves over asyncssh's on
# the connection already open: 1.80x the time at 64 MiB, 0.93x at 128 MiB
# (bench/transfer_threshold.py, transfer-threshold-fc52fd0.json).
OPENSSH_MIN = 128 << 20
READ_SIZE = 1 << 20     # bytes read back and hashed at once
# seconds the reader waits when it has caught up with ssh (~1 MiB at 500 MB/s)
FOLLOW_PAUSE = 0.002

# A value on ssh's command line: one plain word, no option, no ssh_config %-token, no quoting.
_WORD = re.compile(r"[A-Za-z0-9_./@:+,=~][A-Za-z0-9_./@:+,=~-]*\Z")
_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*\Z")  # a host name or address literal

# asyncssh's option -> ssh_config's keyword, and how its value is said there (None: not said,
# ssh_config and ssh's defaults decide, as they do for asyncssh).
_SAID = {
    "port": ("Port", str),
    "username": ("User", str),
    # ssh takes whole seconds
    "connect_timeout": ("ConnectTimeout", lambda v: str(max(1, math.ceil(v)))),
    "keepalive_interval": ("ServerAliveInterval", lambda v: str(max(1, math.ceil(v)))),
    "keepalive_count_max": ("ServerAliveCountMax", str),
    "tcp_keepalive": ("TCPKeepAlive", lambda v: "yes" if v else "no"),
    "compression_algs": ("Compression", lambda v: "no" if list(v) == ["none"] else "yes"),
    "agent_path": ("IdentityAgent", lambda v: "none" if v is None else v),
    "encryption_algs": ("Ciphers", lambda v: OPENSSH_AES_FIRST if v else None),
}
# asyncssh's list names ciphers OpenSSH lacks; where fleet puts AES-GCM first (the CPU has AES
# instructions, ``preferred_ciphers``), ssh gets OpenSSH's own default set in that order.
OPENSSH_AES_FIRST = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
                     "aes128-ctr,aes192-ctr,aes256-ctr")
_IGNORED = {"config", "agent_forwarding"}  # the config goes as -F; no agent is forwarded, ever

# Fixed whatever ssh_config says (options on the command line win over the file's).
_FIXED = (
    "BatchMode=yes", "StrictHostKeyChecking=yes", "UpdateHostKeys=no", "KnownHostsCommand=none",
    "GlobalKnownHostsFile=/dev/null", "VerifyHostKeyDNS=no", "ControlMaster=no", "ControlPath=none",
    "ClearAllForwardings=yes", "ForwardAgent=no", "ForwardX11=no", "PermitLocalCommand=no",
    "RemoteCommand=none", "RequestTTY=no", "EscapeChar=none", "LogLevel=ERROR", "ProxyJump=none",
)


class OpenSSHRefused(FleetError, OSError):
    """ssh itself failed before a byte arrived (its status 255): a key only asyncssh can use, an
    ssh too old for an option. asyncssh carries this host's files instead, checking just as hard."""


def ssh_command(*, address: str, options: dict, identity_files: tuple[str, ...],
                identities_only: bool,
                config_paths: list[str], known_hosts: list[str], proxied: bool) -> list[str] | None:
    """``ssh`` and its options up to the destination (``--`` and the address last), or None where
    this host's connection cannot be said to ssh as fleet resolved it for asyncssh."""
    ssh = shutil.which("ssh")
    if ssh is None or proxied or "proxy_command" in options or not _NAME.match(address):
        return None
    if not known_hosts or len(config_paths) > 1:  # nothing trusted: asyncssh says so, clearly
        return None
    said = _said(options, identity_files, identities_only)
    if said is None:  # an option ssh cannot be told
        return None
    config = config_paths[0] if config_paths else "/dev/null"
    if not all(_WORD.match(word) for word in [config, *known_hosts, *(value for _, value in said)]):
        return None
    out = [ssh, "-n", "-T", "-x", "-a", "-F", config]
    for keyword, value in said:
        out += ["-o", f"{keyword}={value}"]
    out += ["-o", "UserKnownHostsFile=" + " ".join(known_hosts)]  # each checked above: one word
    for fixed in _FIXED:
        out += ["-o", fixed]
    return out + ["--", address]


def _said(options: dict, identity_files: tuple[str, ...],
          identities_only: bool) -> list[tuple[str, str]] | None:
    """The keys and asyncssh's ``options`` as ssh_config's (keyword, value) pairs, in their order;
    None where an option has no such spelling here."""
    said = [("IdentityFile", path) for path in identity_files]
    if identities_only:
        said.append(("IdentitiesOnly", "yes"))
    for key, value in options.items():
        if key in _IGNORED:
            continue
        if key not in _SAID:
            return None
        keyword, spell = _SAID[key]
        if (spelled := spell(value)) is not None:  # None: left to ssh_config and ssh's defaults
            said.append((keyword, spelled))
    return said


async def openssh_copy(command: list[str], remote: str, local: str, dst, offset: int, size: int,
                       on_block: Callable[[memoryview], None] | None,
                       compress: bool = False) -> str:
    """``remote`` from ``offset`` to ``size`` through ``command`` (``ssh_command``'s), appended to
    ``dst`` (the file ``local``, opened by the store); ``on_block`` sees each block as it lands
    (a view, valid during the call only). Raw, ssh writes straight into ``dst``, in order, and a
    thread reads each block back as it lands and hashes it (two copies of each byte fewer than
    through a pipe and a write here). ``compress``: the node sends it zstd-compressed where it can
    (``compressed``), and a thread here undoes that, writes and hashes as it arrives. Returns the
    way it came ("openssh", "openssh-zstd"). Raises OpenSSHRefused where ssh itself failed before
    a byte, OSError for anything else."""
    compress = compress and compressed.available()
    want = size - offset
    remote_command = (compressed.read_command_compressed if compress
                      else read_command)(remote, offset, want)
    dst.flush()
    with contextlib.ExitStack() as stack:
        errors = stack.enter_context(tempfile.TemporaryFile())
        if compress:
            proc = _ssh(command, remote_command, subprocess.PIPE, errors)
            stack.callback(proc.stdout.close)
            follow = (compressed.inflate, proc, proc.stdout.fileno(), dst.fileno(), want, on_block)
        else:
            reader = stack.enter_context(_reader_of(local, dst))
            proc = _ssh(command, remote_command, dst.fileno(), errors)
            follow = (_follow, proc, reader.fileno(), dst.fileno(), offset, want, on_block)
        got, trouble, way, status = await _until_ended(proc, follow)
        errors.seek(0)
        said = errors.read(4096)
    if trouble == "stalled":
        raise OSError(f"`{remote_command}` sent nothing for "
                      f"{ssh_fetch.STALL_SECONDS:g} s: given up")
    if trouble == "too much":
        raise OSError(f"`{remote_command}` sent more than the {want} bytes asked for: stopped, "
                      "and the rest cut off")
    if status == 255 and got == 0:
        raise OpenSSHRefused(said.decode(errors="replace").strip() or "ssh exited with status 255")
    check_end(remote_command, status, said, got, want)
    return way


def _ssh(command: list[str], remote_command: str, stdout, errors) -> subprocess.Popen:
    return subprocess.Popen([*command, remote_command], stdin=subprocess.DEVNULL, stdout=stdout,
                            stderr=errors, env={**os.environ, "SSH_ASKPASS_REQUIRE": "never"})


async def _until_ended(proc: subprocess.Popen, follow: tuple) -> tuple[int, str | None, str, int]:
    """The thread ``follow`` (a function and its arguments) run to its end beside ssh, then ssh's
    status: (bytes, trouble, way, status). Cancelled, ssh goes, and the thread ends with it."""
    running = asyncio.get_running_loop().run_in_executor(None, *follow)
    try:
        got, trouble, way = await asyncio.shield(running)
    except BaseException:
        proc.kill()
        with contextlib.suppress(Exception):
            await running
        raise
    finally:
        status = await asyncio.to_thread(proc.wait)
    return got, trouble, way, status


def _reader_of(local: str, dst):
    """``local`` opened again to read, checked to be the very file ``dst`` is (never a link)."""
    fd = os.open(local, os.O_RDONLY | os.O_NOFOLLOW)
    mine, theirs = os.fstat(fd), os.fstat(dst.fileno())
    if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
        os.close(fd)
        raise OSError(f"{local} was replaced while it was being written: not read")
    return os.fdopen(fd, "rb", buffering=0)


def _follow(proc: subprocess.Popen, reader: int, writer: int, offset: int, want: int,
            on_block) -> tuple[int, str | None, str]:
    """In a thread: each block ssh writes from ``offset`` on, read back and handed to ``on_block``
    in order, until ssh ends and all is read, or a stall. The file's size is watched, not only
    what has been read: past ``want`` bytes ssh is stopped and the excess cut off (more than the
    node said is never kept). Returns the bytes read, None, "stalled" or "too
    much", and "openssh"."""
    buffer = bytearray(READ_SIZE)  # one buffer, reused: no fresh memory per block
    view = memoryview(buffer)
    read, written, quiet_since = offset, offset, time.monotonic()
    while True:
        if (now_size := os.fstat(writer).st_size) != written:
            written, quiet_since = now_size, time.monotonic()
        if written - offset > want:
            proc.kill()
            proc.wait()
            os.ftruncate(writer, offset + want)
            return read - offset, "too much", "openssh"
        if read < written:
            n = os.preadv(reader, [view[:min(READ_SIZE, written - read)]], read)
            if on_block is not None:
                on_block(view[:n])  # hashlib releases the GIL for blocks this size
            read += n
            continue
        if proc.poll() is not None:
            if os.fstat(writer).st_size <= read:  # ssh has ended and every byte it wrote is read
                return read - offset, None, "openssh"
            continue
        if time.monotonic() - quiet_since > ssh_fetch.STALL_SECONDS:
            proc.kill()
            return read - offset, "stalled", "openssh"
        time.sleep(FOLLOW_PAUSE)
