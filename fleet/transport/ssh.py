"""SSH to the nodes with asyncssh: ssh_config honoured, host keys strictly checked.

* ``~/.ssh/config`` (or ``--ssh-config``) is read by asyncssh itself: Host,
  HostName, User, Port, IdentityFile, ProxyJump, UserKnownHostsFile, ...
* An unknown or changed host key is an error for that host and nothing runs
  there; accepting a key is an explicit act (``fleet hosts trust``).
* One connection per host for the whole run. At most ``per_address``
  handshakes in flight to one sshd address, because sshd's default
  ``MaxStartups 10:30:100`` drops unauthenticated connections past ten; a
  dropped handshake is retried with backoff.
"""

from __future__ import annotations

import asyncio
import getpass
import ipaddress
import os
import random
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import asyncssh
from asyncssh.config import SSHClientConfig

from . import TERM_GRACE, Result, Sink, Transport, drive
from .connect_errors import DROPPED, SilentServer, Watched, connect_error
from .known_hosts import RunKnownHosts
from .settings import SSHSettings
from .ssh_fetch import SFTP_SESSIONS, STREAM_MIN, _ordered_copy, _stream_copy

if TYPE_CHECKING:
    from ..inventory import Host



def _preferred_ciphers() -> list[str] | tuple:
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


class SSHTransport(Transport):
    def __init__(self, settings: SSHSettings):
        self.settings = settings
        self._conns: dict[str, asyncio.Task] = {}
        self._per_address: dict[tuple[str, int | None], asyncio.Semaphore] = {}
        self._ciphers = _preferred_ciphers()
        self._known_hosts: dict[tuple[str, ...], RunKnownHosts] = {}
        self._local_user = getpass.getuser()
        self._sftp_gates: dict[str, asyncio.Semaphore] = {}  # sshd's MaxSessions (10) bounds channels
        self._same_for_all: bool | None = None  # known_hosts files do not depend on the host
        self._files_for_all: list[str] | None = None

    def options(self, host: "Host") -> dict:
        """asyncssh keyword arguments from the inventory; ssh_config fills the rest."""
        opts: dict = {"connect_timeout": self.settings.connect_timeout, "encryption_algs": self._ciphers}
        if self.settings.config is not None:
            opts["config"] = [self.settings.config] if self.settings.config else None
        if host.port:
            opts["port"] = host.port
        if host.user:
            opts["username"] = host.user
        if key := host.key_file:
            opts["client_keys"] = [os.path.expanduser(key)]
        return opts

    def known_hosts(self, host: "Host") -> RunKnownHosts:
        """The host's known_hosts, loaded once per run.

        Left to itself asyncssh re-reads known_hosts on every connection: with
        hundreds of hosts that is quadratic work and most of fleet's client CPU.
        """
        files = tuple(self.known_hosts_files(host))
        if files not in self._known_hosts:
            existing = [f for f in files if os.path.isfile(f)]
            self._known_hosts[files] = RunKnownHosts(
                "".join(Path(f).read_text(encoding="utf-8", errors="replace") + "\n" for f in existing))
        return self._known_hosts[files]

    def known_hosts_files(self, host: "Host") -> list[str]:
        """The known_hosts files ssh would consult for this host, user file first.

        Only ssh_config is evaluated for this (asyncssh's config loader): building
        full connection options per host cost more than the connections' own work.
        """
        if self.settings.known_hosts:
            return [self.settings.known_hosts]
        if self.settings.config is None:
            default = Path("~/.ssh/config").expanduser()
            paths = [str(default)] if os.access(default, os.R_OK) else []
        else:
            paths = [self.settings.config] if self.settings.config else []
        if self._same_for_all is None:
            self._same_for_all = _known_hosts_same_for_every_host(paths)
        if self._same_for_all and self._files_for_all is not None:
            return self._files_for_all
        config = SSHClientConfig.load(None, paths, False, False, False, self._local_user,
                                      host.user or (), host.address, host.port or ())
        files = config.get("UserKnownHostsFile", ())
        if files == []:  # "none": checked against nothing, so nothing is trusted
            return []
        files = list(files or [str(Path("~/.ssh/known_hosts").expanduser())])
        files += config.get("GlobalKnownHostsFile", ["/etc/ssh/ssh_known_hosts"])
        files = [os.path.expanduser(str(f)) for f in files]
        if self._same_for_all:
            self._files_for_all = files
        return files

    async def connection(self, host: "Host") -> asyncssh.SSHClientConnection:
        """The host's one connection, opened on first use; raises on failure."""
        task = self._conns.get(host.name)
        dead = task is not None and task.done() and (task.cancelled() or task.exception() or task.result().is_closed())
        if task is None or dead:  # first use, a failed attempt, or a connection that was cut
            task = self._conns[host.name] = asyncio.ensure_future(self._connect(host))
        return await asyncio.shield(task)

    async def _connect(self, host: "Host") -> asyncssh.SSHClientConnection:
        key = (host.address, host.port)
        gate = self._per_address.setdefault(key, asyncio.Semaphore(self.settings.per_address))
        delay = 0.1
        for attempt in range(self.settings.retries + 1):
            async with gate:
                watched = Watched()
                try:
                    return await asyncssh.connect(host.address, known_hosts=self.known_hosts(host),
                                                  client_factory=lambda: watched, **self.options(host))
                except DROPPED:
                    if attempt == self.settings.retries:
                        raise
                except (asyncio.TimeoutError, TimeoutError) as e:
                    if watched.conn is not None:  # TCP was accepted: the SSH server is what stayed silent
                        raise SilentServer(watched.conn.get_extra_info("server_version")) from e
                    raise
            await asyncio.sleep(delay * (1 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")

    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None) -> Result:
        try:
            conn = await self.connection(host)
        except Exception as e:
            return self.connect_error(host, e)
        try:
            proc = await conn.create_process(shlex.join(argv), encoding=None)
        except (asyncssh.Error, OSError) as e:
            return Result(host.name, error=f"cannot start a session: {e}", error_kind="channel")
        try:
            try:
                if input is not None:
                    proc.stdin.write(input)
                proc.stdin.write_eof()
            except (asyncssh.Error, OSError):
                pass  # the command ended before reading its input (python3 missing, say): its status tells
            out, err, why = await drive(proc.stdout.read, proc.stderr.read, proc.wait(check=False),
                                        lambda: _signal(proc, "TERM"), proc.close,
                                        timeout=timeout, grace=TERM_GRACE, sink=sink, stop=stop)
        except asyncio.CancelledError:
            _signal(proc, "TERM")
            raise
        except (asyncssh.Error, OSError) as e:
            return Result(host.name, error=f"connection lost while running: {e}", error_kind="unreachable")
        result = Result(host.name, exit_status=proc.exit_status, stdout=out, stderr=err)
        if proc.exit_signal:  # the remote command died of a signal
            result.killed_by(proc.exit_signal[0])
        if why and why != "stop requested":
            result.error, result.error_kind = f"{why}; the command was stopped", "timeout"
        return result

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None) -> None:
        """From ``offset`` on, appended, to resume; over the host's existing connection.

        SFTP opens the file (a clear error when it is missing or unreadable) and tells its
        size. A small rest is read over SFTP; a large one (>= STREAM_MIN) comes as the raw
        stdout of ``cat`` on an exec channel instead: asyncssh's SFTP client costs about
        half again as much client CPU per byte as a plain channel (its SFTP packet parsing
        and reassembly), and on a busy client that decides the transfer rate. ``local`` is
        written through ``open_partial``: made afresh (O_EXCL, 0600) or the copy resumed, never
        through a link."""
        from ..agent.files import open_partial

        gate = self._sftp_gates.setdefault(host.name, asyncio.Semaphore(SFTP_SESSIONS))
        try:
            conn = await self.connection(host)
            async with gate:
                async with conn.start_sftp_client() as sftp, sftp.open(remote, "rb") as src:
                    size = (await src.stat()).size
                    if size is None or size - offset < STREAM_MIN:
                        with open_partial(local, offset) as dst:
                            await _ordered_copy(src, dst, offset, on_block)
                        return
                with open_partial(local, offset) as dst:
                    await _stream_copy(conn, remote, dst, offset, size, on_block)
        except asyncssh.Error as e:
            raise OSError(f"{host.name}:{remote}: {e}") from e

    def connect_error(self, host: "Host", e: BaseException) -> Result:
        return connect_error(host, e, self.settings, self.has_known_key)

    def key_name(self, host: "Host") -> tuple[str, int]:
        """The name and port under which known_hosts holds the host's key, as ssh and asyncssh
        look it up: ssh_config's HostKeyAlias or HostName (else the address), and its Port."""
        opts = {k: v for k, v in self.options(host).items() if k in ("config", "port")}
        if "config" not in opts:  # what asyncssh.connect reads by default
            default = Path("~/.ssh/config").expanduser()
            opts["config"] = [str(default)] if os.access(default, os.R_OK) else None
        resolved = asyncssh.SSHClientConnectionOptions(host=host.address, **opts)
        return resolved.host_key_alias or resolved.host, resolved.port or 22

    def known_keys(self, host: "Host") -> list:
        """The keys known_hosts records for the host (its name, address and port resolved)."""
        name, port = self.key_name(host)
        try:
            ipaddress.ip_address(name)
            addr = name
        except ValueError:  # a name: asyncssh takes only an IP literal as the address
            addr = ""
        return self.known_hosts(host).match(name, addr, port if port != 22 else None)[0]

    def has_known_key(self, host: "Host") -> bool:
        return bool(self.known_keys(host))

    async def release(self, host: "Host") -> None:
        task = self._conns.pop(host.name, None)
        if task is None:
            return
        if not task.done():
            task.cancel()
        elif not task.cancelled() and task.exception() is None:
            conn = task.result()
            conn.close()
            await conn.wait_closed()

    async def close(self) -> None:
        conns = []
        for task in self._conns.values():
            if task.done() and not task.cancelled() and task.exception() is None:
                conn = task.result()
                conn.close()
                conns.append(conn.wait_closed())
            elif not task.done():
                task.cancel()
        await asyncio.gather(*conns, return_exceptions=True)
        self._conns.clear()


def _known_hosts_same_for_every_host(paths: list[str]) -> bool:
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
            elif key in ("userknownhostsfile", "globalknownhostsfile") and (specific or "%" in line):
                return False
    return True


def _signal(proc: asyncssh.SSHClientProcess, name: str) -> None:
    """A signal to the remote command (OpenSSH honours the channel's signal request)."""
    try:
        proc.send_signal(name)
    except (asyncssh.Error, OSError):
        pass
