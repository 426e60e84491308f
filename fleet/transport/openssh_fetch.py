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
node's result named). Here a thread reads ssh's stdout as the bytes land, writes them to the
``.partial`` the store opened (O_NOFOLLOW, 0600) and hashes them; whatever a cut leaves is a
clean prefix to resume from. Nothing for STALL_SECONDS ends it, and ssh is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import math
import os
import re
import select
import shutil
import subprocess
import tempfile
from typing import Callable

from . import ssh_fetch
from .ssh_fetch import check_end, read_command

OPENSSH_MIN = 64 << 20  # below this, ssh's own handshake (~0.1 s) costs what the faster stream saves
READ_SIZE = 1 << 20     # bytes per read of ssh's stdout
PIPE_SIZE = 1 << 20     # the pipe's capacity: ssh writes ahead this far while we hash and write
_F_SETPIPE_SZ = 1031    # fcntl.F_SETPIPE_SZ (Python 3.10+ names it; the value is Linux's)

# A value on ssh's command line: one plain word, no option, no ssh_config %-token, no quoting.
_WORD = re.compile(r"[A-Za-z0-9_./@:+,=~][A-Za-z0-9_./@:+,=~-]*\Z")
_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*\Z")  # a host name or address literal

# asyncssh's option -> ssh_config's keyword, and how its value is said there (None: not said,
# ssh_config and ssh's defaults decide, as they do for asyncssh).
_SAID = {
    "port": ("Port", str),
    "username": ("User", str),
    "connect_timeout": ("ConnectTimeout", lambda v: str(max(1, math.ceil(v)))),  # ssh takes whole seconds
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


class OpenSSHRefused(OSError):
    """ssh itself failed before a byte arrived (its status 255): a key only asyncssh can use, an
    ssh too old for an option. asyncssh carries this host's files instead, checking just as hard."""


def ssh_command(*, address: str, options: dict, identity_files: tuple[str, ...], identities_only: bool,
                config_paths: list[str], known_hosts: list[str], proxied: bool) -> list[str] | None:
    """``ssh`` and its options up to the destination (``--`` and the address last), or None where
    this host's connection cannot be said to ssh as fleet resolved it for asyncssh."""
    ssh = shutil.which("ssh")
    if ssh is None or proxied or "proxy_command" in options or not _NAME.match(address):
        return None
    if not known_hosts or len(config_paths) > 1:  # nothing trusted: asyncssh says so, clearly
        return None
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


async def openssh_copy(command: list[str], remote: str, dst, offset: int, size: int,
                       on_block: Callable[[memoryview], None] | None) -> None:
    """``remote`` from ``offset`` to ``size`` through ``command`` (``ssh_command``'s), appended to
    ``dst``; ``on_block`` sees each block as it lands (a view, valid during the call only).
    Raises OpenSSHRefused where ssh itself failed before a byte, OSError for anything else."""
    remote_command = read_command(remote, offset, size - offset)
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen([*command, remote_command], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=errors, env={**os.environ, "SSH_ASKPASS_REQUIRE": "never"})
        pump = asyncio.get_running_loop().run_in_executor(None, _pump, proc, dst, size - offset, on_block)
        try:
            got, stalled = await asyncio.shield(pump)
        except BaseException:  # cancelled: ssh goes, and the thread ends with it before dst is closed
            proc.kill()
            with contextlib.suppress(Exception):
                await pump
            raise
        finally:
            proc.stdout.close()
            status = await asyncio.to_thread(proc.wait)
        errors.seek(0)
        said = errors.read(4096)
    if stalled:
        raise OSError(f"`{remote_command}` sent nothing for {ssh_fetch.STALL_SECONDS:g} s: given up")
    if status == 255 and got == 0:
        raise OpenSSHRefused(said.decode(errors="replace").strip() or "ssh exited with status 255")
    check_end(remote_command, status, said, got, size - offset)


def _pump(proc: subprocess.Popen, dst, want: int, on_block) -> tuple[int, bool]:
    """In a thread: ssh's stdout into ``dst`` and ``on_block``, in order, until its end, ``want``
    bytes and one more (then it is stopped: more than the node said is never taken in), or a
    stall. Returns (bytes, whether it stalled)."""
    fd = proc.stdout.fileno()
    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, PIPE_SIZE)
    buffer = bytearray(READ_SIZE)  # one buffer, reused: no fresh memory per block
    view = memoryview(buffer)
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    got = 0
    while True:
        if not poll.poll(ssh_fetch.STALL_SECONDS * 1000):
            proc.kill()
            return got, True
        n = os.readv(fd, [buffer])
        if n == 0:
            return got, False
        block = view[:n]
        if got + n > want:  # the node's command said more than the file the result named
            proc.kill()
            block = view[:want - got]
        dst.write(block)
        if on_block is not None:
            on_block(block)  # hashlib releases the GIL for blocks this size
        got += n
        if got > want:
            return got, False
