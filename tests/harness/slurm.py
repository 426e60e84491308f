"""A real Slurm cluster on this machine: munge, slurmctld and several slurmd.

Debian's Slurm (22.05 on Debian 12) is built with multiple-slurmd support, so
``node1..nodeN`` all run here, each slurmd on its own port. Each node has GPU
GRES backed by device files (symlinks to /dev/null: a GRES file must be a
character device), partitions ``gpu`` (default) and ``debug``. Everything lives
under one directory; the daemons are stopped by pid and the directory removed.
Needs root and the packages munge, slurmctld, slurmd and slurm-client.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

MUNGED = "/usr/sbin/munged"


def configure_login(slurm: "SlurmCluster", c, gpus: int = 2) -> None:
    """Make SSH host h01 of ``c`` (not started yet) the cluster's login node: Slurm's config,
    simulated GPUs (fake NVML) and the stand-in profilers reach the jobs through its sshd's
    environment; runs go to a shared directory (``c.runs``); ``c.scenario`` drives the GPUs."""
    from . import fakenvml

    lib = fakenvml.build(c.dir / "fakenvml")
    c.scenario = c.dir / "scenario.txt"
    fakenvml.write_scenario(c.scenario, {"gpus": [{"index": i} for i in range(gpus)]})
    c.scenario.chmod(0o644)
    tools = c.standins()
    env = {**fakenvml.env(lib, c.scenario), **slurm.env,
           "PATH": f"{tools}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    c.hosts[0].options["SetEnv"] = " ".join(f"{k}={v}" for k, v in env.items())
    c.runs = c.scratch("runs")
    c.hosts[0].vars.update(slurm_login="h01", report_dir=str(c.runs), nsys_path=str(tools / "nsys"),
                           ncu_path=str(tools / "ncu"), ansible_python_interpreter="/usr/bin/python3")


def free_port_block(n: int) -> int:
    """The first of ``n`` consecutive ports nothing listens on (loopback), from a start of this
    process's own: the suite's workers (pytest-xdist) start their clusters at the same time."""
    for base in range(17000 + os.getpid() % 600 * 20, 30000, 20):
        ok = True
        for port in range(base, base + n):
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free ports for the Slurm daemons")


class SlurmCluster:
    def __init__(self, nodes: int = 2, gpus_per_node: int = 2, *, extra_conf: str = ""):
        if os.geteuid() != 0:
            raise RuntimeError("the test Slurm cluster needs root (slurmd runs jobs as their users)")
        for tool in (MUNGED, "/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch"):
            if not os.access(tool, os.X_OK):
                raise RuntimeError(f"{tool} is missing: apt-get install munge slurmctld slurmd slurm-client")
        self.nodes, self.gpus = nodes, gpus_per_node
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-slurm-"))
        self.dir.chmod(0o755)
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "run" / "munge.sock"
        self.extra_conf = extra_conf
        self.pids: list[Path] = []

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def _write_conf(self) -> None:
        base = self.dir
        port = free_port_block(self.nodes + 1)
        devs = base / "dev"
        devs.mkdir(exist_ok=True)
        for i in range(self.gpus):
            (devs / f"nvidia{i}").unlink(missing_ok=True)
            (devs / f"nvidia{i}").symlink_to("/dev/null")
        last = self.gpus - 1
        self.conf.write_text(f"""\
ClusterName=fleetci
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={port}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={base}/state
SlurmdSpoolDir={base}/spool/%n
SlurmctldPidFile={base}/run/slurmctld.pid
SlurmdPidFile={base}/run/slurmd-%n.pid
SlurmctldLogFile={base}/log/slurmctld.log
SlurmdLogFile={base}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
MinJobAge=300
KillWait=5
OverTimeLimit=0
InactiveLimit=0
GresTypes=gpu
CommunicationParameters=NoInAddrAny
SlurmdParameters=config_overrides
JobCompType=jobcomp/none
{self.extra_conf}
NodeName=node[1-{self.nodes}] NodeHostname=localhost NodeAddr=127.0.0.1 Port=[{port + 1}-{port + self.nodes}] \
CPUs=8 Gres=gpu:{self.gpus} State=UNKNOWN
PartitionName=gpu Nodes=node[1-{self.nodes}] Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
PartitionName=debug Nodes=node1 MaxTime=30 State=UP
""")
        (base / "gres.conf").write_text(f"AutoDetect=off\nNodeName=node[1-{self.nodes}] Name=gpu "
                                        f"File={devs}/nvidia[0-{last}]\n")
        for f in (self.conf, base / "gres.conf"):
            f.chmod(0o644)

    def _start_munge(self) -> None:
        m = self.dir / "munge"
        for sub in ("etc", "run", "lib", "log"):
            (m / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy("/etc/munge/munge.key", m / "etc" / "munge.key")
        subprocess.run(["chown", "-R", "munge:munge", str(m)], check=True)
        (m).chmod(0o755)
        (m / "run").chmod(0o755)
        for sub in ("etc", "lib", "log"):
            (m / sub).chmod(0o700)
        (m / "etc" / "munge.key").chmod(0o600)
        subprocess.run(["runuser", "-u", "munge", "--", MUNGED, f"--key-file={m}/etc/munge.key",
                        f"--socket={self.munge_socket}", f"--pid-file={m}/run/munged.pid",
                        f"--log-file={m}/log/munged.log", f"--seed-file={m}/lib/munged.seed"], check=True)
        self.pids.append(m / "run" / "munged.pid")

    def start(self) -> "SlurmCluster":
        if not Path("/etc/munge/munge.key").exists():
            raise RuntimeError("/etc/munge/munge.key is missing: reinstall munge (its postinst makes the key)")
        for sub in ("state", "spool", "run", "log"):
            (self.dir / sub).mkdir(exist_ok=True)
        self._write_conf()
        self._start_munge()
        env = {**os.environ, **self.env}
        subprocess.run(["slurmctld", "-i"], env=env, check=True)
        self.pids.append(self.dir / "run" / "slurmctld.pid")
        for i in range(1, self.nodes + 1):
            (self.dir / "spool" / f"node{i}").mkdir(exist_ok=True)
            subprocess.run(["slurmd", "-N", f"node{i}"], env=env, check=True)
            self.pids.insert(0, self.dir / "run" / f"slurmd-node{i}.pid")
        self.wait_idle()
        return self

    def run(self, *args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(args), env={**os.environ, **self.env}, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def node_states(self) -> dict[str, str]:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return {n: s for n, s in (line.split() for line in out.splitlines() if line.strip())}

    def wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if len(states) == self.nodes and all(s == "idle" for s in states.values()):
                return
            if time.monotonic() > deadline:
                logs = "".join((self.dir / "log" / f).read_text()[-2000:] for f in os.listdir(self.dir / "log"))
                raise RuntimeError(f"Slurm nodes not idle after {timeout} s: {states}\n{logs}")
            time.sleep(0.1)

    def steps(self, job: str) -> list[int]:
        """The pids of this cluster's slurmstepd for ``job`` (``slurmstepd: [JOB.batch]``, ``[JOB.0]``):
        another worker's cluster numbers its jobs from 1 too, so a step is this one's only where it
        carries this cluster's SLURM_CONF, which slurmd passes on."""
        ours = f"SLURM_CONF={self.conf}".encode()
        found = []
        for proc in Path("/proc").iterdir():
            try:
                if proc.name.isdigit() and (proc / "cmdline").read_bytes().startswith(f"slurmstepd: [{job}.".encode()) \
                        and ours in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:  # gone since
                continue
        return found

    def start_requeued_now(self, job: str) -> None:
        """Start a requeued ``job`` again at once, where Slurm itself would wait. Not before its first
        start's steps are gone: that start's end reaching slurmctld after the second start began was
        taken for the second's. And not in the second its credential was revoked: slurmd refuses a
        credential made in that second (``cred->ctime <= revoked``), and slurmctld then ends the job
        FAILED without running its script ("Job credential revoked")."""
        deadline = time.monotonic() + 60
        while self.steps(job):
            assert time.monotonic() < deadline, f"the first start of job {job} never ended"
            time.sleep(0.2)
        time.sleep(1.05 - time.time() % 1)  # the revoke came before its steps ended: the next second is clear
        self.run("scontrol", "update", f"jobid={job}", "StartTime=now")

    def stop(self) -> None:
        """Every job cancelled (their slurmstepd and processes gone), then the daemons, by pid."""
        if self.conf.exists() and self.pids:
            jobs = self.run("squeue", "-h", "-o", "%i", check=False).stdout.split()
            if jobs:
                self.run("scancel", *jobs, check=False)
                deadline = time.monotonic() + 20
                while self.run("squeue", "-h", "-o", "%i", check=False).stdout.split() and \
                        time.monotonic() < deadline:
                    time.sleep(0.2)
        for pidfile in self.pids:  # slurmd first, then slurmctld, munged last
            try:
                os.kill(int(pidfile.read_text()), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        deadline = time.monotonic() + 20
        for pidfile in self.pids:
            try:
                pid = int(pidfile.read_text())
            except (OSError, ValueError):
                continue
            while time.monotonic() < deadline and Path(f"/proc/{pid}").exists():
                time.sleep(0.05)
            if Path(f"/proc/{pid}").exists():
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "SlurmCluster":
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()
