"""Inventories: Ansible's format read unchanged, ranges, merged variables, errors with file and line."""

from __future__ import annotations

import textwrap

import pytest

from fleet.hostlist import HostPatternError, expand, fold, split_patterns
from fleet.inventory import InventoryError, TargetError, load
from tests.conftest import fleet_json, run_fleet

NESTED = """\
all:
  vars:
    ansible_user: profiler
    report_dir: /scratch/all
  hosts:
    login:
      ansible_host: 10.9.0.1
  children:
    lab:
      vars:
        report_dir: /scratch/lab
        owned_sysctls:
          kernel.perf_event_paranoid: 2
      children:
        lab_h100:
          hosts:
            h100-[1:3]:
          vars:
            report_dir: /scratch/h100
            nsys_path: /opt/nsys
        lab_a100:
          hosts:
            a100-x:
              ansible_port: 2200
              report_dir: /data/a100-x
    dgx:
      hosts:
        dgx[01:07:3]:
        dgx[10-11]:
      vars:
        ansible_user: dgxuser
"""


def write(tmp_path, text, name="inv.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("pattern,expected", [
    ("gpu[01:04]", ["gpu01", "gpu02", "gpu03", "gpu04"]),
    ("gpu[01:16:5]", ["gpu01", "gpu06", "gpu11", "gpu16"]),
    ("node[a:d]", ["nodea", "nodeb", "nodec", "noded"]),
    ("gpu[8:11]", ["gpu8", "gpu9", "gpu10", "gpu11"]),
    ("gpu[01-03,07]", ["gpu01", "gpu02", "gpu03", "gpu07"]),
    ("r[1-2]n[1:2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("plain.example.org", ["plain.example.org"]),
])
def test_ranges_expand(pattern, expected):
    assert expand(pattern) == expected


@pytest.mark.parametrize("pattern,why", [
    ("gpu[05:01]", "backwards"), ("gpu[1:2:0]", "stride"), ("gpu[1:x]", "numbers or single letters"),
    ("gpu[]", "empty"), ("gpu[1-2", "unbalanced"), ("gpu1]", "unbalanced"), ("gpu[1-a]", "N-M"),
])
def test_bad_ranges_say_why(pattern, why):
    with pytest.raises(HostPatternError, match=why):
        expand(pattern)


def test_fold_is_the_inverse_of_expand():
    names = expand("gpu[01-16]") + expand("n[1-3]") + ["login"]
    assert fold(names) == "gpu[01-16],login,n[1-3]"
    assert fold(["gpu01", "gpu03", "gpu04"]) == "gpu[01,03-04]"
    assert split_patterns("a,gpu[1-3,7],b") == ["a", "gpu[1-3,7]", "b"]


def test_nested_groups_merge_variables_by_depth(tmp_path):
    inv = load([write(tmp_path, NESTED)])
    assert list(inv.hosts) == ["login", "h100-1", "h100-2", "h100-3", "a100-x",
                               "dgx01", "dgx04", "dgx07", "dgx10", "dgx11"]
    h = inv.hosts["h100-2"]
    assert h.vars["report_dir"] == "/scratch/h100"          # child group beats parent group
    assert h.vars["owned_sysctls"] == {"kernel.perf_event_paranoid": 2}  # inherited from lab
    assert h.user == "profiler" and h.address == "h100-2" and set(h.groups) == {"lab", "lab_h100"}
    a = inv.hosts["a100-x"]
    assert a.vars["report_dir"] == "/data/a100-x" and a.port == 2200  # host beats groups
    assert inv.hosts["dgx04"].user == "dgxuser"
    assert inv.hosts["login"].address == "10.9.0.1" and inv.hosts["login"].vars["report_dir"] == "/scratch/all"
    assert inv.groups["lab"] == ["h100-1", "h100-2", "h100-3", "a100-x"]


def test_targets_groups_ranges_globs_and_exclusion(tmp_path):
    inv = load([write(tmp_path, NESTED)])
    names = lambda *a, **k: [h.name for h in inv.select(*a, **k)]
    assert names(["lab"], ["h100-2"]) == ["h100-1", "h100-3", "a100-x"]
    assert names(["dgx0*,login"]) == ["dgx01", "dgx04", "dgx07", "login"]
    assert names(["dgx*"], ["dgx1?"]) == ["dgx01", "dgx04", "dgx07"]
    assert names(["dgx[1:2]"]) == ["dgx04", "dgx07"]  # Ansible's subscript: no host is named dgx1, dgx2
    assert len(names([])) == 10
    with pytest.raises(TargetError, match="'dgx02' is not a host or group"):
        inv.select(["dgx02"])
    # fleet's ranges where Ansible reads other hosts: refused, naming both readings
    for words, ansible in [("dgx[01,04]", "no host"), ("dgx[01-02]", "dgx04, dgx07")]:
        with pytest.raises(TargetError, match=rf"reads two ways: as Ansible's pattern it picks {ansible}; "
                                              "as a range of names it is dgx0"):
            inv.select([words])
    with pytest.raises(TargetError, match="did you mean 'lab'"):
        inv.select(["lba"])


def test_cli_lists_exactly_the_expected_hosts_as_json(tmp_path):
    inv = write(tmp_path, NESTED)
    out = run_fleet("-i", str(inv), "inventory", "list", "lab_h100,dgx", "-x", "dgx1?", "--json")
    assert out.returncode == 0, out.stderr
    doc = fleet_json(out.stdout)
    assert [h["name"] for h in doc["hosts"]] == ["h100-1", "h100-2", "h100-3", "dgx01", "dgx04", "dgx07"]
    h = doc["hosts"][0]
    assert h["vars"] == {"ansible_user": "profiler", "report_dir": "/scratch/h100", "nsys_path": "/opt/nsys",
                         "owned_sysctls": {"kernel.perf_event_paranoid": 2}}
    assert doc["groups"]["dgx"] == ["dgx01", "dgx04", "dgx07"]


def test_a_directory_of_files_is_one_inventory(tmp_path):
    write(tmp_path, "all:\n  children:\n    gpu:\n      hosts:\n        g1:\n", "a.yaml")
    write(tmp_path, "gpu:\n  hosts:\n    g2:\n  vars:\n    report_dir: /r\n", "b.yml")
    inv = load([tmp_path])
    assert inv.groups["gpu"] == ["g1", "g2"] and inv.hosts["g1"].vars["report_dir"] == "/r"


BAD = [
    ("typo'd group key", "all:\n  children:\n    gpu:\n      hots:\n        g1:\n",
     4, "unknown key 'hots' in group 'gpu'.*did you mean 'hosts'"),
    ("typo'd variable", "all:\n  hosts:\n    g1:\n      owned_syctls:\n        kernel.x: 1\n",
     4, "did you mean 'owned_sysctls'"),
    ("bad range", "all:\n  hosts:\n    ok1:\n    gpu[09:01]:\n", 4, "runs backwards"),
    ("cycle", "all:\n  children:\n    a:\n      children:\n        b:\n    b:\n      children:\n        a:\n",
     8, "cycle: a -> b -> a|cycle: b -> a -> b"),
    ("no address", "all:\n  hosts:\n    gpu-:\n      report_dir: /x\n", 3, "has no address"),
    ("not a name", "all:\n  hosts:\n    my gpu box:\n      report_dir: /x\n", 3, "cannot name a folder or file"),
    ("bad port", "all:\n  hosts:\n    g1:\n      ansible_port: 70000\n", 4, "port number"),
    ("password", "all:\n  vars:\n    ansible_password: hunter2\n", 3, "passwords do not belong"),
    ("bad sysctl", "all:\n  vars:\n    owned_sysctls:\n      perf: 2\n", 3, "not a sysctl name"),
    ("bad yaml", "all:\n  hosts:\n    g1: [\n", 4, "not valid YAML"),
    ("duplicate key", "all:\n  hosts:\n    g1:\n    g1:\n", 4, "given twice"),
    ("not a mapping", "- g1\n- g2\n", 1, "mapping of groups"),
    ("group body", "all:\n  children:\n    gpu: [g1]\n", 3, "must be a mapping"),
    ("connection", "all:\n  hosts:\n    g1:\n      ansible_connection: winrm\n", 4, "'ssh' or 'local'"),
]


@pytest.mark.parametrize("what,text,line,message", BAD, ids=[b[0] for b in BAD])
def test_malformed_inventory_names_file_and_line(tmp_path, what, text, line, message):
    path = write(tmp_path, text)
    with pytest.raises(InventoryError, match=message) as e:
        load([path])
    assert e.value.where == f"{path}:{line}"
    out = run_fleet("-i", str(path), "inventory", "check")  # and the command line says the same
    assert out.returncode == 2 and f"{path}:{line}:" in out.stderr and out.stdout == ""


def test_missing_inventory_file_is_an_error(tmp_path):
    out = run_fleet("-i", str(tmp_path / "nope.yaml"), "inventory", "list")
    assert out.returncode == 2 and "no such inventory" in out.stderr


def test_without_inventory_fleet_means_this_machine(tmp_path):
    out = run_fleet("inventory", "list", "--json")
    doc = fleet_json(out.stdout)
    assert len(doc["hosts"]) == 1 and doc["hosts"][0]["connection"] == "local"


BAD_INI = [
    ("unknown section type", "[gpu]\ng1\n[gpu:host]\n", 3, "unknown type 'host'"),
    ("section with a space", "[gpu a]\n", 1, "invalid section"),
    ("host word without =", "[gpu]\ng1 ansible_port\n", 2, "expected key=value"),
    ("unclosed quote", "[gpu]\ng1 x='open\n", 2, "cannot split"),
    ("vars line without =", "[gpu]\ng1\n[gpu:vars]\nreport_dir\n", 4, "expected key=value"),
    ("vars for no group", "[gpu:vars]\nx=1\n", 1, "not defined"),
    ("child never declared", "[gpu]\ng1\n[site:children]\ngpu\ngpuu\n", 5, "'gpuu', a group not declared"),
    ("bad range", "[gpu]\ng[3:1]\n", 2, "runs backwards"),
    ("port with nothing after", "[gpu]\ng1:\n", 2, "ends in ':'"),
    ("typo'd variable", "[gpu]\ng1\n[gpu:vars]\nowned_syctls={}\n", 4, "did you mean 'owned_sysctls'"),
    ("bad port inline", "[gpu]\ng1 ansible_ssh_port=70000\n", 2, "ansible_ssh_port: a port number"),
    ("string for a flag", "[gpu]\ng1 remove_gathered_reports=true\n", 2, "write True or False"),
    ("template", "[all:vars]\nansible_python_interpreter=\"{{ ansible_playbook_python }}\"\n", 2,
     "does not evaluate Jinja templates"),
    ("password", "[gpu]\ng1 ansible_become_password=x\n", 2, "passwords do not belong"),
    ("yaml in ini", "[gpu]\n---\n", 2, "YAML"),
    ("cycle", "[a:children]\nb\n[b:children]\na\n", 4, "cycle"),
    ("group priority", "[gpu]\ng1\n[gpu:vars]\nansible_group_priority=high\n", 4, "whole number"),
    ("path in host name", "[gpu]\n../etc ansible_host=10.0.0.1\n", 2, "cannot name a folder or file"),
]


@pytest.mark.parametrize("what,text,line,message", BAD_INI, ids=[b[0] for b in BAD_INI])
def test_malformed_ini_inventory_names_file_and_line(tmp_path, what, text, line, message):
    path = write(tmp_path, text, "hosts")
    with pytest.raises(InventoryError, match=message) as e:
        load([path])
    assert e.value.where == f"{path}:{line}"
    out = run_fleet("-i", str(path), "inventory", "check")
    assert out.returncode == 2 and f"{path}:{line}:" in out.stderr and "Traceback" not in out.stderr


VAULTED = """\
all:
  hosts:
    g1:
      secret: !vault |
        $ANSIBLE_VAULT;1.1;AES256
        3132
"""


@pytest.mark.parametrize("name,text,line,message", [
    ("inv.yml", VAULTED, 4, "vault-encrypted value"),
    ("inv.yml", "$ANSIBLE_VAULT;1.1;AES256\n6162\n", 1, "vault-encrypted file"),
    ("hosts", "$ANSIBLE_VAULT;1.1;AES256\n6162\n", 1, "vault-encrypted file"),
    ("inv.yml", "plugin: amazon.aws.aws_ec2\nregions: [x]\n", 1, "inventory plugin 'amazon.aws.aws_ec2'"),
    ("hosts", "#!/usr/bin/env python3\nprint('{}')\n", 1, "inventory script"),
    ("inv.json", '{"_meta": {"hostvars": {"g1": {"s": {"__ansible_vault": "$ANSIBLE_VAULT..."}}}},\n'
                 ' "all": {"hosts": ["g1"]}}\n', 1, "vault-encrypted value"),
    ("inv.json", '{"_meta": {"hostvars": {}},\n "gpu": {"hosts": "g1"}}\n', 2, "'hosts' of group 'gpu' must be a list"),
], ids=["!vault", "vaulted yaml file", "vaulted ini file", "plugin config", "script", "vault in a listing",
        "listing hosts"])
def test_what_fleet_leaves_out_is_refused_naming_file_and_line(tmp_path, name, text, line, message):
    path = write(tmp_path, text, name)
    with pytest.raises(InventoryError, match=message) as e:
        load([path])
    assert e.value.where == f"{path}:{line}"


def test_errors_in_vars_files_name_that_file_and_line(tmp_path):
    write(tmp_path, "[gpu]\ng1\n", "hosts")
    (tmp_path / "group_vars" / "gpu").mkdir(parents=True)
    bad = write(tmp_path, "report_dir: /r\nansible_port: ssh\n", "group_vars/gpu/20-ports.yml")
    with pytest.raises(InventoryError, match="ansible_port: a port number") as e:
        load([tmp_path])
    assert e.value.where == f"{bad}:2"
    bad.write_text("- a list\n")
    with pytest.raises(InventoryError, match="a vars file is a mapping") as e:
        load([tmp_path])
    assert e.value.where == f"{bad}:1"
    bad.write_text("x: !vault |\n  $ANSIBLE_VAULT;1.1;AES256\n")
    with pytest.raises(InventoryError, match="vault") as e:
        load([tmp_path])
    assert e.value.where == f"{bad}:1"


def test_aliases_give_address_port_user_and_key_the_alias_winning_as_in_ansible(tmp_path):
    inv = load([write(tmp_path, "[gpu]\ng1 ansible_host=a ansible_ssh_host=b ansible_ssh_port='2222' "
                                "ansible_ssh_user=u ansible_private_key_file=~/.ssh/k\n", "hosts")])
    h = inv.hosts["g1"]
    assert (h.address, h.port, h.user, h.key_file) == ("b", 2222, "u", "~/.ssh/k")


def test_an_ini_file_given_directly_lists_its_hosts(tmp_path):
    path = write(tmp_path, "gx-07\n[gpu]\ngx-[01:03] ansible_port=2201\n[cluster:children]\ngpu\n", "hosts")
    out = run_fleet("-i", str(path), "inventory", "list", "cluster,ungrouped", "--json")
    assert out.returncode == 0, out.stderr
    doc = fleet_json(out.stdout)
    assert [h["name"] for h in doc["hosts"]] == ["gx-01", "gx-02", "gx-03", "gx-07"]
    assert doc["hosts"][0]["port"] == 2201 and doc["groups"]["ungrouped"] == ["gx-07"]
