"""fleet top as a team runs it: 16 real sshd hosts, each GPU the simulated NVML replaying an H200's
GPM answers, looked at once a second for a minute. One SSH session per host for the whole look (no
reconnect per refresh), every sample of every host in order, and no agent left once the client goes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO, announce, fleet_json_lines
from tests.harness import fakenvml
from tests.harness.procs import descendants
from tests.harness.sshd import SSHCluster

HOSTS = 16
MINUTE = 60  # samples of each host at 1 Hz


@pytest.fixture(scope="module")
def many_hosts(pytestconfig):
    c = SSHCluster(HOSTS)
    lib = fakenvml.build(c.dir / "fakenvml")
    for i, h in enumerate(c.hosts):
        path = c.dir / f"scenario-{h.name}.txt"
        phase = "gemm" if i % 2 else "idle"
        fakenvml.write_scenario(path, {"gpus": [{**fakenvml.gpm_recorded(phase), "index": 0}]})
        h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in fakenvml.env(lib, path).items())
    try:
        c.start()
        announce(pytestconfig, f"started {HOSTS} sshd hosts with simulated GPUs for a minute of fleet top")
        yield c
    finally:
        c.stop()


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def agents(c: SSHCluster) -> dict[str, list[int]]:
    """Each host's look agents, below that host's own sshd."""
    return {h.name: [p for p in descendants(h.pid) if b'"mode":"look"' in _cmdline(p)] for h in c.hosts}


def logins(c: SSHCluster) -> dict[str, int]:
    """Connections each host's sshd accepted so far (LogLevel VERBOSE logs one line each)."""
    return {h.name: h.log.read_text(errors="replace").count("Accepted publickey") for h in c.hosts}


@pytest.mark.parametrize("how", [signal.SIGINT, signal.SIGKILL], ids=["ctrl-c", "sigkill"])
def test_sixteen_hosts_for_a_minute_at_one_hertz_hold_one_session_each_and_leave_no_agent(many_hosts, how):
    c = many_hosts
    before = logins(c)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | c.env()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "top", "--json", "--interval", "1", "all"], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seqs: dict[str, list[int]] = defaultdict(list)
    try:
        first_agents = None
        while min((len(seqs[h.name]) for h in c.hosts), default=0) < MINUTE:
            line = proc.stdout.readline()
            assert line, proc.stderr.read() if proc.poll() is not None else "stdout closed"
            for sample in fleet_json_lines(line, "top"):
                assert sample["error"] is None, sample
                seqs[sample["host"]].append(sample["seq"])
            if first_agents is None and all(seqs[h.name] for h in c.hosts):
                first_agents = agents(c)
        last_agents = agents(c)
        proc.send_signal(how)
        proc.wait(timeout=30)
        gone_by = time.monotonic() + 10  # a bound for a loaded 2-core machine: under a second or two here
        while any(agents(c).values()) and time.monotonic() < gone_by:
            time.sleep(0.1)
        assert not any(agents(c).values()), f"agents outlived the look: {agents(c)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    for h in c.hosts:
        assert seqs[h.name][:MINUTE] == list(range(MINUTE)), (h.name, seqs[h.name])  # none lost, none again
        assert first_agents[h.name] and first_agents[h.name] == last_agents[h.name], h.name  # the same agent
    after = logins(c)
    assert {h: after[h] - before[h] for h in after} == {h.name: 1 for h in c.hosts}  # one login a host, a minute
