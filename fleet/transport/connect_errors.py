"""Why a connection failed, in words: the message and error_kind of each way an SSH connection
fails (host keys, authentication, DNS, a silent server, timeouts, sshd's MaxStartups)."""

from __future__ import annotations

import asyncio
import os
import socket
from typing import TYPE_CHECKING, Callable

import asyncssh

from .base import Result
from .settings import SSHSettings

if TYPE_CHECKING:
    from ..inventory import Host

# Connection failures that mean "the server dropped us before auth", which is
# what MaxStartups does; worth a retry. Everything else is reported at once.
DROPPED = (asyncssh.ConnectionLost, ConnectionResetError, BrokenPipeError,
           asyncio.IncompleteReadError)


class Watched(asyncssh.SSHClient):
    """Notes the connection once TCP is up, so that a timeout can tell a silent SSH server from
    an address that never answered (ssh_config's HostName and ProxyJump still apply)."""

    conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self.conn = conn


class SilentServer(TimeoutError):
    """TCP was accepted, then no SSH handshake within the connect timeout."""

    def __init__(self, banner: str | None):
        super().__init__(banner)
        self.banner = banner


class KeyProblem(Exception):
    """A key named for the host that fleet cannot use; the message says why in one line."""


class JumpFailed(Exception):
    """A jump host of ProxyJump could not be reached; ``why`` is its own connect error."""

    def __init__(self, spec: str, why: str | None):
        super().__init__(why)
        self.spec, self.why = spec, why


async def client_keys(files: tuple[str, ...], agent_path) -> tuple[list, object | None]:
    """The keys named for a host, as ssh uses them: a key file without a passphrase is read; an
    encrypted one is used through ssh-agent when the agent holds it (found by its public half,
    FILE.pub, as ssh finds it). Returns the keys and the agent connection to close after use."""
    keys: list = []
    agent = None
    for name in files:
        path = os.path.expanduser(name)
        key = _unencrypted_key(name, path)
        if key is not None:
            keys.append(key)
            continue
        public = _public_half(name, path)
        if agent is None:
            agent = await _open_agent(agent_path)
        held = await agent.get_keys() if agent is not None else []
        match = [k for k in held if k.public_data == public.public_data]
        if not match:
            if agent is not None:
                agent.close()
            raise KeyProblem(f"key {name} is encrypted and ssh-agent does not hold it: "
                             f"add it with `ssh-add {name}`")
        keys.append(match[0])
    return keys, agent


def _unencrypted_key(name: str, path: str):
    """The key file ``path`` (named ``name``) read, or None where it needs a passphrase; KeyProblem
    where it cannot be read or used."""
    try:
        return asyncssh.read_private_key(path)
    except asyncssh.KeyImportError as e:
        if "passphrase" not in str(e).lower():
            raise KeyProblem(f"key {name} cannot be used: {e}") from None
    except OSError as e:
        raise KeyProblem(f"key {name} cannot be read: {e.strerror or e}") from None
    return None


def _public_half(name: str, path: str):
    """An encrypted key's public half, ``path``.pub, by which ssh-agent's copy is found."""
    try:
        return asyncssh.read_public_key(path + ".pub")
    except (OSError, asyncssh.KeyImportError):
        raise KeyProblem(f"key {name} is encrypted, and without {name}.pub beside it fleet cannot "
                         "find it in ssh-agent: add it with `ssh-add` and keep its .pub") from None


async def _open_agent(agent_path):
    """A connection to ssh-agent (``agent_path``; () for SSH_AUTH_SOCK's), or None where there is
    none to be had: no agent named, or none answering."""
    if agent_path is None or (agent_path == () and not os.environ.get("SSH_AUTH_SOCK")):
        return None
    try:
        return await asyncssh.connect_agent(agent_path)
    except (OSError, asyncssh.Error):
        return None


def connect_error(host: "Host", e: BaseException, settings: SSHSettings,
                  has_known_key: Callable[["Host"], bool]) -> Result:
    """The Result of a host whose connection failed with ``e``."""
    from ..inventory.connection import ConnectionOptionError

    where = f"{host.address}:{host.port}" if host.port else host.address
    if isinstance(e, ConnectionOptionError):
        return Result(host.name, error_kind="unreachable", error=str(e))
    if isinstance(e, KeyProblem):
        return Result(host.name, error_kind="auth",
                      error=f"{host.name} ({where}): {e}; nothing was run")
    if isinstance(e, JumpFailed):
        return Result(host.name, error_kind="unreachable",
                      error=f"{host.name} ({where}): its jump host {e.spec} failed: {e.why}")
    if isinstance(e, asyncssh.HostKeyNotVerifiable):
        if has_known_key(host):
            return Result(host.name, error_kind="host-key-changed", error=(
                f"HOST KEY CHANGED for {host.name} ({where}): the key it offered is not the one in "
                "known_hosts. Nothing was run. If the change is expected, remove the old key and "
                f"run `fleet hosts trust {host.name}`."))
        return Result(host.name, error_kind="host-key-unknown", error=(
            f"host key of {host.name} ({where}) is not in known_hosts; nothing was run. "
            f"Check its fingerprint, then accept it with `fleet hosts trust {host.name}`."))
    if isinstance(e, asyncssh.PermissionDenied):
        return Result(host.name, error_kind="auth",
                      error=f"{host.name} ({where}) refused our keys: {e.reason}")
    if isinstance(e, SilentServer):
        within = f"within {settings.connect_timeout:g} s"
        return Result(host.name, error_kind="connect-timeout", error=(
            f"{host.name} ({where}) accepted the TCP connection but sent no SSH banner {within} "
            "(not an SSH server, or one too busy to answer)" if not e.banner else
            f"{host.name} ({where}) answered as {e.banner} but did not "
            f"finish the SSH handshake {within}"))
    # its errno is getaddrinfo's (-2), which os.strerror does not know
    if isinstance(e, socket.gaierror):
        return Result(host.name, error_kind="unreachable",
                      error=f"{host.name}: cannot resolve {host.address!r}: {e.strerror}")
    if isinstance(e, (asyncio.TimeoutError, TimeoutError)):
        return Result(host.name, error_kind="connect-timeout",
                      error=f"{host.name} ({where}): no TCP connection within "
                            f"{settings.connect_timeout:g} s (the host is down, or "
                            "a firewall drops the packets)")
    if isinstance(e, DROPPED):
        return Result(host.name, error_kind="unreachable",
                      error=f"{host.name} ({where}) dropped the connection {settings.retries + 1} "
                            "times (sshd MaxStartups?)")
    if isinstance(e, OSError):
        why = os.strerror(e.errno).lower() if e.errno else str(e)
        return Result(host.name, error_kind="unreachable",
                      error=f"{host.name} ({where}) is unreachable: {why}")
    return Result(host.name, error_kind="unreachable",
                  error=f"{host.name} ({where}): {type(e).__name__}: {e}")
