"""known_hosts for one run: read once, looked up per host in time that does not grow with the
number of plain entries, and hashed entries checked at a third of asyncssh's cost.

asyncssh keeps hashed names (``|1|salt|hash``, what ``HashKnownHosts yes`` writes, Debian's
default) in a list it scans on every lookup, computing an HMAC-SHA1 of the host name and again of
the address (the same string when fleet connects by address), and again without the port when
nothing matched. With a hashed known_hosts of N lines, probing N hosts costs N x N x 2 HMACs.

Here each lookup picks the lines that can match the host (the plain ones by name from an index,
the hashed ones by an HMAC per name with precomputed pads, wildcard patterns always) and lets
asyncssh match those few lines as it would have matched the whole file: its own rules (markers,
negation, the fallback to the name without the port) decide, on fewer lines.
"""

from __future__ import annotations

import binascii
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import asyncssh
from asyncssh.config import SSHClientConfig

from .ssh_config import known_hosts_same_for_every_host

if TYPE_CHECKING:
    from ..inventory import Host

_WILDCARD = set("*?!/")


class _Hashed:
    """A hashed name's HMAC-SHA1 key pads, computed once (``hmac.new`` redoes them per call)."""

    __slots__ = ("inner", "outer", "digest")

    def __init__(self, salt: bytes, digest: bytes):
        key = salt.ljust(64, b"\0") if len(salt) <= 64 else hashlib.sha1(salt).digest().ljust(64,
                                                                                              b"\0")
        self.inner = hashlib.sha1(bytes(b ^ 0x36 for b in key))
        self.outer = hashlib.sha1(bytes(b ^ 0x5C for b in key))
        self.digest = digest

    def names(self, name: bytes) -> bool:
        inner = self.inner.copy()
        inner.update(name)
        outer = self.outer.copy()
        outer.update(inner.digest())
        return outer.digest() == self.digest


class RunKnownHosts:
    """Matches as ``asyncssh.import_known_hosts(text)`` would; also usable as asyncssh's
    ``known_hosts`` argument (a callable of host, address and port)."""

    def __init__(self, text: str):
        self._exact: dict[str, list[str]] = {}
        self._hashed: list[tuple[_Hashed, str]] = []
        # wildcards, negations, CIDR: matched by asyncssh on every lookup
        self._patterns: list[str] = []
        for line in text.splitlines():
            words = line.split()
            if not words or words[0].startswith("#"):
                continue
            pattern = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
            if pattern.startswith("|") and "," not in pattern:
                hashed = _parse_hashed(pattern)
                if hashed is not None:
                    self._hashed.append((hashed, line))
                    continue
            if pattern.startswith("|") or _WILDCARD & set(pattern):
                self._patterns.append(line)
            else:
                for name in pattern.split(","):
                    self._exact.setdefault(name, []).append(line)

    def _lines_for(self, names: set[str]) -> list[str]:
        lines = [line for name in names for line in self._exact.get(name, ())]
        encoded = [name.encode() for name in names]
        lines += [line for hashed, line in self._hashed if any(hashed.names(n) for n in encoded)]
        return list(dict.fromkeys(lines + self._patterns))

    def match(self, host: str, addr: str, port: int | None) -> tuple:
        """(host keys, CA keys, revoked keys, X.509 certificates, revoked certificates, X.509
        subjects, revoked subjects), as ``SSHKnownHosts.match``: without a match for the name
        with its port, the name alone (so the lines of both are candidates)."""
        names = {n for n in (host, addr) if n}
        if port:
            names |= {f"[{n}]:{port}" for n in names}
        return asyncssh.import_known_hosts("\n".join(self._lines_for(names))).match(host, addr,
                                                                                    port)

    __call__ = match


def _parse_hashed(pattern: str) -> _Hashed | None:
    try:
        magic, salt, digest = pattern[1:].split("|")
        if magic != "1":
            return None
        return _Hashed(binascii.a2b_base64(salt), binascii.a2b_base64(digest))
    except (ValueError, binascii.Error):
        return None  # left to asyncssh, which says what is wrong with it


class KnownHostsFiles:
    """Which known_hosts files ssh would consult for each host, and their keys, each loaded once
    per run: left to itself asyncssh re-reads known_hosts on every connection, which with hundreds
    of hosts is quadratic work and most of fleet's client CPU."""

    def __init__(self, given: str | None, config_paths: Callable[[], list[str]], local_user: str):
        # config_paths: asked at each lookup, as the connections ask it (~/.ssh/config may appear)
        self.given, self.config_paths, self.local_user = given, config_paths, local_user
        self._loaded: dict[tuple[str, ...], RunKnownHosts] = {}
        self._same_for_all: bool | None = None  # known_hosts files do not depend on the host
        self._files_for_all: list[str] | None = None

    def of(self, host: "Host") -> RunKnownHosts:
        """The host's known_hosts, read once for every host that has the same files."""
        files = tuple(self.files(host))
        if files not in self._loaded:
            existing = [f for f in files if os.path.isfile(f)]
            self._loaded[files] = RunKnownHosts(
                "".join(Path(f).read_text(encoding="utf-8", errors="replace") + "\n"
                        for f in existing))
        return self._loaded[files]

    def files(self, host: "Host") -> list[str]:
        """The known_hosts files ssh would consult for this host, user file first. Only ssh_config
        is evaluated for this (asyncssh's config loader): building full connection options per host
        cost more than the connections' own work."""
        if self.given:
            return [self.given]
        paths = self.config_paths()
        if self._same_for_all is None:
            self._same_for_all = known_hosts_same_for_every_host(paths)
        if self._same_for_all and self._files_for_all is not None:
            return self._files_for_all
        config = SSHClientConfig.load(None, paths, False, False, False,
                                      self.local_user, host.user or (), host.address,
                                      host.port or ())
        files = config.get("UserKnownHostsFile", ())
        if files == []:  # "none": checked against nothing, so nothing is trusted
            return []
        files = list(files or [str(Path("~/.ssh/known_hosts").expanduser())])
        files += config.get("GlobalKnownHostsFile", ["/etc/ssh/ssh_known_hosts"])
        files = [os.path.expanduser(str(f)) for f in files]
        if self._same_for_all:
            self._files_for_all = files
        return files
