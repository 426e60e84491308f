"""SSH settings, apart from the SSH code so that reading them costs no asyncssh import."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class SSHSettings:
    config: str | None = None        # ssh_config path; None: ~/.ssh/config as ssh does
    known_hosts: str | None = None   # None: what ssh_config says, else ~/.ssh/known_hosts
    connect_timeout: float = 15.0
    # Handshakes in flight per sshd address. sshd's default MaxStartups starts
    # dropping past 10, and it learns late that a child has authenticated, so
    # stay a little under.
    per_address: int = 8
    retries: int = 4                 # for handshakes dropped by MaxStartups
    # Keepalives where ssh_config sets none (ServerAliveInterval, ServerAliveCountMax): a node
    # that goes silent (a crash, a partition, a stopped sshd) is given up after about 90 s of
    # silence instead of hanging the run. sshd answers keepalives from its own process, so a
    # loaded node still answers within seconds; three missed in a row is no busy moment.
    keepalive_interval: float = 30.0
    keepalive_count_max: int = 3

    @classmethod
    def from_env(cls, config: str | None = None, known_hosts: str | None = None,
                 connect_timeout: float | None = None) -> "SSHSettings":
        return cls(config=config or os.environ.get("FLEET_SSH_CONFIG") or None,
                   known_hosts=known_hosts or os.environ.get("FLEET_KNOWN_HOSTS") or None,
                   connect_timeout=connect_timeout or cls.connect_timeout)
