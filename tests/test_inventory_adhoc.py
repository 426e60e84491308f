"""Hosts without an inventory (docs/inventory.md, "Hosts without an inventory"): targets read as
ssh and clush -w read them, against real sshd hosts on loopback."""

from __future__ import annotations

import pytest

from fleet.inventory import TargetError, load, local_inventory
from tests.conftest import fleet_json_lines, run_fleet


def shown(hosts):
    return [(h.name, h.address, h.port, h.user, h.connection) for h in hosts]


# --- how targets are read ---

@pytest.mark.parametrize("target, expected", [
    ("alice@gpu01:2222", [("gpu01", "gpu01", 2222, "alice", "ssh")]),
    ("gpu01:2222", [("gpu01", "gpu01", 2222, None, "ssh")]),
    ("gpu01", [("gpu01", "gpu01", None, None, "ssh")]),
    ("[2001:db8::1]:2222", [("2001:db8::1", "2001:db8::1", 2222, None, "ssh")]),
    ("bob@gx-[01:02]:22", [("gx-01", "gx-01", 22, "bob", "ssh"), ("gx-02", "gx-02", 22, "bob", "ssh")]),
    ("DOM\\carol@10.0.0.5", [("10.0.0.5", "10.0.0.5", None, "DOM\\carol", "ssh")]),
])
def test_without_an_inventory_a_target_is_a_host_built_from_it(target, expected):
    assert shown(local_inventory().select([target])) == expected


@pytest.mark.parametrize("targets", [[], ["localhost"], ["local"], ["all"]])
def test_without_an_inventory_nothing_or_localhost_is_this_machine_without_ssh(targets):
    [host] = local_inventory().select(targets)
    assert host.connection == "local"


def test_a_range_and_an_exclusion_of_ad_hoc_hosts():
    hosts = local_inventory().select(["gpu[01-04]:2222"], ["gpu03"])
    assert [h.name for h in hosts] == ["gpu01", "gpu02", "gpu04"] and {h.port for h in hosts} == {2222}


@pytest.mark.parametrize("target, says", [
    ("alice@../etc", "host name '../etc' cannot name a folder or file"),
    ("-oProxyCommand=touch", "host name '-oProxyCommand=touch' cannot name a folder or file"),
    ("a b", "host name 'a b' cannot name a folder"),
    ("-x@h", "bad user '-x'"),
    ("evil\nuser@h", "bad user 'evil\\nuser'"),
    ("h:99999", "port 99999 in target 'h:99999' is not between 1 and 65535"),
    ("h:ssh", "bad port 'ssh'"),
    ("h,alice@h", "'h' is named twice with different users or ports"),
    ("gpu*", "without an inventory, patterns match nothing"),
])
def test_unsafe_or_malformed_targets_are_refused(target, says):
    with pytest.raises(TargetError) as e:
        local_inventory().select([target])
    assert says in str(e.value) and "\n" not in str(e.value).replace("\\n", "")


def test_with_an_inventory_a_bare_name_must_be_in_it_but_user_or_port_reach_past_it(tmp_path):
    (tmp_path / "hosts").write_text("[gpu]\ngpu01 ansible_host=10.0.0.1 report_dir=/scratch\n")
    inv = load([tmp_path / "hosts"])
    with pytest.raises(TargetError, match=r"'gpu0l' is not a host or group .*did you mean 'gpu01'"):
        inv.select(["gpu0l"])
    with pytest.raises(TargetError, match=r"'elsewhere' is not a host .*user@elsewhere"):
        inv.select(["elsewhere"])
    assert shown(inv.select(["alice@elsewhere"])) == [("elsewhere", "elsewhere", None, "alice", "ssh")]
    # An inventory host named with a user keeps its variables (address, groups) and takes the user.
    [gpu01] = inv.select(["alice@gpu01:2200"])
    assert (gpu01.address, gpu01.user, gpu01.port, gpu01.groups) == ("10.0.0.1", "alice", 2200, ("gpu",))
    assert gpu01.vars["report_dir"] == "/scratch"


# --- against real sshd hosts ---

def no_inventory(cluster, **extra) -> dict[str, str]:
    """fleet with the cluster's ssh_config (key, known_hosts) and no inventory at all."""
    return {"FLEET_SSH_CONFIG": str(cluster.ssh_config), **extra}


def test_user_at_address_port_runs_with_no_inventory(cluster):
    h = cluster.hosts[0]
    out = run_fleet("exec", "--json", f"{cluster.user}@{h.address}:{h.port}", "--", "id", "-un", env=no_inventory(cluster))
    assert out.returncode == 0, out.stderr
    [line] = fleet_json_lines(out.stdout)
    assert line["host"] == h.address and line["stdout"].strip() == cluster.user


def test_the_targets_user_wins_over_ssh_config(cluster):
    # ssh_config says User fleetci, which the sshd accepts: the target's user must be the one tried.
    h = cluster.hosts[0]
    wrong_user = run_fleet("exec", f"nosuchuser@{h.address}:{h.port}", "true", env=no_inventory(cluster))
    assert wrong_user.returncode == 3 and "refused our keys" in wrong_user.stderr, wrong_user.stderr


def test_an_ssh_config_alias_is_used_as_is(cluster, tmp_path):
    h = cluster.hosts[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu-alias\n  HostName {h.address}\n  Port {h.port}\n\n" + cluster.ssh_config.read_text())
    out = run_fleet("exec", "--json", "gpu-alias,local", "--", "sh", "-c", "echo $SSH_CONNECTION",
                    env={"FLEET_SSH_CONFIG": str(config)})
    assert out.returncode == 0, out.stderr
    by_host = {line["host"]: line for line in fleet_json_lines(out.stdout)}
    assert set(by_host) == {"gpu-alias", local_inventory().select(["local"])[0].name}
    # SSH_CONNECTION: client address, port, server address, port: the sshd behind the alias.
    assert by_host["gpu-alias"]["stdout"].split()[2:] == [h.address, str(h.port)]
    # Without the alias, the same name is unknown to DNS: the alias was what reached it.
    unknown = run_fleet("exec", "gpu-alias", "true", env=no_inventory(cluster))
    assert unknown.returncode == 3


def test_an_unsafe_ad_hoc_name_is_one_line_and_exit_2(cluster):
    out = run_fleet("exec", f"{cluster.user}@../../etc:{cluster.hosts[0].port}", "true", env=no_inventory(cluster))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "cannot name a folder or file" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_with_an_inventory_a_typo_is_did_you_mean_and_user_at_host_still_runs(cluster):
    typo = run_fleet("exec", "h0l", "true", env=cluster.env())
    assert typo.returncode == 2 and "'h0l' is not a host or group" in typo.stderr and "did you mean 'h0" in typo.stderr
    h = cluster.hosts[2]
    both = run_fleet("exec", "--json", f"h01,{cluster.user}@{h.address}:{h.port}",
                     "--", "true", env=cluster.env())
    assert both.returncode == 0, both.stderr
    assert {line["host"] for line in fleet_json_lines(both.stdout)} == {"h01", h.address}
