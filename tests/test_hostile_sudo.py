"""Root reached through sudo sets only what the node's root-owned config lists.

The sudo path used to set any sysctl the caller listed: the caller's list was its only
allow-list. Now the agent, as root through `sudo -n`, sets only the ``owned_sysctls`` of the
node's root-owned config (/etc/fleet/node.json; here a per-run file the sudoers rule of this run
lets through as FLEET_NODE_CONFIG), and a missing or unsafe config means it sets none, saying why.

Real sshd hosts and the machine's real sudo (tests/harness/lab.py's lab: on h01 fleet logs in as
an ordinary user whose sudoers rule runs the node's python3 as root).
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess

import pytest

from fleet.agent import bundle, wire
from tests.conftest import fleet_json
from tests.harness.lab import fleet, held_entries
from tests.harness.procs import TENANT_USER
from tests.harness.sysctl import NODE_PATH

pytestmark = pytest.mark.usefixtures("clean_gpus")  # the lab servers (tests/harness/lab.py), started for this module

LISTED = {"owned_sysctls": {"kernel.perf_event_paranoid": 2}}


@pytest.fixture
def node_config(lab):
    """The lab's node config, put back as it was (root's, 0644, listing the sysctl) after the test."""
    path = lab["node_config"]
    yield path
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(json.dumps(LISTED))
    path.chmod(0o644)
    os.chown(path, 0, 0)


def profile_h01(lab) -> tuple[dict, str]:
    out = fleet(lab, "--hosts", "h01", "--json", "--", "cat", NODE_PATH)
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    return run, out.stderr.splitlines()[0]


def test_a_sysctl_the_nodes_config_does_not_list_is_not_set_whatever_the_inventory_says(lab, node_config):
    node_config.write_text(json.dumps({"owned_sysctls": {"vm.swappiness": 10}}))
    run, seen = profile_h01(lab)
    assert run["plan"]["sysctls"] == {"kernel.perf_event_paranoid": 2}  # the inventory asked for it
    assert seen == "3" and held_entries(lab) == {}  # root through sudo did not set it
    [given_up] = [g for g in run["result"]["given_up"] if "kernel.perf_event_paranoid" in g]
    assert ("kernel.perf_event_paranoid=2 is not among the owned_sysctls of the node's root-owned config"
            in given_up), given_up
    assert "could not put" not in json.dumps(run["result"])  # nothing was changed, so nothing to put back


@pytest.mark.parametrize("unsafe", ["missing", "group-writable", "another-accounts", "a-link", "not-json", "too-deep"])
def test_a_missing_or_unsafe_node_config_sets_nothing_and_says_why(lab, node_config, tmp_path, unsafe):
    if unsafe == "missing":
        node_config.unlink()
        why = f"the node's config {node_config} cannot be read (No such file or directory)"
    elif unsafe == "group-writable":
        node_config.chmod(0o664)
        why = "is not a regular file of root's that only root can write"
    elif unsafe == "another-accounts":
        tenant = pwd.getpwnam(TENANT_USER)
        os.chown(node_config, tenant.pw_uid, tenant.pw_gid)
        why = "is not a regular file of root's that only root can write"
    elif unsafe == "a-link":
        target = lab["c"].dir / "elsewhere.json"
        target.write_text(json.dumps(LISTED))
        target.chmod(0o644)
        node_config.unlink()
        node_config.symlink_to(target)
        why = f"the node's config {node_config} cannot be read (Too many levels of symbolic links)"
    elif unsafe == "not-json":
        node_config.write_text("owned_sysctls: {kernel.perf_event_paranoid: 2}\n")
        why = "is not a JSON object whose owned_sysctls maps names to values"
    else:  # 400,000 deep: past Python's stack, a RecursionError where a depth is not bounded
        node_config.write_text("[" * 400_000 + "]" * 400_000)
        why = "is not a JSON object whose owned_sysctls maps names to values"
    run, seen = profile_h01(lab)
    assert seen == "3" and held_entries(lab) == {}
    [given_up] = [g for g in run["result"]["given_up"] if "kernel.perf_event_paranoid" in g]
    assert "no sysctl is set as root through sudo" in given_up and why in given_up, given_up
    assert "\n" not in given_up


def test_a_caller_of_the_sudo_step_cannot_widen_what_root_sets(lab):
    """The account fleet logs in as runs the agent's root step itself, listing the sysctl and the
    value it wants as "owned": root sets nothing the node's config does not list."""
    user = lab["c"].user
    args = {"mode": "owned", "op": "acquire_sysctls", "wanted": {"kernel.perf_event_paranoid": 1},
            "owned": {"kernel.perf_event_paranoid": 1}, "holder": {"pid": os.getpid(), "start": None}}
    env = {"PATH": "/usr/bin:/bin", "FLEET_NODE_CONFIG": str(lab["node_config"]),
           "FLEET_STATE_DIR": str(lab["state"])}
    pw = pwd.getpwnam(user)  # as a session of the lab's would: in its namespace, the account's alone
    as_user = [*lab["paranoid"].prefix, "-S", str(pw.pw_uid), "-G", str(pw.pw_gid)]
    out = subprocess.run([*as_user, "sudo", "-n", "/usr/bin/python3", "-c", bundle.BOOTSTRAP, json.dumps(args)],
                         input=bundle.bundle(), env=env, cwd="/", capture_output=True, timeout=60)
    doc = wire.read(out.stdout.decode(), "repair")
    assert out.returncode == 1 and doc.get("nothing_changed") is True, (out.stdout, out.stderr)
    assert "kernel.perf_event_paranoid=1 is not among the owned_sysctls" in doc["error"], doc
    assert lab["paranoid"].read() == "3" and held_entries(lab) == {}
