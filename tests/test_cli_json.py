"""--json on every command, in one envelope: {"fleet_json": 1, "command": ..., "data": ...}."""

from __future__ import annotations

import click

from fleet.cli.main import main
from tests.conftest import fleet_json, fleet_json_lines, run_fleet

# Run by slurmd and by the schedule itself, never by a person: their output goes to logs.
NOT_FOR_PEOPLE = {"slurm prolog", "slurm epilog", "slurm task-prolog", "schedule fire"}


def leaf_commands(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    found = {}
    for name in group.list_commands(None):  # fleet's top group loads its commands on demand
        command = group.get_command(None, name)
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(leaf_commands(command, path + " "))
        else:
            found[path] = command
    return found


def test_every_command_takes_json():
    leaves = leaf_commands(main)
    assert len(leaves) > 20 and NOT_FOR_PEOPLE <= set(leaves)  # the walk found the tree, exemptions are real
    without = [path for path, command in leaves.items() if path not in NOT_FOR_PEOPLE and
               not any(isinstance(p, click.Option) and "--json" in p.opts for p in command.params)]
    assert without == []


def test_the_envelope_of_a_document_names_its_command(tmp_path):
    listed = run_fleet("inventory", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert [h["name"] for h in fleet_json(listed.stdout, "inventory list")["hosts"]]
    checked = fleet_json(run_fleet("inventory", "check", "--json").stdout, "inventory check")
    assert checked["hosts"] == 1 and checked["sources"] == ["(this machine)"]
    reindexed = run_fleet("reports", "reindex", "--json", "--store", str(tmp_path))
    assert fleet_json(reindexed.stdout, "reports reindex") == {"runs": 0, "left_out": []}
    assert fleet_json(run_fleet("reports", "ls", "--json", "--store", str(tmp_path)).stdout, "reports ls") == []


def test_slurm_install_describes_its_files_as_json():
    out = run_fleet("slurm", "install", "--json", "--prefix", "/etc/fleet-test")
    assert out.returncode == 0, out.stderr
    doc = fleet_json(out.stdout, "slurm install")
    assert "Prolog=" in doc["slurm_conf"] and doc["written"] == []  # printed, not applied
    assert all(path.startswith("/etc/fleet-test/") for path in doc["files"])


def test_exec_streams_one_envelope_per_host():
    out = run_fleet("exec", "--json", "local", "sh", "-c", "echo hi; exit 3")
    assert out.returncode == 3
    [host] = fleet_json_lines(out.stdout, "exec")
    assert host["stdout"] == "hi\n" and host["exit_status"] == 3


def test_a_dry_run_profile_is_one_document(tmp_path):
    out = run_fleet("profile", "--group", "local", "--dry-run", "--json", "--store", str(tmp_path), "true")
    doc = fleet_json(out.stdout, "profile")
    assert doc["status"] == "dry-run" and doc["request"]["command"] == ["true"]
