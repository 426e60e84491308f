"""fleet reads Ansible sites as Ansible does: every fixture under tests/fixtures/inventories is
listed by the real ``ansible-inventory --list`` (ansible-core, a test dependency only), and
fleet must find the same hosts, the same groups and every merged variable the same.

The same comparison is made again on the JSON ansible-inventory writes (with and without
``--export``), read by fleet as a file and by Ansible through its script plugin.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.inventory import load
from fleet.inventory.variables import ANSIBLE_VARIABLES, VARIABLES
from tests.harness.ansible_oracle import asked_once

FIXTURES = Path(__file__).parent / "fixtures" / "inventories"
CORPUS = sorted(p.name for p in FIXTURES.iterdir() if p.is_dir())
# The oracle: ansible-core is in the test extra, so its absence is a broken install, not a skip.
ANSIBLE_INVENTORY = Path(sys.executable).parent / "ansible-inventory"


def ansible_list(source: Path, workdir: Path, *options: str) -> dict:
    """What ``ansible-inventory -i SOURCE --list`` writes, run where no ansible.cfg, group_vars or
    host_vars could be found but the inventory's own; asked once a session for a source with the
    same contents (tests/harness/ansible_oracle.py)."""
    def ask() -> str:
        home = workdir / "home"
        home.mkdir(exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ANSIBLE_HOME": str(home),
               "ANSIBLE_CONFIG": str(home / "none.cfg"), "ANSIBLE_LOCAL_TEMP": str(home),
               "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true", "ANSIBLE_NOCOLOR": "1", "LC_ALL": "C.UTF-8"}
        out = subprocess.run([str(ANSIBLE_INVENTORY), "-i", str(source), "--list", *options], cwd=home, env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    return json.loads(asked_once(ANSIBLE_INVENTORY, source, ("--list", *options), ask))


def members(listing: dict) -> dict[str, set[str]]:
    """Every group of a listing with every host in it, its children's included."""
    groups = {g: body for g, body in listing.items() if g != "_meta"}

    def of(g: str) -> set[str]:
        body = groups.get(g, {})
        return set(body.get("hosts", [])).union(*(of(c) for c in body.get("children", [])))

    return {g: of(g) for g in groups}


def assert_same(inventory, listing: dict) -> None:
    expected_groups = members(listing)
    hostvars = listing["_meta"]["hostvars"]
    assert set(inventory.hosts) == expected_groups["all"]
    for name, host in inventory.hosts.items():  # every merged variable, and its type (JSON's view)
        assert json.loads(json.dumps(host.all_vars)) == hostvars.get(name, {}), name
    fleet_groups = {g: set(m) for g, m in inventory.groups.items() if m}
    assert fleet_groups == {g: m for g, m in expected_groups.items() if m}


def as_script(listing: dict, where: Path) -> Path:
    """An inventory script that writes ``listing``: how Ansible itself reads such JSON. In a folder
    of its own, naming the data beside it: the same listing is the same source wherever it is."""
    folder = where / "script"
    folder.mkdir()
    (folder / "listing.json").write_text(json.dumps(listing))
    script = folder / "listing.sh"
    script.write_text('#!/bin/sh\ncat "$(dirname "$0")/listing.json"\n')
    script.chmod(0o755)
    return script


@pytest.mark.parametrize("fixture", CORPUS)
def test_fleet_reads_each_fixture_as_ansible_inventory_does(fixture, tmp_path):
    source = FIXTURES / fixture
    assert_same(load([source]), ansible_list(source, tmp_path))


@pytest.mark.parametrize("export", [False, True], ids=["list", "list-export"])
@pytest.mark.parametrize("fixture", CORPUS)
def test_the_json_ansible_inventory_writes_is_read_as_ansible_reads_it(fixture, export, tmp_path):
    options = ("--export",) if export else ()
    listing = ansible_list(FIXTURES / fixture, tmp_path, *options)
    site = tmp_path / "site"
    site.mkdir()
    (site / "inventory.json").write_text(json.dumps(listing, indent=4))
    assert_same(load([site / "inventory.json"]), ansible_list(as_script(listing, tmp_path), tmp_path))


def test_the_oracle_is_asked_again_when_the_source_changes(tmp_path):
    """An answer kept for the session is never one of another source: a changed file, or a change
    in the vars directories beside it, is asked anew."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "hosts").write_text("[gpu]\ng1\n")
    assert set(ansible_list(site / "hosts", tmp_path)["_meta"]["hostvars"]) <= {"g1"}
    (site / "hosts").write_text("[gpu]\ng1\ng2 port=2\n")
    assert ansible_list(site / "hosts", tmp_path)["_meta"]["hostvars"]["g2"] == {"port": 2}
    (site / "host_vars").mkdir()
    (site / "host_vars" / "g1.yml").write_text("report_dir: /data/g1\n")
    assert ansible_list(site / "hosts", tmp_path)["_meta"]["hostvars"]["g1"] == {"report_dir": "/data/g1"}


def test_a_file_given_alone_has_the_vars_directories_beside_it(tmp_path):
    source = FIXTURES / "ini_site" / "hosts"
    inv = load([source])
    assert_same(inv, ansible_list(source, tmp_path))
    assert len(inv.hosts) == 5 and inv.hosts["gx-07"].vars["report_dir"] == "/data/gx-07"


def test_several_sources_merge_in_order_as_ansible_does(tmp_path):
    sources = [FIXTURES / "ini_site" / "hosts", FIXTURES / "precedence"]
    out = subprocess.run([str(ANSIBLE_INVENTORY), *sum((["-i", str(s)] for s in sources), []), "--list"],
                         cwd=tmp_path, capture_output=True, text=True, env={**os.environ, "HOME": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert_same(load(sources), json.loads(out.stdout))


def test_ansibles_own_connection_and_become_variables_are_not_taken_for_typos():
    """Every ``ansible_*`` variable ansible-core's ssh, paramiko, local, sudo, su and sh plugins read
    is either one of fleet's or in its list of Ansible's; none is refused as a misspelling."""
    root = ANSIBLE_INVENTORY.parent.parent / "lib"
    package = next(root.glob("python3*/site-packages/ansible"))
    names = set()
    for plugin in ["connection/ssh.py", "connection/paramiko_ssh.py", "connection/local.py",
                   "become/sudo.py", "become/su.py", "shell/sh.py"]:
        text = (package / "plugins" / plugin).read_text()
        names |= set(re.findall(r"- name: (ansible_\w+)", text))
    assert len(names) > 20
    assert names - set(VARIABLES) - ANSIBLE_VARIABLES == set()


def test_the_lab_site_of_the_issue_is_found_whole(tmp_path):
    site = tmp_path / "site"
    shutil.copytree(FIXTURES / "ini_site", site)
    from tests.conftest import fleet_json, run_fleet

    out = run_fleet("-i", str(site), "inventory", "list", "--json")
    assert out.returncode == 0, out.stderr
    doc = fleet_json(out.stdout)
    assert [h["name"] for h in doc["hosts"]] == ["gx-01", "gx-02", "gx-03", "gx-07", "login1"]
    gx01 = doc["hosts"][0]  # group_vars/all.yml beats the inline [gpu:vars], as in Ansible
    assert gx01["port"] == 2201 and gx01["user"] == "profiler" and gx01["vars"]["report_dir"] == "/var/tmp/all"
