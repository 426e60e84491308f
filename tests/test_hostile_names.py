"""Names that become paths: hosts, sites, run ids, node names a job could write.

Every one is held to one safe path component (fleet/safenames.py): refused with one line that
says why, and nothing is written anywhere, neither where it pointed nor where it was meant to go.
Run ids are exact, never patterns: `fleet reports rm '*'` removes nothing.
"""

from __future__ import annotations

import asyncio
import json
import socket
import sqlite3
import subprocess
import sys
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import pytest

from fleet import exitcodes, policy, safenames, store
from fleet.agent import node, run, wire
from fleet.agent.bundle import BOOTSTRAP, bundle
from fleet.inventory import Host, InventoryError, load
from fleet.lab import profile
from fleet.plan import ProfileRequest, plan
from fleet.collection.bring import bring_home
from fleet.store.manifest import RunManifest, SlurmInfo
from fleet.transport import Fanout
from fleet.transport.settings import SSHSettings
from tests.conftest import run_fleet
from tests.harness.store_runs import nightly_run, rows_of

STANDINS = Path(__file__).parent / "standins"

REAL_NAMES = ["gpu01", "gpu01.lab.example.org", "10.0.0.17", "fe80::1", "node_7", "GPU-A100.rack3", "a" * 253]
HOSTILE = ["../../../../tmp/x", "..", ".", ".hidden", "-rf", "a/b", "/etc", "", "a\nb", "a\tb", "a\x1bb",
           "gpu 01", "a" * 254]


def tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*"))


def one_clear_line(out: subprocess.CompletedProcess, *needles: str) -> str:
    """The one line fleet said on stderr: no traceback, exit status 2 (bad input, nothing touched)."""
    assert out.returncode == exitcodes.USAGE, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleet: "), out.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- the rule ---

@pytest.mark.parametrize("name", REAL_NAMES)
def test_the_names_real_inventories_use_are_path_components(name):
    assert safenames.is_component(name) and safenames.component_problem(name, "host name") is None


@pytest.mark.parametrize("name", HOSTILE + [None, 7])
def test_traversal_control_characters_and_empty_are_refused(name):
    problem = safenames.component_problem(name, "host name")
    assert problem and "\n" not in problem and len(problem) < 300
    with pytest.raises(safenames.UnsafeName):
        safenames.join(Path("/store"), name, what="host name")


# --- hosts: refused when the inventory is read, naming the file and line ---

def inventory(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text("all:\n  hosts:\n    ok01:\n      ansible_host: 127.0.0.1\n"
                    f"    {json.dumps(name)}:\n      ansible_host: 127.0.0.1\n")
    return path


@pytest.mark.parametrize("name", ["../../../../tmp/x", "..", ".hidden", "-oProxyCommand=x", "a/b", "a\x1bb"])
def test_an_inventory_host_that_is_no_folder_name_is_refused_at_load(tmp_path, name):
    path = inventory(tmp_path, name)
    with pytest.raises(InventoryError) as e:
        load([path])
    assert e.value.where == f"{path}:5" and "cannot name a folder" in str(e.value)
    out = run_fleet("-i", str(path), "inventory", "check")
    one_clear_line(out, f"{path}:5: host name", "cannot name a folder")


@pytest.mark.parametrize("name", REAL_NAMES[:5])
def test_real_host_names_still_load(tmp_path, name):
    assert name in load([inventory(tmp_path, name)]).hosts


def test_a_traversing_host_profiles_nowhere_and_writes_nothing(tmp_path):
    """The attack as it was: ansible_host set, so the name needed no address."""
    escape = tmp_path / "escaped"
    name = "../" * 12 + str(escape).lstrip("/")
    path = inventory(tmp_path, name)
    out = run_fleet("-i", str(path), "profile", "--hosts", name, "--store", str(tmp_path / "store"), "--", "true")
    one_clear_line(out, "host name", "cannot name a folder")
    assert tree(tmp_path) == ["inv.yaml"]


# --- sites: refused before any node or cluster is reached ---

@pytest.mark.parametrize("site", ["../..", "..", "a/b", ".", "-x", "a\x1bb"])
def test_a_site_that_is_no_folder_name_is_refused_before_anything_runs(tmp_path, site):
    root = tmp_path / "a" / "b" / "store"
    out = run_fleet("profile", "--site", site, "--store", str(root), "--hosts", socket.gethostname(), "--", "true")
    one_clear_line(out, "site", "cannot name a folder")
    out = run_fleet("profile", "--partition", "gpu", "--site", site, "--store", str(root), "--dry-run", "--", "true")
    one_clear_line(out, "site", "cannot name a folder")
    assert tree(tmp_path) == []


# --- defence at the joins: names that did not come from an inventory ---

def test_a_host_made_without_an_inventory_is_kept_off_the_nodes():
    hostile = Host("../../x", {"ansible_connection": "local"}, (), "(made)")
    req = ProfileRequest(tool="nsys", command=("true",), run_id="20261130-000000-abcd")

    async def go():
        async with Fanout(SSHSettings()) as fan:
            return await profile.plan_all(fan, [hostile], req)

    runs = asyncio.run(go())
    assert runs["../../x"].status == "failed" and "cannot name a folder" in runs["../../x"].error


def test_a_report_name_from_the_node_that_is_no_file_name_is_not_fetched(tmp_path):
    entries = asyncio.run(bring_home(None, None, [{"path": "/r/..", "size": 1, "sha256": "0" * 64}],
                                     tmp_path / "h01", node_dir="/r"))
    assert not entries[0].verified and "cannot name a folder" in entries[0].error
    assert tree(tmp_path) == []


def shipped_agent(plan_doc: dict) -> subprocess.CompletedProcess:
    """The agent as fleet ships it to a node: the bundle on stdin, its argument on the command line."""
    return subprocess.run([sys.executable, "-c", BOOTSTRAP, json.dumps({"mode": "profile", "plan": plan_doc})],
                          input=bundle(), capture_output=True, timeout=60)


@pytest.mark.parametrize("change", [{"host": "../../../escaped"},
                                    {"output": "RUN/../../escaped-%p"},
                                    {"report_dir": "RUNROOT/..", "output": "RUNROOT/../h01-%p"}])
def test_the_agent_on_the_node_refuses_a_plan_that_writes_outside_its_run(tmp_path, change):
    """fleet checks the names; the node checks again before it writes a report or a result."""
    reports = tmp_path / "var" / "reports"
    state = node.probe({"tools": {"nsys": str(STANDINS / "nsys")}, "report_dir": str(reports),
                        "environment_check": False})
    p = plan("h01", policy.NodeState.read(state), ProfileRequest(tool="nsys", command=("touch", str(tmp_path / "ran")),
                                                                 run_id="r"))
    run_dir, before = str(reports / "r"), tree(tmp_path)
    doc = {k: v.replace("RUNROOT", str(reports)).replace("RUN", run_dir) for k, v in change.items()}
    out = shipped_agent(replace(p, **doc).to_json())
    [result] = wire.answers(out.stdout.decode(), "profile")
    assert out.returncode == 1 and result["status"] == "error", out.stderr
    assert "plan's" in result["reasons"][0], result
    assert not (tmp_path / "ran").exists() and tree(tmp_path) == before


def test_a_node_name_a_job_wrote_into_its_result_brings_nothing_home(tmp_path):
    """On Slurm the results are files in the run directory, which the job itself can write."""
    run_dir = tmp_path / "cluster" / "runs" / "20261130-000000-abcd"
    forged = run_dir / "node1" / "rank9.result.json"
    forged.parent.mkdir(parents=True)
    (run_dir / "node1" / "x.nsys-rep").write_text("stolen")
    forged.write_text(json.dumps({"status": "ok", "rank": 9, "slurm_node": "../../../../escaped",
                                  "reports": [{"path": "/x/x.nsys-rep", "size": 6, "sha256": "0" * 64}]}))
    forged.chmod(0o600)  # as the agent's own result file is: the name it holds is what is refused
    directory = tmp_path / "a" / "b" / "store" / "run"  # the forged name points at tmp_path/a/escaped
    directory.mkdir(parents=True)
    manifest = RunManifest(run_id="20261130-000000-abcd",
                           slurm=SlurmInfo(run_dir=str(run_dir), job_id="1", spec={"ntasks": 1}))
    login = Host("login", {"ansible_connection": "local"}, (), "(made)")

    async def go():
        from fleet.slurm.jobs import SlurmClient
        from fleet.slurm.run import gather

        async with Fanout(SSHSettings()) as fan:
            return await gather(fan, SlurmClient(fan, login), manifest, directory, None)

    m = asyncio.run(go())
    [forged_entry] = [h for h in m.hosts if h.rank == 9]
    assert forged_entry.status == "failed" and "'../../../../escaped', not of its own place" in \
        forged_entry.missing_why, forged_entry.missing_why
    assert tree(directory) == [] and not (tmp_path / "a" / "escaped").exists()


# --- run ids: exact, never patterns ---

@pytest.fixture
def two_runs(tmp_path):
    root = tmp_path / "store"
    a = nightly_run(root, "20261128-020000-aaaa", 1_000_000)
    b = nightly_run(root, "20261129-020000-bbbb", 1_500_000)
    store.reindex(root)
    return root, a, b


PATTERNS = ["*", "2026*", "*/*/*", "20261128-020000-aaa?", "[2]*", "..", "../store", "", "a\nb"]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_run_id_that_is_a_pattern_or_a_path_touches_nothing(two_runs, tmp_path, pattern):
    root, a, b = two_runs
    before, rows = tree(tmp_path), (rows_of(root, a), rows_of(root, b))
    for argv in (["reports", "rm", pattern], ["reports", "rm", "--dry-run", pattern], ["reports", "show", pattern],
                 ["reports", "pull", pattern, str(tmp_path / "out")], ["reports", "compare", pattern, a],
                 ["gather", pattern], ["jobs", pattern], ["cancel", pattern]):
        out = run_fleet(*argv, "--store", str(root))
        one_clear_line(out, "run id", "exact, never patterns")
    assert tree(tmp_path) == before and (rows_of(root, a), rows_of(root, b)) == rows


def test_rm_removes_the_folder_and_every_catalog_row_and_dry_run_removes_nothing(two_runs):
    root, a, b = two_runs
    directory = store.run_dir(root, "lab", a)
    out = run_fleet("reports", "rm", "--dry-run", a, "--store", str(root))
    assert out.returncode == 0 and f"would remove {directory} (2 files, 4 catalog rows)" in out.stdout, out
    assert directory.is_dir() and rows_of(root, a) == {"runs": 1, "reports": 1, "kernels": 1, "metrics": 1}
    out = run_fleet("reports", "rm", a, "--store", str(root))
    assert out.returncode == 0 and f"removed {directory}" in out.stdout, out
    assert not directory.exists() and rows_of(root, a) == {"runs": 0, "reports": 0, "kernels": 0, "metrics": 0}
    assert store.run_dir(root, "lab", b).is_dir() and rows_of(root, b)["runs"] == 1


def test_a_catalog_row_pointing_outside_the_store_is_not_followed(two_runs, tmp_path):
    root, a, _ = two_runs
    elsewhere = tmp_path / "elsewhere" / a
    elsewhere.mkdir(parents=True)
    (elsewhere / "manifest.json").write_text((store.run_dir(root, "lab", a) / "manifest.json").read_text())
    (elsewhere / "precious").write_text("kept")
    with closing(sqlite3.connect(root / "catalog.sqlite")) as db, db:
        db.execute("UPDATE runs SET manifest = ? WHERE run_id = ?", (str(elsewhere / "manifest.json"), a))
    out = run_fleet("reports", "rm", a, "--store", str(root))
    assert out.returncode == 0 and str(store.run_dir(root, "lab", a)) in out.stdout, out
    assert (elsewhere / "precious").read_text() == "kept"


def test_pull_copies_no_report_whose_host_in_the_manifest_is_no_folder_name(two_runs, tmp_path):
    root, a, _ = two_runs
    path = store.run_dir(root, "lab", a) / "manifest.json"
    doc = json.loads(path.read_text())
    doc["hosts"][0]["host"] = "../../escaped"
    path.write_text(json.dumps(doc))
    out = run_fleet("reports", "pull", a, str(tmp_path / "out" / "here"), "--store", str(root))
    assert out.returncode == exitcodes.FAILED and "cannot name a folder" in out.stderr, out
    assert "Traceback" not in out.stderr and not (tmp_path / "escaped").exists()
