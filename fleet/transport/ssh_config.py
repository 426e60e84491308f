"""What the client's ssh_config says, read cheaply, and the ciphers fleet prefers: the parts of
the SSH transport that look at this machine before any connection (``fleet/transport/ssh.py``).

asyncssh evaluates ssh_config itself for each connection; these answer the questions fleet asks
once per run (does any file set keepalives? are the known_hosts files the same for every host?)
without evaluating it per host.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..inventory import Host
    from .settings import SSHSettings


def preferred_ciphers() -> list[str] | tuple:
    """AES-GCM first where the CPU has AES instructions: about 1.5x the
    throughput of asyncssh's default chacha20 for report transfers."""
    try:
        has_aes = " aes " in Path("/proc/cpuinfo").read_text()
    except OSError:
        has_aes = False
    if not has_aes:
        return ()
    from asyncssh.encryption import get_encryption_algs

    algs = [a.decode() for a in get_encryption_algs()]
    first = [a for a in ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com") if a in algs]
    return first + [a for a in algs if a not in first]


def config_mentions(paths: list[str], words: tuple[str, ...]) -> bool:
    """Whether any of the ssh_config files has a line starting with one of ``words``."""
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        if any(line.strip().replace("=", " ").split()[:1] and
               line.strip().replace("=", " ").split()[0].lower() in words for line in lines):
            return True
    return False


def known_hosts_same_for_every_host(paths: list[str]) -> bool:
    """True when no Host/Match block (other than `Host *`) sets known_hosts files and nothing is
    included: then one evaluation of ssh_config serves every host of the run."""
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        specific = False
        for line in lines:
            words = line.strip().replace("=", " ").split()
            if not words or words[0].startswith("#"):
                continue
            key = words[0].lower()
            if key == "include":
                return False
            if key in ("host", "match"):
                specific = key == "match" or words[1:] != ["*"]
            elif key in ("userknownhostsfile",
                         "globalknownhostsfile") and (specific or "%" in line):
                return False
    return True


def keepalives(settings: "SSHSettings", paths: list[str], local_user: str, host: "Host") -> dict:
    """fleet's keepalives (ServerAliveInterval, ServerAliveCountMax) where ssh_config sets none for
    the host: a node that goes silent is given up, never waited on for ever. An interval or count
    of 0 (ssh's "no keepalives") is taken as none set: without ``--timeout`` the keepalives are all
    that bound a run on a node gone silent."""
    from asyncssh.config import SSHClientConfig

    config = SSHClientConfig.load(None, paths, False, False, False, local_user, host.user or (),
                                  host.address, host.port or ())
    return {k: v for k, v in (("keepalive_interval", settings.keepalive_interval),
                              ("keepalive_count_max", settings.keepalive_count_max))
            if not config.get("ServerAliveInterval" if k == "keepalive_interval"
                              else "ServerAliveCountMax")}
