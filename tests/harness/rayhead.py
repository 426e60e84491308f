"""A real Ray head node on loopback, started by a test and stopped by it: ``ray start --head
--block`` leads a session of its own (its GCS, raylet, dashboard and every worker are in it), so
the test stops exactly what it started, by pid, and never with ``ray stop``, which stops every Ray
on the machine. Its ports are free ones, its RAY_TMPDIR its own and short (Ray's sockets' paths)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

# ray start's port options: each given a free port, so no two heads (or anything else) collide.
PORTS = ("port", "dashboard-port", "ray-client-server-port", "object-manager-port", "node-manager-port",
         "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
# Below the kernel's ephemeral ports, which every outgoing connection of the suite takes from: a port
# found free there (bound to 0, then closed) could be some client's source port by the time the head,
# seconds later, binds it, and a Ray agent that cannot bind its port takes the raylet down with it.
# The other harnesses keep below 30000 (Slurm's daemons, the team servers).
EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
BLOCKS_FROM = 30000


def bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` consecutive ports nothing has bound, from a block of this process's own between 30000 and
    the first ephemeral port: the suite's workers (pytest-xdist) start their heads at the same time."""
    low = int(EPHEMERAL.read_text().split()[0]) if EPHEMERAL.exists() else 32768
    blocks = (low - BLOCKS_FROM) // n
    for k in range(blocks):
        base = BLOCKS_FROM + (os.getpid() + k) % blocks * n
        if all(bindable(p) for p in range(base, base + n)):
            return list(range(base, base + n))
    raise RuntimeError(f"no {n} free ports between {BLOCKS_FROM} and {low} for a Ray head")


def session_members(sid: int) -> list[int]:
    """The live processes of session ``sid`` (the sixth field of each process's stat)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[4]) == sid:
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    return found


class RayHead:
    def __init__(self, path_first: list[str], cpus: int = 4):
        self.tmp = tempfile.mkdtemp(prefix="frh", dir="/tmp")
        ports = dict(zip(PORTS, free_ports(len(PORTS))))
        self.address = f"http://127.0.0.1:{ports['dashboard-port']}"
        ray = str(Path(sys.executable).with_name("ray"))
        self.argv = [ray, "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
                     "--include-dashboard=true", f"--num-cpus={cpus}", "--disable-usage-stats",
                     f"--temp-dir={self.tmp}", *(f"--{k}={v}" for k, v in ports.items())]
        self.env = {**os.environ, "PATH": os.pathsep.join([*path_first, os.environ["PATH"]]),
                    "RAY_AUTH_MODE": "disabled"}
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        self.log = open(f"{self.tmp}.log", "w")
        self.proc = subprocess.Popen(self.argv, env=self.env, stdin=subprocess.DEVNULL, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # the job API answers once the dashboard is up
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray start exited {self.proc.returncode}: {Path(self.log.name).read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.address}/api/version", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"the Ray head's dashboard did not answer in {timeout} s")

    def said(self) -> str:
        """Whether the head still runs, and the last of what it said: for a test's failure message."""
        if self.proc is None:
            return "\n(the Ray head was never started)"
        state = "runs" if self.proc.poll() is None else f"exited {self.proc.returncode}"
        return f"\n(the Ray head {state}; its log ends:)\n" + Path(self.log.name).read_text()[-3000:]

    def stop(self) -> None:
        """SIGTERM to ray start (it stops its own processes), then SIGKILL to what is left of its session."""
        if self.proc is not None:
            sid = self.proc.pid
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            for pid in session_members(sid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.proc.wait()
            self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        Path(f"{self.tmp}.log").unlink(missing_ok=True)
