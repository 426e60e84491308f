"""A site's own variables are the site's, and an inventory file that is no inventory is refused.

The site of tests/fixtures/inventories/site_roles (stackhpc.openhpc, galaxyproject.slurm,
nvidia.nvidia_driver and others, written as those roles document them) is compared with the real
``ansible-inventory`` variable by variable in tests/test_inventory_ansible.py; here: it reads with
warnings only, and fleet does not use the values that are another role's.
"""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from fleet.inventory import InventoryError, load
from tests.conftest import REPO, run_fleet

ROLES_SITE = REPO / "tests" / "fixtures" / "inventories" / "site_roles"


def test_a_site_full_of_other_roles_variables_reads_with_warnings_only():
    out = run_fleet("-i", str(ROLES_SITE), "inventory", "check")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("ok: 7 hosts") and len(lines) == 8  # how each host connects, then ok
    assert any(line.startswith("lease-b: ssh ubuntu@lease-b:22, ") for line in lines), lines
    warnings = out.stderr.splitlines()
    assert all(w.startswith("fleet: warning: ") for w in warnings) and len(warnings) == 4, out.stderr
    for name in ("openhpc_slurm_partitions", "report_dir_mode", "slurm_login_host"):
        assert any(f"'{name}' is not fleet's, and is kept" in w for w in warnings), (name, out.stderr)
    assert any("slurm.yml:7: slurm_partitions: a list of names is needed; fleet will not use this value" in w
               for w in warnings), out.stderr


def test_another_roles_shape_of_a_fleet_variable_is_shown_but_not_used():
    inv = load([ROLES_SITE])
    gpu01, gpu02 = inv.hosts["gpu01"], inv.hosts["gpu02"]
    assert "slurm_partitions" not in gpu01.vars and gpu01.all_vars["slurm_partitions"][0]["name"] == "gpu"
    assert gpu02.vars["slurm_partitions"] == ["gpu"]  # its host_vars give fleet's shape: used
    assert gpu01.vars["report_dir"] == "/scratch/fleet" and gpu01.vars["numa_nodes"] == [0, 1]
    lease_b = inv.hosts["lease-b"]
    assert lease_b.user == "ubuntu" and lease_b.vars["lease_owner"] == "ana"  # the override after `<<:`
    assert lease_b.vars["lease_until"] == "2026-03-01" and lease_b.vars["lease_checked"] == "2026-02-01T10:30:00"


def test_a_typo_of_a_fleet_variable_with_a_fitting_value_stays_an_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("all:\n  hosts:\n    g1:\n      owned_syctls: {kernel.perf_event_paranoid: 2}\n")
    with pytest.raises(InventoryError, match=r"bad.yaml:4: unknown variable 'owned_syctls'; did you mean"):
        load([bad])
    bad.write_text("all:\n  hosts:\n    g1:\n      owned_syctls: [a, b]\n")  # not that variable's shape
    assert load([bad]).warnings == [f"{bad}:4: 'owned_syctls' is not fleet's, and is kept "
                                    "(did you mean 'owned_sysctls'?)"]


BOMB = """\
a: &a ["x","x","x","x","x","x","x","x","x"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
"""


def _site(tmp_path):
    site = tmp_path / "site"
    (site / "group_vars").mkdir(parents=True)
    (site / "hosts").write_text("[gpu]\ngpu01\n")
    return site


@pytest.mark.parametrize("case", ["bomb-inventory", "bomb-vars", "nul", "fifo", "dev-zero"])
def test_a_file_that_is_no_inventory_is_refused_in_one_line(case, tmp_path):
    site = _site(tmp_path)
    vars_file = site / "group_vars" / "all.yml"
    if case == "bomb-inventory":
        (site / "hosts").unlink()
        (site / "bomb.yml").write_text("all:\n  vars:\n" + textwrap.indent(BOMB, "    "))
    elif case == "bomb-vars":
        vars_file.write_text(BOMB)
    elif case == "nul":
        vars_file.write_text("report_dir: /a\nx: \0\n")
    elif case == "fifo":
        os.mkfifo(vars_file)
    else:
        vars_file.symlink_to("/dev/zero")
    before = sorted(p.name for p in site.rglob("*"))
    started = time.monotonic()
    out = run_fleet("-i", str(site), "inventory", "list", "--json", timeout=60)
    assert out.returncode == 2 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    why = {"bomb-inventory": "YAML aliases expand to more than", "bomb-vars": "YAML aliases expand to more than",
           "nul": "all.yml:2: a NUL byte", "fifo": "not a regular file", "dev-zero": "not a regular file"}[case]
    assert out.stderr.startswith("fleet: ") and why in out.stderr, out.stderr
    assert time.monotonic() - started < 30  # refused, not read for a minute
    assert sorted(p.name for p in site.rglob("*")) == before  # nothing written beside it
