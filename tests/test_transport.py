"""SSH and local transports against real OpenSSH servers on loopback."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from fleet.inventory import Host, load
from fleet.transport import Fanout
from fleet.transport.settings import SSHSettings
from tests.conftest import fleet_json_lines, run_fleet
from tests.harness.quoting import NASTY
from tests.harness.sshd import SSHCluster


def settings(c: SSHCluster, **kw) -> SSHSettings:
    return SSHSettings(config=str(c.ssh_config), **kw)


def hosts(c: SSHCluster, *names: str) -> list[Host]:
    inv = load([c.inventory])
    return inv.select(list(names))


def run(coro):
    return asyncio.run(coro)


async def fan_run(c, hs, argv, **kw):
    async with Fanout(settings(c)) as fan:
        return await fan.run_all(hs, argv, **kw)


def test_exec_gives_each_host_its_result_and_a_dead_host_does_not_stop_the_others(cluster, tmp_path):
    inv = tmp_path / "inv.yaml"
    dead = cluster.hosts[0].address.rsplit(".", 1)[0] + ".250"  # nothing listens there
    inv.write_text(cluster.inventory.read_text() + f"        dead:\n          ansible_host: {dead}\n"
                   "          ansible_port: 2222\n")
    env = {**cluster.env(), "FLEET_INVENTORY": str(inv)}
    out = run_fleet("exec", "all", "--json", "--", "sh", "-c", "echo out-$0; echo err >&2; exit 0", "x", env=env)
    assert out.returncode == 3, out.stderr  # 3: some host unreachable, the others ran
    by_host = {r["host"]: r for r in fleet_json_lines(out.stdout)}
    assert set(by_host) == {"h01", "h02", "h03", "h04", "dead"}
    for name in ("h01", "h02", "h03", "h04"):
        assert by_host[name]["exit_status"] == 0 and by_host[name]["stdout"] == "out-x\n"
        assert by_host[name]["stderr"] == "err\n" and by_host[name]["error"] is None
    assert by_host["dead"]["error_kind"] == "unreachable" and by_host["dead"]["exit_status"] is None
    assert "refused" in by_host["dead"]["error"].lower()


def test_exit_statuses_and_folded_output(cluster):
    out = run_fleet("exec", "h01,h02,h03", "--", "sh", "-c", 'test "$(hostname)" && echo same', env=cluster.env())
    assert out.returncode == 0
    assert "h[01-03] (3)\n" in out.stdout and out.stdout.count("same\n") == 1  # identical outputs shown once
    one = run_fleet("exec", "h01", "--", "sh", "-c", "exit 7", env=cluster.env())
    assert one.returncode == 7  # one host: its own status, as ssh gives it
    killed = run_fleet("exec", "h01", "--", "sh", "-c", "kill -TERM $$", env=cluster.env())
    assert killed.returncode == 128 + 15  # killed by SIGTERM, as a shell says it
    # Several hosts: 1 when some failed; with -S (pdsh -S, clush --maxrc) the largest of their statuses.
    by_host = 'set -- $SSH_CONNECTION; case $3 in *.1) exit 4;; *.2) exit 9;; esac'  # by the sshd's address
    several = run_fleet("exec", "h01,h02,h03", "--", "sh", "-c", by_host, env=cluster.env())
    assert several.returncode == 1
    largest = run_fleet("exec", "-S", "h01,h02,h03", "--", "sh", "-c", by_host, env=cluster.env())
    assert largest.returncode == 9, largest.stderr


def test_arguments_survive_the_remote_shell_byte_for_byte(cluster):
    argv = ["printf", "%s\\0", *NASTY]
    [remote] = run(fan_run(cluster, hosts(cluster, "h01"), argv))
    assert remote.exit_status == 0, remote.stderr
    assert remote.stdout.split(b"\0")[:-1] == [a.encode() for a in NASTY]
    assert not os.path.exists("/tmp/pwned")
    out = run_fleet("exec", "h02", "--json", "--", *argv, env=cluster.env())  # through the CLI too
    assert fleet_json_lines(out.stdout)[0]["stdout"].split("\0")[:-1] == NASTY


def test_local_and_ssh_transports_give_the_same_result(cluster):
    argv = ["sh", "-c", 'printf "%s|" "$@"; echo oops >&2; exit 3', "sh", *NASTY[:8]]
    local = Host("me", {"ansible_connection": "local"}, (), "test")
    [via_ssh, via_local] = run(fan_run(cluster, hosts(cluster, "h01") + [local], argv))
    for r in (via_ssh, via_local):
        assert (r.exit_status, r.stdout, r.stderr, r.error) == (3, "|".join(NASTY[:8]).encode() + b"|", b"oops\n", None)


def test_a_command_killed_by_a_signal_is_said_the_same_on_both_transports(cluster):
    """SSH said None and "KILL", the local transport 137 and "SIGKILL"."""
    local = Host("me", {"ansible_connection": "local"}, (), "test")
    results = run(fan_run(cluster, hosts(cluster, "h01") + [local], ["sh", "-c", "kill -9 $$"]))
    assert [(r.exit_status, r.signal) for r in results] == [(137, "SIGKILL")] * 2


def test_stdin_reaches_the_command(cluster):
    data = bytes(range(256)) * 1000
    [r] = run(fan_run(cluster, hosts(cluster, "h03"), ["sha256sum"], input=data))
    import hashlib
    assert r.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("via", ["ssh", "local"])
def test_timeout_stops_the_command_on_the_host(cluster, via):
    pidfile = cluster.scratch(f"timeout-{via}") / "pid"
    argv = ["sh", "-c", f'echo $$ > {pidfile}; exec sleep 300']
    target = hosts(cluster, "h04") if via == "ssh" else [Host("me", {"ansible_connection": "local"}, (), "t")]
    [r] = run(fan_run(cluster, target, argv, timeout=1.5))
    assert r.error_kind == "timeout" and "stopped" in r.error
    pid = int(pidfile.read_text())
    for _ in range(100):  # the remote sleep really went away
        if not Path(f"/proc/{pid}").exists():
            break
        subprocess.run(["sleep", "0.05"])
    assert not Path(f"/proc/{pid}").exists()


def test_one_connection_per_host_is_reused_for_every_operation(cluster):
    h = cluster.hosts[2]
    before = h.log.read_text().count("Accepted publickey")

    async def twice():
        async with Fanout(settings(cluster)) as fan:
            host = hosts(cluster, h.name)[0]
            return [await fan.run(host, ["true"]), await fan.run(host, ["echo", "again"])]

    results = run(twice())
    assert [r.exit_status for r in results] == [0, 0]
    assert h.log.read_text().count("Accepted publickey") == before + 1


def test_wrong_user_is_an_auth_error(cluster, tmp_path):
    [r] = run(fan_run(cluster, [Host("h01", {"ansible_host": cluster.hosts[0].address, "ansible_port": 2222,
                                             "ansible_user": "nosuchuser"}, (), "t")], ["true"]))
    assert r.error_kind == "auth" and r.exit_status is None


# --- host keys: strict by default, trusting is explicit ---

@pytest.fixture
def keys_cluster():
    with SSHCluster(3) as c:
        yield c


def test_unknown_host_key_is_refused_and_nothing_runs(keys_cluster):
    c = keys_cluster
    c.write_client_files(trusted=[c.hosts[0], c.hosts[2]])  # h02 was never trusted
    marker = c.scratch("unknown") / "ran"
    # Each host leaves a file named after its own address (sshd's SSH_CONNECTION).
    touch = ["sh", "-c", 'set -- "$0" $SSH_CONNECTION; touch "$1-$4"', str(marker)]
    out = run_fleet("exec", "all", "--json", "--", *touch, env=c.env())
    res = {r["host"]: r for r in fleet_json_lines(out.stdout)}
    assert out.returncode == 3
    assert res["h02"]["error_kind"] == "host-key-unknown" and "fleet hosts trust h02" in res["h02"]["error"]
    assert res["h01"]["exit_status"] == 0 and res["h03"]["exit_status"] == 0
    assert [Path(f"{marker}-{h.address}").exists() for h in c.hosts] == [True, False, True]

    # Trusting is an explicit act; without a terminal it needs --yes.
    refused = run_fleet("hosts", "trust", "h02", env=c.env())
    assert refused.returncode == 2 and "--yes" in refused.stderr
    fp = subprocess.run(["ssh-keygen", "-lf", str(c.hosts[1].dir / "hostkey.pub")], capture_output=True,
                        text=True).stdout.split()[1]
    trusted = run_fleet("hosts", "trust", "h02", "--yes", env=c.env())
    assert trusted.returncode == 0 and fp in trusted.stdout
    assert c.known_hosts_line(c.hosts[1]) in c.known_hosts.read_text()
    again = run_fleet("exec", "h02", "--", "echo", "now ok", env=c.env())
    assert again.returncode == 0 and again.stdout == "now ok\n"


def test_changed_host_key_is_refused_and_trust_will_not_overwrite_it(keys_cluster):
    c = keys_cluster
    c.new_host_key(c.hosts[2])  # known_hosts still holds the old key
    marker = c.scratch("changed") / "ran"
    out = run_fleet("exec", "h03", "--json", "--", "touch", str(marker), env=c.env())
    [r] = fleet_json_lines(out.stdout)
    assert out.returncode == 3 and r["error_kind"] == "host-key-changed" and "HOST KEY CHANGED" in r["error"]
    assert not marker.exists()  # nothing ran
    trust = run_fleet("hosts", "trust", "h03", "--yes", env=c.env())
    assert trust.returncode == 1 and "DIFFERS" in trust.stderr
    assert c.known_hosts_line(c.hosts[2]) not in c.known_hosts.read_text()


# --- ProxyJump and MaxStartups ---

def test_proxyjump_through_a_jump_host(tmp_path):
    with SSHCluster(3) as c:
        c.restart_host(c.hosts[2], AllowTcpForwarding="no")  # h03 refuses to be a jump host
        target = c.hosts[1]
        extra = "".join(
            f"Host via-{j.name}\n  HostName {target.address}\n  Port {target.port}\n  ProxyJump {j.name}\n"
            f"Host {j.name}\n  HostName {j.address}\n  Port {j.port}\n" for j in (c.hosts[0], c.hosts[2]))
        c.ssh_config.write_text(extra + c.ssh_config.read_text())
        inv = tmp_path / "inv.yaml"
        inv.write_text("all:\n  hosts:\n    via-h01:\n    via-h03:\n")
        out = run_fleet("exec", "all", "--json", "--", "echo", "through", env={**c.env(), "FLEET_INVENTORY": str(inv)})
        res = {r["host"]: r for r in fleet_json_lines(out.stdout)}
        assert res["via-h01"]["stdout"] == "through\n"
        assert res["via-h03"]["exit_status"] is None and res["via-h03"]["error"]  # the jump was really used
        assert "Accepted publickey" in target.log.read_text()


def _aliases(c: SSHCluster, n: int) -> list[Host]:
    h = c.hosts[0]
    return [Host(f"alias{i}", {"ansible_host": h.address, "ansible_port": h.port}, (), "t") for i in range(n)]


def test_many_hosts_behind_one_default_sshd_all_get_through():
    """sshd's default MaxStartups 10:30:100 drops handshakes past ten; fleet stays under it."""
    with SSHCluster(1, options={"MaxStartups": None}) as c:
        async def go(**kw):
            async with Fanout(settings(c, **kw)) as fan:
                return await fan.run_all(_aliases(c, 60), ["true"])

        gated = run(go())
        assert all(r.ok for r in gated), [r.error for r in gated if not r.ok]
        ungated = run(go(retries=0, per_address=60))  # control: the limit is real on this sshd
        assert any(r.error_kind == "unreachable" for r in ungated)


def test_dropped_handshakes_are_retried():
    with SSHCluster(1, options={"MaxStartups": "3:100:3"}) as c:
        async def go():
            async with Fanout(settings(c, per_address=12, retries=10)) as fan:
                return await fan.run_all(_aliases(c, 36), ["true"])

        results = run(go())
        assert all(r.ok for r in results), [r.error for r in results if not r.ok]
        assert "past MaxStartups" in c.hosts[0].log.read_text()  # drops happened, and were retried
