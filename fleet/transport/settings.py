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

    @classmethod
    def from_env(cls, config: str | None = None, known_hosts: str | None = None,
                 connect_timeout: float | None = None) -> "SSHSettings":
        return cls(config=config or os.environ.get("FLEET_SSH_CONFIG") or None,
                   known_hosts=known_hosts or os.environ.get("FLEET_KNOWN_HOSTS") or None,
                   connect_timeout=connect_timeout or cls.connect_timeout)
