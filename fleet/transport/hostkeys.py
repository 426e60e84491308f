"""Accepting a host's SSH key: the one explicit act that strict checking asks for."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

import asyncssh

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
        return OfferedKey(host.name, file, pattern, None, None, "error", "the server offered no host key")
    fingerprint = key.get_fingerprint("sha256")
    line = f"{pattern} {key.export_public_key('openssh').decode().strip()}"
    known = ssh.known_keys(host)  # the transport's own view
    if any(k.public_data == key.public_data for k in known):
        return OfferedKey(host.name, file, pattern, None, fingerprint, "known")
    return OfferedKey(host.name, file, pattern, line, fingerprint, "changed" if known else "new")


def record(keys: list[OfferedKey]) -> None:
    """Append the accepted keys to their known_hosts files."""
    for k in keys:
        if k.line is None:
            continue
        os.makedirs(os.path.dirname(k.file) or ".", mode=0o700, exist_ok=True)
        with open(k.file, "a", encoding="utf-8") as f:
            f.write(k.line + "\n")
