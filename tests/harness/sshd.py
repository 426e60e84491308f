"""Real OpenSSH servers on loopback, one sshd per simulated host.

Each host has its own address (127.A.B.N, all of 127/8 routes to lo), its own
host key and config; the client side gets one user key, one strict
known_hosts, an ssh_config and an inventory. Needs root (sshd's privilege
separation) and Debian's openssh-server. Used by the tests and by bench/.
"""

from __future__ import annotations

import fcntl
import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SSHD = "/usr/sbin/sshd"
TEST_USER = "fleetci"
STANDINS = Path(__file__).resolve().parent.parent / "standins"


@contextmanager
def accounts_lock():
    """Held while an account is made or removed: the suite's workers (pytest-xdist) may all make
    one at once, and useradd gives up on a held /etc/passwd."""
    lock = os.open(Path(tempfile.gettempdir()) / "fleet-tests-accounts.lock",
                   os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


def ensure_user(name: str = TEST_USER) -> pwd.struct_passwd:
    """A local account that can log in with a key (useradd leaves it locked), looked for again
    under the lock, as another worker may have made it meanwhile."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    with accounts_lock():
        try:
            return pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "-m", "-s", "/bin/bash", name], check=True)
            subprocess.run(["usermod", "-p", "*", name], check=True)
            return pwd.getpwnam(name)


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


@dataclass
class SSHHost:
    name: str
    address: str
    port: int
    dir: Path
    host_key: str = ""           # "ssh-ed25519 AAAA..."
    pid: int | None = None
    options: dict = field(default_factory=dict)  # sshd_config lines
    vars: dict = field(default_factory=dict)     # inventory variables of this host

    @property
    def log(self) -> Path:
        return self.dir / "sshd.log"


def _free_loopback_net(n: int, port: int) -> str:
    """A random 127.A.B whose first ``n`` addresses nothing listens on at ``port``: another run of
    the tests on this machine (or anything else) keeps its own addresses."""
    for _ in range(50):
        net = f"127.{random.randint(100, 250)}.{random.randint(1, 200)}"
        a, b = net.split(".")[1:3]
        taken = False
        for i in range(1, min(n, 250) + 1):
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex((f"127.{a}.{b}.{i}", port)) == 0:
                    taken = True
                    break
        if not taken:
            return net
    raise RuntimeError(f"no free loopback /24 for {n} sshd hosts on port {port}")


class SSHCluster:
    """``n`` sshd hosts named h01.., started by :meth:`start`, stopped by :meth:`stop`."""

    def __init__(self, n: int, *, user: str = TEST_USER, port: int = 2222, prefix: str = "h",
                 options: dict | None = None, net: str | None = None, launcher: list[str] | None = None):
        """``launcher``: a command line prefix sshd is started under (a namespace's nsenter)."""
        if os.geteuid() != 0:
            raise RuntimeError("the sshd test hosts need root (sshd privilege separation)")
        if not os.access(SSHD, os.X_OK):
            raise RuntimeError(f"{SSHD} is missing: apt-get install openssh-server")
        self.user = ensure_user(user).pw_name
        self.launcher = list(launcher or [])
        # Not under pytest's 0700 tmp: sshd reads authorized_keys as the user.
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-sshd-"))
        self.dir.chmod(0o755)
        net = net or _free_loopback_net(n, port)
        a, b = net.split(".")[1:3]
        # 250 hosts per /24, then the next one: 127.A.B.1..250, 127.A.B+1.1..
        address = lambda i: f"127.{a}.{int(b) + (i - 1) // 250}.{(i - 1) % 250 + 1}"
        self.hosts = [SSHHost(f"{prefix}{i:02d}", address(i), port, self.dir / f"{prefix}{i:02d}",
                              options=dict(options or {})) for i in range(1, n + 1)]
        (self.dir / "keys").mkdir()
        self.user_key = self.dir / "keys" / "userkey"
        keygen(self.user_key)
        self.known_hosts = self.dir / "known_hosts"
        self.ssh_config = self.dir / "ssh_config"
        self.inventory = self.dir / "inventory.yaml"
        self.inventory_vars: dict = {}  # group vars for every host (profiler paths, ...)

    # --- sshd ---

    def _config(self, h: SSHHost) -> str:
        opts = {
            "ListenAddress": h.address, "Port": h.port, "HostKey": h.dir / "hostkey",
            "PidFile": h.dir / "sshd.pid", "AuthorizedKeysFile": self.dir / "keys" / "authorized_keys",
            "PubkeyAuthentication": "yes", "PasswordAuthentication": "no", "KbdInteractiveAuthentication": "no",
            "UsePAM": "no", "StrictModes": "no", "UseDNS": "no", "MaxStartups": "1024", "MaxSessions": "64",
            "PermitRootLogin": "prohibit-password", "LogLevel": "VERBOSE",
            "Subsystem": "sftp /usr/lib/openssh/sftp-server",
        }
        opts.update(h.options)
        return "".join(f"{k} {v}\n" for k, v in opts.items() if v is not None)

    def start(self) -> "SSHCluster":
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        shutil.copy(self.user_key.with_suffix(".pub"), self.dir / "keys" / "authorized_keys")
        (self.dir / "keys" / "authorized_keys").chmod(0o644)
        for h in self.hosts:
            h.dir.mkdir(exist_ok=True)
            if not h.host_key:
                h.host_key = keygen(h.dir / "hostkey")
            self._start_one(h)
        self.wait_ready(self.hosts)
        self.write_client_files()
        return self

    def _start_one(self, h: SSHHost) -> None:
        (h.dir / "sshd_config").write_text(self._config(h))
        subprocess.run([*self.launcher, SSHD, "-f", str(h.dir / "sshd_config"), "-E", str(h.log)], check=True)

    def wait_ready(self, hosts: list[SSHHost], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for h in hosts:
            pidfile = h.dir / "sshd.pid"
            while True:  # sshd writes its pid file after it starts listening
                try:
                    socket.create_connection((h.address, h.port), timeout=1).close()
                    if pidfile.exists() and pidfile.read_text().strip():
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd {h.name} did not listen on {h.address}:{h.port}: "
                                       f"{h.log.read_text() if h.log.exists() else 'no log'}")
                time.sleep(0.02)
            h.pid = int(pidfile.read_text())

    def stop_host(self, h: SSHHost) -> None:
        if h.pid:
            try:
                os.kill(h.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            h.pid = None

    def restart_host(self, h: SSHHost, **options) -> None:
        self.stop_host(h)
        (h.dir / "sshd.pid").unlink(missing_ok=True)  # else the old pid is read as the new one's
        h.options.update(options)
        while True:  # the old listener must be gone before the new one binds
            try:
                socket.create_connection((h.address, h.port), timeout=0.2).close()
                time.sleep(0.02)
            except OSError:
                break
        self._start_one(h)
        self.wait_ready([h])

    def new_host_key(self, h: SSHHost) -> None:
        """Give a host a new key, as a reinstalled (or impersonated) machine would have."""
        for f in (h.dir / "hostkey", h.dir / "hostkey.pub"):
            f.unlink()
        h.host_key = keygen(h.dir / "hostkey")
        self.restart_host(h)

    def stop(self) -> None:
        for h in self.hosts:
            self.stop_host(h)
        shutil.rmtree(self.dir, ignore_errors=True)

    def scratch(self, name: str) -> Path:
        """A directory the remote user can write to (pytest's tmp dirs are root-only), shared as
        /tmp is: sticky, so fleet accepts it above the directories it writes."""
        d = self.dir / "scratch" / name
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o1777)
        return d

    # --- client side ---

    def known_hosts_line(self, h: SSHHost) -> str:
        return f"[{h.address}]:{h.port} {h.host_key}"

    def write_client_files(self, trusted: list[SSHHost] | None = None) -> None:
        trusted = self.hosts if trusted is None else trusted
        self.known_hosts.write_text("".join(self.known_hosts_line(h) + "\n" for h in trusted))
        self.ssh_config.write_text(
            f"Host *\n  User {self.user}\n  IdentityFile {self.user_key}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.known_hosts}\n  GlobalKnownHostsFile /dev/null\n"
            "  StrictHostKeyChecking yes\n  BatchMode yes\n")
        hosts = {h.name: {"ansible_host": h.address, "ansible_port": h.port, **h.vars} for h in self.hosts}
        group = {"hosts": hosts, **({"vars": self.inventory_vars} if self.inventory_vars else {})}
        self.inventory.write_text(yaml.safe_dump({"all": {"children": {"cluster": group}}}, sort_keys=False))

    def standins(self) -> Path:
        """The stand-in profilers, where the remote user can run them."""
        d = self.dir / "standins"
        if not d.exists():
            shutil.copytree(STANDINS, d)
        return d

    def env(self) -> dict[str, str]:
        """Environment for running fleet against these hosts."""
        return {"FLEET_SSH_CONFIG": str(self.ssh_config), "FLEET_INVENTORY": str(self.inventory)}

    def __enter__(self) -> "SSHCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


def namespace_holder(kind: str, *options: str) -> subprocess.Popen:
    """A `sleep` in a namespace of its own of ``kind`` (``net``, ``mnt``: unshare's -n, -m), once
    it is in it: the test's own process, which others enter with nsenter -t PID and it stops by pid."""
    flag = {"net": "-n", "mnt": "-m"}[kind]
    holder = subprocess.Popen(["unshare", flag, *options, "sleep", "infinity"])
    mine = os.readlink(f"/proc/self/ns/{kind}")
    deadline = time.monotonic() + 10
    while os.readlink(f"/proc/{holder.pid}/ns/{kind}") == mine:  # unshare has not run yet
        if time.monotonic() > deadline:
            holder.kill()
            holder.wait()
            raise RuntimeError(f"unshare {flag} did not make a {kind} namespace")
        time.sleep(0.01)
    return holder


class HiddenNetwork:
    """A network namespace of its own (nothing but its loopback), where sshd hosts are out of the
    client's reach, as hosts behind a bastion are. Its holder process is the test's, stopped by pid."""

    def __init__(self) -> None:
        self.holder = namespace_holder("net")
        subprocess.run([*self.prefix, "ip", "link", "set", "lo", "up"], check=True)

    @property
    def prefix(self) -> list[str]:
        """A command line prefix that runs a program inside the hidden network."""
        return ["nsenter", "-t", str(self.holder.pid), "-n"]

    def stop(self) -> None:
        self.holder.kill()
        self.holder.wait()


class HiddenCluster(SSHCluster):
    """sshd hosts inside a :class:`HiddenNetwork`: the client cannot reach them directly."""

    def __init__(self, n: int, hidden: HiddenNetwork, **kwargs):
        super().__init__(n, launcher=hidden.prefix, **kwargs)
        self.hidden = hidden

    def wait_ready(self, hosts: list[SSHHost], timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        for h in hosts:  # sshd writes its pid file once it listens; the client cannot connect to see
            pidfile = h.dir / "sshd.pid"
            while not (pidfile.exists() and pidfile.read_text().strip()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"sshd {h.name} did not start: {h.log.read_text() if h.log.exists() else ''}")
                time.sleep(0.02)
            h.pid = int(pidfile.read_text())


class Bastion:
    """A jump host between the client's network and a :class:`HiddenNetwork`: it listens here and
    serves each connection with ``sshd -i`` inside the hidden network, so what it forwards to
    reaches the hidden hosts, as a real bastion's forwarding does."""

    def __init__(self, cluster: SSHCluster, hidden: HiddenNetwork, port: int = 2222):
        import threading

        net = _free_loopback_net(1, port)
        self.host = SSHHost("bastion", f"{net}.1", port, cluster.dir / "bastion")
        self.host.dir.mkdir()
        self.host.host_key = keygen(self.host.dir / "hostkey")
        (self.host.dir / "sshd_config").write_text(cluster._config(self.host) + "AllowTcpForwarding yes\n")
        self.hidden, self.procs = hidden, []
        self.sock = socket.create_server((self.host.address, port))
        self.sessions = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                self.sessions += 1
                self.procs.append(subprocess.Popen(
                    [*self.hidden.prefix, SSHD, "-i", "-f", str(self.host.dir / "sshd_config"),
                     "-E", str(self.host.log)], stdin=conn.fileno(), stdout=conn.fileno(), stderr=subprocess.DEVNULL))

    def known_hosts_line(self) -> str:
        return f"[{self.host.address}]:{self.host.port} {self.host.host_key}"

    def stop(self) -> None:
        self.sock.close()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
