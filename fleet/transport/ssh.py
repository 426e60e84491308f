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
import time
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import asyncssh

from .base import TERM_GRACE, Result, Sink, Transport, drive, feed_later, stop_signal
from ..inventory.connection import (ConnectionOptionError, agent_for_keys, expand_proxy_command,
                                    host_port, number, route, ssh_args, yes_no)
from .connect_errors import DROPPED, JumpFailed, SilentServer, Watched, client_keys, connect_error
from .known_hosts import KnownHostsFiles, RunKnownHosts
from .settings import SSHSettings
from .ssh_config import config_mentions, keepalives, preferred_ciphers
from . import compressed, openssh_fetch
from .ssh_fetch import SFTP_SESSIONS, asyncssh_copy

if TYPE_CHECKING:
    from ..inventory import Host


# The inventory's ssh options asyncssh takes one for one, in the order they are read: each one's
# asyncssh keyword, and what reads its value (None: the word as it is).
_GIVEN = (("Port", "port", number), ("User", "username", None),
          ("ConnectTimeout", "connect_timeout", number),
          ("ServerAliveInterval", "keepalive_interval", number),
          ("ServerAliveCountMax", "keepalive_count_max", number),
          ("ForwardAgent", "agent_forwarding", yes_no), ("TCPKeepAlive", "tcp_keepalive", yes_no))


class SSHTransport(Transport):
    def __init__(self, settings: SSHSettings):
        self.settings = settings
        self._conns: dict[str, asyncio.Task] = {}
        self._per_address: dict[tuple[str, int | None], asyncio.Semaphore] = {}
        self._ciphers = preferred_ciphers()
        self._local_user = getpass.getuser()
        self._known_hosts = KnownHostsFiles(settings.known_hosts, self._config_paths,
                                            self._local_user)
        # sshd's MaxSessions (10) bounds channels
        self._sftp_gates: dict[str, asyncio.Semaphore] = {}
        self._keepalive_in_config: bool | None = None
        self._tunnels: dict[str, asyncssh.SSHClientConnection | None] = {}  # each host's jump hosts
        self._asyncssh_only: set[str] = set()  # hosts whose files OpenSSH's client could not fetch
        # how fast each host's large files came: slow ones come compressed
        self._links = compressed.LinkRates()

    def options(self, host: "Host") -> dict:
        """asyncssh keyword arguments from the inventory (its ssh arguments included, checked by
        ``ssh_args``, which raises on an option fleet cannot honour); ssh_config fills the rest.
        Keys and jump hosts are not here: ``_connect`` loads and opens them."""
        args = ssh_args(host)
        opts = self._base_options(host)
        given = args.options
        for name, keyword, read in _GIVEN:
            if name in given:
                value = read(given[name], name, host) if read else given[name]
                if name == "ServerAliveInterval" and not value:
                    continue  # 0: fleet's own keepalive interval stays
                opts[keyword] = value
        if "Compression" in given:
            compress = yes_no(given["Compression"], "Compression", host)
            opts["compression_algs"] = ["zlib@openssh.com", "zlib",
                                        "none"] if compress else ["none"]
        if "IdentityAgent" in given:
            agent = given["IdentityAgent"]
            opts["agent_path"] = None if agent.lower() == "none" else os.path.expanduser(agent)
        if ("IdentitiesOnly" in given and yes_no(given["IdentitiesOnly"], "IdentitiesOnly", host)
                and args.identity_files):
            # only the keys named; those ssh-agent holds are found by _client_keys
            opts["agent_path"] = None
        if args.proxy_command:
            proxy = expand_proxy_command(args.proxy_command, host, opts, self._local_user)
            opts["proxy_command"] = ["/bin/sh", "-c", proxy]
        return opts

    def _base_options(self, host: "Host") -> dict:
        """What every connection gets, a jump host's too: ssh_config, timeouts, keepalives,
        ciphers."""
        opts: dict = {"connect_timeout": self.settings.connect_timeout,
                      "encryption_algs": self._ciphers}
        if self.settings.config is not None:
            opts["config"] = [self.settings.config] if self.settings.config else None
        opts.update(self._keepalive(host))
        return opts

    def _config_paths(self) -> list[str]:
        if self.settings.config is None:
            default = Path("~/.ssh/config").expanduser()
            return [str(default)] if os.access(default, os.R_OK) else []
        return [self.settings.config] if self.settings.config else []

    def _keepalive(self, host: "Host") -> dict:
        """fleet's keepalives where ssh_config sets none for the host
        (``ssh_config.keepalives``)."""
        paths = self._config_paths()
        if self._keepalive_in_config is None:
            self._keepalive_in_config = config_mentions(
                paths, ("serveraliveinterval", "serveralivecountmax", "include"))
        if self._keepalive_in_config:
            return keepalives(self.settings, paths, self._local_user, host)
        return {"keepalive_interval": self.settings.keepalive_interval,
                "keepalive_count_max": self.settings.keepalive_count_max}

    def route(self, host: "Host") -> dict:
        """How the host will be reached (for ``inventory check``): see ``connection.route``."""
        return route(host, self._config_paths(), self._local_user)

    def known_hosts(self, host: "Host") -> RunKnownHosts:
        """The host's known_hosts, loaded once per run (``KnownHostsFiles``)."""
        return self._known_hosts.of(host)

    def known_hosts_files(self, host: "Host") -> list[str]:
        """The known_hosts files ssh would consult for this host, user file first."""
        return self._known_hosts.files(host)

    async def connection(self, host: "Host") -> asyncssh.SSHClientConnection:
        """The host's one connection, opened on first use; raises on failure."""
        task = self._conns.get(host.name)
        dead = task is not None and task.done() and (task.cancelled() or task.exception()
                                                     or task.result().is_closed())
        if task is None or dead:  # first use, a failed attempt, or a connection that was cut
            task = self._conns[host.name] = asyncio.ensure_future(self._connect(host))
        return await asyncio.shield(task)

    async def _connect(self, host: "Host") -> asyncssh.SSHClientConnection:
        opts = self.options(host)  # raises ConnectionOptionError: nothing is tried
        args = ssh_args(host)
        key = (host.address, host.port)
        gate = self._per_address.setdefault(key, asyncio.Semaphore(self.settings.per_address))
        delay = 0.1
        for attempt in range(self.settings.retries + 1):
            async with gate:
                watched = Watched()
                keys, agent = await client_keys(args.identity_files, agent_for_keys(args.options))
                if keys:
                    opts["client_keys"] = keys
                tunnel = None
                try:
                    tunnel = await self._jumps(host, args.jumps)
                    conn = await asyncssh.connect(host.address, known_hosts=self.known_hosts(host),
                                                  client_factory=lambda: watched, tunnel=tunnel
                                                  or (), **opts)
                    self._tunnels[host.name] = tunnel
                    return conn
                except DROPPED:
                    _close(tunnel)
                    if attempt == self.settings.retries:
                        raise
                except (asyncio.TimeoutError, TimeoutError) as e:
                    _close(tunnel)
                    # TCP was accepted: the SSH server is what stayed silent
                    if watched.conn is not None:
                        raise SilentServer(watched.conn.get_extra_info("server_version")) from e
                    raise
                except BaseException:
                    _close(tunnel)
                    raise
                finally:
                    if agent is not None:
                        agent.close()
            await asyncio.sleep(delay * (1 + random.random()))
            delay *= 2
        raise AssertionError("unreachable")

    async def _jumps(self, host: "Host", jumps: list[str]) -> asyncssh.SSHClientConnection | None:
        """The jump hosts of ProxyJump, each reached through the one before, as ssh does: each
        with ssh_config's settings for it and its host key checked like any host's."""
        from ..inventory.model import Host

        tunnel = None
        for spec in jumps:
            user, _, rest = spec.rpartition("@")
            name, port = host_port(rest)
            hop = Host(name, {"ansible_host": name, **({"ansible_port": port} if port else {}),
                              **({"ansible_user": user} if user else {})}, (),
                       f"(jump host of {host.name})")
            opts = self._base_options(hop)
            if port:
                opts["port"] = port
            if user:
                opts["username"] = user
            try:
                tunnel = await asyncssh.connect(name, known_hosts=self.known_hosts(hop),
                                                tunnel=tunnel or (), **opts)
            except BaseException as e:
                _close(tunnel)
                if isinstance(e, Exception):
                    raise JumpFailed(spec, connect_error(hop, e, self.settings,
                                                         self.has_known_key).error) from e
                raise
        return tunnel

    async def run(self, host: "Host", argv: Sequence[str], *, input: bytes | None = None,
                  timeout: float | None = None, sink: Sink | None = None,
                  stop: asyncio.Event | None = None, grace: float = TERM_GRACE,
                  later: asyncio.Future[bytes | None] | None = None) -> Result:
        try:
            conn = await self.connection(host)
        except Exception as e:
            return self.connect_error(host, e)
        try:
            proc = await conn.create_process(shlex.join(argv), encoding=None)
        except (asyncssh.Error, OSError) as e:
            return Result(host.name, error=f"cannot start a session: {e}", error_kind="channel")
        feeder = None
        try:
            try:
                if input is not None:
                    proc.stdin.write(input)
                if later is None:
                    proc.stdin.write_eof()
                else:
                    feeder = asyncio.ensure_future(feed_later(proc.stdin.write,
                                                              proc.stdin.write_eof, later,
                                                              (asyncssh.Error, OSError)))
            except (asyncssh.Error, OSError):
                # the command ended before reading its input (python3 missing, say): its status
                # tells
                pass
            out, err, why, abandoned = await drive(proc.stdout.read, proc.stderr.read,
                                                   proc.wait(check=False),
                                        lambda: _signal(proc, stop_signal(stop)), proc.close,
                                        timeout=timeout, grace=grace, sink=sink, stop=stop,
                                        timeout_from=later)
        # a second Ctrl-C: the first one's signal (USR1 leaves the workload running)
        except asyncio.CancelledError:
            _signal(proc, stop_signal(stop))
            raise
        except (asyncssh.Error, OSError) as e:
            return Result(host.name, error=f"connection lost while running: {e}",
                          error_kind="unreachable")
        finally:
            if feeder is not None:
                feeder.cancel()
        # the node never answered the channel's close: nothing will come on this connection
        if abandoned:
            self._abandon(host, conn)
            return Result(host.name, stdout=out, stderr=err, error_kind="timeout",
                          error=f"{why}, and the node did not answer the command's end: its "
                                "connection was abandoned")
        return Result.ended(host.name, proc.exit_status, out, err,
                            signal_name=proc.exit_signal[0] if proc.exit_signal else None, why=why)

    async def fetch(self, host: "Host", remote: str, local: str, offset: int = 0,
                    on_block: Callable[[bytes], None] | None = None,
                    size: int | None = None) -> str:
        """From ``offset`` on, appended, to resume; returns the way it came ("openssh",
        "openssh-zstd", "stream", "sftp"). ``local`` is written through ``open_partial``: made
        afresh (O_EXCL, 0600) or the copy resumed, never through a link. How fast a large raw copy
        came is kept: it decides whether this host's next large files come compressed."""
        started = time.monotonic()
        way = await self._fetch(host, remote, local, offset, on_block, size)
        if size is not None:
            self._links.heard(host.name, way, size - offset, time.monotonic() - started)
        return way

    async def _fetch(self, host: "Host", remote: str, local: str, offset: int,
                     on_block: Callable[[bytes], None] | None, size: int | None) -> str:
        """A rest of ``OPENSSH_MIN`` or more, of a file whose ``size`` the node's result gave, goes
        through OpenSSH's own client where this host's connection can be said to it
        (``openssh_fetch``), compressed where the host's link is slow (``compressed``); anything
        else over the host's asyncssh connection (``ssh_fetch.asyncssh_copy``)."""
        from ..agent.files import open_partial

        gate = self._sftp_gates.setdefault(host.name, asyncio.Semaphore(SFTP_SESSIONS))
        large = size is not None and size - offset >= openssh_fetch.OPENSSH_MIN
        if large and (command := self.openssh_command(host)):
            try:
                async with gate:
                    with open_partial(local, offset) as dst:
                        return await openssh_fetch.openssh_copy(command, remote, local, dst, offset,
                                                                size, on_block,
                                                                compress=self._links.slow(
                                                                    host.name))
            except openssh_fetch.OpenSSHRefused:
                # nothing was written: asyncssh starts at the same offset
                self._asyncssh_only.add(host.name)
        try:
            return await asyncssh_copy(await self.connection(host), gate, remote, local, offset,
                                       size, on_block)
        except asyncssh.Error as e:
            raise OSError(f"{host.name}:{remote}: {e}") from e

    def openssh_command(self, host: "Host") -> list[str] | None:
        """OpenSSH's ``ssh`` for this host, as fleet resolved its connection for asyncssh, up to
        the remote command; None where that cannot be said to ssh
        (``openssh_fetch.ssh_command``)."""
        if host.name in self._asyncssh_only:
            return None
        try:
            args, route = ssh_args(host), self.route(host)
            only = yes_no(args.options.get("IdentitiesOnly", "no"), "IdentitiesOnly", host)
            return openssh_fetch.ssh_command(
                address=host.address, options=self.options(host),
                identity_files=args.identity_files, identities_only=only,
                config_paths=self._config_paths(), known_hosts=self.known_hosts_files(host),
                proxied=bool(route["jumps"] or route["proxy_command"]))
        except ConnectionOptionError:
            return None  # asyncssh's path gives the error

    def connect_error(self, host: "Host", e: BaseException) -> Result:
        return connect_error(host, e, self.settings, self.has_known_key)

    def key_name(self, host: "Host") -> tuple[str, int]:
        """The name and port under which known_hosts holds the host's key, as ssh and asyncssh
        look it up: ssh_config's HostKeyAlias or HostName (else the address), and its Port."""
        opts = {k: v for k, v in self._base_options(host).items() if k == "config"}
        try:
            given = ssh_args(host).options.get("Port")
        except ConnectionOptionError:
            given = None
        if given and given.isdigit():
            opts["port"] = int(given)
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

    def _abandon(self, host: "Host", conn: asyncssh.SSHClientConnection) -> None:
        """Drop a silent connection unawaited: nothing (``release``, ``close``) waits on it."""
        conn.abort()
        task = self._conns.get(host.name)
        if task is not None and task.done() and not task.cancelled() and task.exception() is None \
                and task.result() is conn:
            del self._conns[host.name]
            _close(self._tunnels.pop(host.name, None))

    async def release(self, host: "Host") -> None:
        _close(self._tunnels.pop(host.name, None))
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
        for tunnel in self._tunnels.values():
            _close(tunnel)
        self._tunnels.clear()


def _close(conn: asyncssh.SSHClientConnection | None) -> None:
    if conn is not None:
        conn.close()


def _signal(proc: asyncssh.SSHClientProcess, name: str) -> None:
    """A signal to the remote command (OpenSSH honours the channel's signal request)."""
    try:
        proc.send_signal(name)
    except (asyncssh.Error, OSError):
        pass
