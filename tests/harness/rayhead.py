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


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


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
