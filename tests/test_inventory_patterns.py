"""Host patterns mean what they mean in Ansible: for each pattern, fleet picks the hosts the real
``ansible PATTERN --list-hosts`` (ansible-core, the test's oracle; read for all of a site's
patterns in one process, as that command reads one, and held to the command on a few) lists, in
the same order; or, where Ansible picks none, fleet refuses in one line. Where fleet's own range
reading of the same words would name other hosts, fleet refuses, and its message names Ansible's
reading.

Two sites: the YAML example of docs/inventory.md (read from the doc itself) and an INI site with
nested groups, a rack, a fabric, hosts that are down, letters and domain names.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.inventory import TargetError, load
from tests.conftest import REPO, run_fleet
from tests.harness.ansible_oracle import asked_once

ANSIBLE = Path(sys.executable).parent / "ansible"

INI_SITE = """\
bastion1
[gpu_h100]
gpu[01:04]
[gpu_a100]
gpu[05:06]
[gpu:children]
gpu_h100
gpu_a100
[cpu]
cpu[01:03]
[rack7]
gpu02
gpu05
cpu01
[ib-fabric]
gpu[01:02]
gpu05
cpu03
[down]
gpu03
[nodes]
node-[a:e]
[lab]
lab[10:14]
[dns]
gpu[01:03].lab
[empty]
"""

INI_PATTERNS = [
    # unions, intersections, exclusions, in Ansible's order of evaluation
    "all", "gpu", "gpu:cpu", "gpu,cpu", "cpu:gpu_h100:&ib-fabric", "gpu:&rack7", "gpu:&rack7:!down",
    "gpu:!down", "!down", "all:!ungrouped", "rack7:&ib-fabric", "gpu*:!gpu_h100:&rack7", "&rack7",
    "!gpu:!cpu", "rack7,!cpu01", "gpu:&empty", "empty", "ungrouped", "cpu01:gpu01", "gpu01,cpu01",
    "!rack7:gpu_a100",
    # globs and regular expressions, on groups and hosts
    "gpu_*", "node-?", "node-[abc]", "gpu0[135]", "gpu0[!1-4]", "*.lab", "gpu01.lab", "g*:!dns",
    "~gpu0[1-3]", "~^node-[a-c]$", "~.*0[12]$", "~(cpu|lab)1",
    # subscripts, by position in Ansible's order of the group
    "gpu[0:3]", "gpu[-1]", "gpu_h100[0]", "lab[10:]", "lab[1:]", "lab[0]", "cpu[2]", "gpu[2:]",
    "gpu*[1]", "all[3:5]",
    # words that fleet's ranges would read otherwise
    "gpu[01:03].lab", "node-[a:c]", "gpu[01:04]", "gpu[01-02]", "g*:!gpu0[1-4]", "cpu[01:02]",
]

SITE_PATTERNS = ["dgx[01:03]", "dgx[01:08:2]", "dgx[0]", "dgx[-1]", "dgx", "lab", "lab:dgx", "dgx:&lab",
                 "lab-h100-*", "lab-h100-[1:2]", "~dgx0[1-3]", "dgx[1:]", "all[2:4]", "dgx:!dgx0[1-4]",
                 "lab[0]", "!dgx"]


def doc_site(where: Path) -> Path:
    """The YAML example of docs/inventory.md, as the doc shows it."""
    text = (REPO / "docs" / "inventory.md").read_text()
    example = re.search(r"The same\s+in YAML:\n\n```yaml\n(.*?)```", text, re.S)[1]
    path = where / "site.yml"
    path.write_text(example)
    return path


def ini_site(where: Path) -> Path:
    path = where / "hosts"
    path.write_text(INI_SITE)
    return path


# ansible-core's own reading of a site's patterns, one process for them all: what `ansible PATTERN
# --list-hosts` does for one (its AdHocCLI: an InventoryManager of the source, then list_hosts(PATTERN),
# each host printed by name), where the command took one process, about a second of CPU, a pattern.
# The test holds this reading to the command itself on a few patterns (CLI_CHECKED).
LIST_HOSTS = """
import json, sys
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
inventory = InventoryManager(loader=DataLoader(), sources=[sys.argv[1]])
print(json.dumps({p: [str(h) for h in inventory.list_hosts(p)] for p in json.loads(sys.argv[2])}))
"""
CLI_CHECKED = {"ini": ["gpu*:!gpu_h100:&rack7", "gpu[-1]", "empty"], "doc": ["dgx[01:03]", "lab:dgx"]}


def ansible_env(home: Path) -> dict:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ANSIBLE_HOME": str(home),
            "ANSIBLE_CONFIG": str(home / "none.cfg"), "ANSIBLE_LOCAL_TEMP": str(home), "LC_ALL": "C.UTF-8"}


def ansible_lists(source: Path, patterns: list[str], home: Path) -> dict[str, list[str]]:
    """The hosts ansible-core lists for each pattern, in its order (asked once a session for a source
    with the same contents: tests/harness/ansible_oracle.py)."""
    def ask() -> str:
        out = subprocess.run([sys.executable, "-c", LIST_HOSTS, str(source), json.dumps(patterns)], cwd=home,
                             env=ansible_env(home), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return out.stdout

    return json.loads(asked_once(ANSIBLE, source, ("list_hosts", *patterns), ask))


def ansible_cli_hosts(source: Path, pattern: str, home: Path) -> list[str]:
    """What the command ``ansible -i SOURCE PATTERN --list-hosts`` itself lists, in its order."""
    out = subprocess.run([str(ANSIBLE), "-i", str(source), pattern, "--list-hosts"], cwd=home, env=ansible_env(home),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines and re.fullmatch(r"\s*hosts \(\d+\):", lines[0]), out.stdout
    return [line.strip() for line in lines[1:] if line.strip()]


def fleet_hosts(inventory, pattern: str) -> list[str] | TargetError:
    try:
        return [h.name for h in inventory.select([pattern])]
    except TargetError as e:
        return e


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("ansible-home")


@pytest.mark.parametrize("site,patterns", [("ini", INI_PATTERNS), ("doc", SITE_PATTERNS)])
def test_fleet_picks_the_hosts_ansible_lists_for_every_pattern(site, patterns, home, tmp_path):
    source = ini_site(tmp_path) if site == "ini" else doc_site(tmp_path)
    inventory = load([source])
    listed = ansible_lists(source, patterns, home)
    for pattern in CLI_CHECKED[site]:  # the one process's reading is the command's
        assert listed[pattern] == ansible_cli_hosts(source, pattern, home), pattern
    agreed, refused = [], []
    for pattern in patterns:
        expected, got = listed[pattern], fleet_hosts(inventory, pattern)
        if isinstance(got, TargetError):
            # fleet refuses only what Ansible reads as no host, or reads as other hosts than fleet's range
            two_ways = "reads two ways" in str(got)
            assert not expected or two_ways, (pattern, expected, str(got))
            if two_ways:  # the message names the words read two ways, and what Ansible picks with them
                words = re.match(r"'(.*?)' reads two ways", str(got))[1]
                assert words in pattern
                ansible = ansible_lists(source, [words], home)[words]
                shown = "no host" if not ansible else ", ".join(ansible[:6])
                assert f"as Ansible's pattern it picks {shown}" in str(got), (pattern, ansible, str(got))
            refused.append(pattern)
        else:
            assert got == expected, pattern
            agreed.append(pattern)
    assert len(agreed) >= len(patterns) * 2 // 3, refused  # most patterns select, and select the same


def test_the_documented_collision_names_both_readings(tmp_path):
    """``dgx[01:03]`` on the documented example: dgx02-dgx04 to Ansible, dgx01-dgx03 as a range."""
    out = run_fleet("-i", str(doc_site(tmp_path)), "inventory", "list", "dgx[01:03]")
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert ("as Ansible's pattern it picks dgx02, dgx03, dgx04; as a range of names it is dgx01, dgx02, dgx03"
            in out.stderr), out.stderr
    # both unambiguous spellings work: the names, and Ansible's subscript where no host is named by it
    names = run_fleet("-i", str(doc_site(tmp_path)), "inventory", "list", "dgx01,dgx02,dgx03", "--json")
    assert names.returncode == 0 and names.stdout.count('"name": "dgx0') == 3, names.stderr


def test_exclusion_and_intersection_serve_dash_x_and_combine_with_connect_targets(tmp_path):
    inventory = load([ini_site(tmp_path)])
    names = lambda *a: [h.name for h in inventory.select(*a)]
    assert names(["gpu"], ["rack7:&ib-fabric"]) == ["gpu01", "gpu03", "gpu04", "gpu06"]
    assert names(["gpu_a100,alice@10.0.0.9"], ["gpu0*"]) == ["10.0.0.9"]
    mixed = inventory.select(["gpu_h100,&rack7,alice@gpu01:2201"])
    assert [(h.name, h.user, h.port) for h in mixed] == [("gpu01", "alice", 2201), ("gpu02", None, None)]
    with pytest.raises(TargetError, match="'gpu7' is not a host or group .*did you mean"):
        inventory.select(["gpu:&gpu7"])
