"""The inventory's ssh arguments, keys as ssh uses them, and keepalives, against real sshd servers.

A bastion stands between this machine's network and a hidden one (a network namespace of the
test's own) where the host gpub01 is: ssh reaches it only through the bastion. The inventory
reaches it through ``ansible_ssh_common_args`` with ProxyJump, then with ProxyCommand (the real
OpenSSH client as the proxy), and through ``ansible_ssh_extra_args`` with ``-J``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from fleet.inventory import load
from fleet.transport.settings import SSHSettings
from fleet.transport.ssh import SSHTransport
from tests.conftest import run_fleet
from tests.harness.procs import end_frozen
from tests.harness.sshd import Bastion, HiddenCluster, HiddenNetwork, SSHCluster


@pytest.fixture(scope="module")
def behind():
    """(hidden cluster of one host, its bastion)."""
    hidden = HiddenNetwork()
    c = HiddenCluster(1, hidden, prefix="gpub")
    bastion = None
    try:
        c.start()
        bastion = Bastion(c, hidden)
        with open(c.known_hosts, "a") as f:
            f.write(bastion.known_hosts_line() + "\n")
        yield c, bastion
    finally:
        if bastion:
            bastion.stop()
        c.stop()
        hidden.stop()


def inventory(c: SSHCluster, path: Path, **vars) -> Path:
    h = c.hosts[0]
    path.write_text(yaml.safe_dump({"all": {"hosts": {h.name: {"ansible_host": h.address, "ansible_port": h.port,
                                                               **vars}}}}))
    return path


def fleet(c: SSHCluster, inv: Path, *args: str, config: Path | None = None):
    return run_fleet("-i", str(inv), *args, env={"FLEET_SSH_CONFIG": str(config or c.ssh_config)}, timeout=90)


def test_the_hidden_host_is_reached_only_through_the_bastion(behind, tmp_path):
    c, bastion = behind
    jump = f"{c.user}@{bastion.host.address}:{bastion.host.port}"
    direct = fleet(c, inventory(c, tmp_path / "direct.yaml"), "exec", "gpub01", "--", "echo", "hi")
    assert direct.returncode != 0 and "hi" not in direct.stdout, direct.stdout
    proxy = (f"ssh -F {c.ssh_config} -o ConnectTimeout=10 -W %h:%p -p {bastion.host.port} "
             f"{c.user}@{bastion.host.address}")
    for name, vars in [("jump", {"ansible_ssh_common_args": f"-o ProxyJump={jump}"}),
                       ("command", {"ansible_ssh_common_args": f"-o ProxyCommand=\"{proxy}\""}),
                       ("extra", {"ansible_ssh_extra_args": f"-J {jump}",
                                  "ansible_ssh_args": "-C -o ControlMaster=auto -o ControlPersist=60s"})]:
        sessions = bastion.sessions
        out = fleet(c, inventory(c, tmp_path / f"{name}.yaml", **vars), "exec", "gpub01", "--", "echo", "hi")
        assert out.returncode == 0 and "hi" in out.stdout, (name, out.stdout, out.stderr)
        assert bastion.sessions > sessions, name  # it went through the bastion


def test_inventory_check_says_how_each_host_connects(behind, tmp_path):
    c, bastion = behind
    jump = f"{c.user}@{bastion.host.address}:{bastion.host.port}"
    inv = inventory(c, tmp_path / "inv.yaml", ansible_ssh_common_args=f"-o ProxyJump={jump}",
                    ansible_ssh_private_key_file=str(c.user_key))
    out = fleet(c, inv, "inventory", "check")
    assert out.returncode == 0, out.stderr
    h = c.hosts[0]
    assert out.stdout.splitlines()[0] == (f"gpub01: ssh {c.user}@{h.address}:{h.port}, key {c.user_key}, "
                                          f"through {jump}")


@pytest.mark.parametrize("variable,args,named", [
    ("ansible_ssh_common_args", "-o ControlMaster=auto -o ForwardX11=yes", "-o ForwardX11=yes"),
    ("ansible_ssh_extra_args", "-L 8080:localhost:80", "-L 8080:localhost:80"),
    ("ansible_ssh_args", "-o StrictHostKeyChecking=no", "-o StrictHostKeyChecking=no"),
])
def test_an_option_fleet_cannot_honour_is_refused_naming_it(behind, tmp_path, variable, args, named):
    c, _ = behind
    inv = inventory(c, tmp_path / "inv.yaml", **{variable: args})
    check = fleet(c, inv, "inventory", "check")
    assert check.returncode == 2 and check.stderr.count("\n") == 1, check.stderr
    assert f"fleet: gpub01: {named!r} in {variable}: fleet cannot honour" in check.stderr, check.stderr
    run = fleet(c, inv, "exec", "gpub01", "--", "echo", "hi")
    assert run.returncode != 0 and "hi" not in run.stdout and f"{named!r} in {variable}" in run.stdout + run.stderr


@pytest.fixture(scope="module")
def lab():
    with SSHCluster(1, prefix="lab") as c:
        yield c


def test_an_encrypted_key_held_by_ssh_agent_is_used_through_it(lab, tmp_path):
    c = lab
    key = tmp_path / "enckey"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret words", "-f", str(key)], check=True)
    authorized = c.dir / "keys" / "authorized_keys"
    authorized.write_text(authorized.read_text() + key.with_suffix(".pub").read_text())
    config = tmp_path / "ssh_config"  # no key of its own: only the inventory's key can log in
    config.write_text(f"Host *\n  User {c.user}\n  UserKnownHostsFile {c.known_hosts}\n  StrictHostKeyChecking yes\n")
    inv = inventory(c, tmp_path / "inv.yaml", ansible_ssh_private_key_file=str(key))
    without = run_fleet("-i", str(inv), "exec", "lab01", "--", "echo", "hi",
                        env={"FLEET_SSH_CONFIG": str(config), "SSH_AUTH_SOCK": ""})
    said = without.stdout + without.stderr
    assert without.returncode != 0 and "Traceback" not in said and "KeyImportError" not in said
    assert f"key {key} is encrypted and ssh-agent does not hold it: add it with `ssh-add {key}`" in said, said
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        while not sock.exists():
            time.sleep(0.02)
        askpass = tmp_path / "askpass"
        askpass.write_text("#!/bin/sh\necho 'secret words'\n")
        askpass.chmod(0o700)
        subprocess.run(["ssh-add", str(key)], check=True, capture_output=True, stdin=subprocess.DEVNULL,
                       env={**os.environ, "SSH_AUTH_SOCK": str(sock), "SSH_ASKPASS": str(askpass),
                            "SSH_ASKPASS_REQUIRE": "force", "DISPLAY": ":0"})
        out = run_fleet("-i", str(inv), "exec", "lab01", "--", "echo", "hi",
                        env={"FLEET_SSH_CONFIG": str(config), "SSH_AUTH_SOCK": str(sock)})
        assert out.returncode == 0 and "hi" in out.stdout, (out.stdout, out.stderr)
    finally:
        agent.kill()
        agent.wait()


def test_keepalives_are_fleets_default_where_ssh_config_sets_none(lab, tmp_path):
    c = lab
    host = load([inventory(c, tmp_path / "inv.yaml")]).hosts["lab01"]
    plain = tmp_path / "plain_config"
    plain.write_text(c.ssh_config.read_text())
    opts = SSHTransport(SSHSettings(config=str(plain))).options(host)
    assert (opts["keepalive_interval"], opts["keepalive_count_max"]) == (30.0, 3)
    set_here = tmp_path / "alive_config"
    set_here.write_text(f"Host {c.hosts[0].address}\n  ServerAliveInterval 1\n" + c.ssh_config.read_text())
    opts = SSHTransport(SSHSettings(config=str(set_here))).options(host)
    assert "keepalive_interval" not in opts and opts["keepalive_count_max"] == 3  # ssh_config's interval is used
    off = tmp_path / "off_config"  # ssh's "no keepalives": fleet's bound on a silent node still holds
    off.write_text(f"Host {c.hosts[0].address}\n  ServerAliveInterval 0\n" + c.ssh_config.read_text())
    opts = SSHTransport(SSHSettings(config=str(off))).options(host)
    assert (opts["keepalive_interval"], opts["keepalive_count_max"]) == (30.0, 3)
    off_here = load([inventory(c, tmp_path / "inv0.yaml", ansible_ssh_common_args="-o ServerAliveInterval=0")])
    opts = SSHTransport(SSHSettings(config=str(plain))).options(off_here.hosts["lab01"])
    assert opts["keepalive_interval"] == 30.0


def _descendants(pid: int) -> list[int]:
    children = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        children += [int(p) for p in (task / "children").read_text().split()]
    return [d for c in children for d in [c, *_descendants(c)]]


@pytest.mark.parametrize("where", ["ssh_config", "inventory"])
def test_a_node_whose_sshd_stops_mid_command_ends_unreachable_not_hung(lab, tmp_path, where):
    """ServerAliveInterval 1, ServerAliveCountMax 2 from ssh_config, or from the inventory's ssh
    arguments; the sshd serving the session (the test's own sshd's children, by pid) is stopped
    while the command runs."""
    c = lab
    config = tmp_path / "ssh_config"
    alive = "Host *\n  ServerAliveInterval 1\n  ServerAliveCountMax 2\n" if where == "ssh_config" else ""
    config.write_text(alive + c.ssh_config.read_text())
    args = {"ansible_ssh_common_args": "-o ServerAliveInterval=1 -o ServerAliveCountMax=2"} if not alive else {}
    inv = inventory(c, tmp_path / "inv.yaml", **args)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "-i", str(inv), "exec", "lab01", "--", "sleep", "600"],
                            env={**env, "FLEET_SSH_CONFIG": str(config)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=Path(__file__).parent.parent)
    stopped: list[int] = []
    try:
        sshd = c.hosts[0].pid
        deadline = time.monotonic() + 120  # a loaded 2-core machine starts it late
        while not any(Path(f"/proc/{p}/cmdline").read_bytes().startswith(b"sleep") for p in _descendants(sshd)):
            assert time.monotonic() < deadline, "the command never started"
            time.sleep(0.05)
        for pid in _descendants(sshd):
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        out, err = proc.communicate(timeout=240)  # keepalives end it: without them it waits for ever
    finally:
        end_frozen(proc, stopped)
    assert proc.returncode != 0
    assert "lab01" in out + err and "connection lost while running" in out + err, (out, err)
    assert "1 unreachable (lab01)" in out + err, (out, err)
