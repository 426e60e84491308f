"""fleet's Slurm epilog on the node, as slurmd runs it (as root, with slurmd's environment): what it
puts back and says it put back, the unfinished reports it finishes with the node's own importer
under a deadline, and a state record it cannot trust. The sysctl is real (see tests/harness/prolog.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.harness.prolog import PARANOID, run, write_request

# The node's files, per test (the `node` fixture, tests/harness/prolog.py), and the sysctl at 3 for the module.
pytestmark = pytest.mark.usefixtures("paranoid_3")


def importer(node, script: str, owner=0) -> Path:
    """A QdstrmImporter in a root-owned directory; the epilog's config names it."""
    tools = node["root"] / f"tools-{owner}"
    tools.mkdir(mode=0o755)
    path = tools / "QdstrmImporter"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)
    os.chown(path, owner, owner)
    config = dict(node["config"], qdstrm_importer=str(path), finish_timeout=3)
    Path(node["config_path"]).write_text(json.dumps(config))
    return path


def leave_data(node, empty_report=False):
    user = node["user"]
    (node["work"] / "node1").mkdir()
    (node["work"] / "node1" / "rank0.qdstrm").write_text("{}")
    if empty_report:  # its importer killed while writing it: not a report
        (node["work"] / "node1" / "rank0.nsys-rep").write_text("")
    subprocess.run(["chown", "-R", f"{user.pw_uid}:{user.pw_gid}", str(node["work"])], check=True)


@pytest.mark.parametrize("empty_report", [False, True])
def test_the_epilog_finishes_reports_with_the_nodes_importer_as_the_jobs_user(node, empty_report):
    witness = node["root"] / "who"
    witness.touch(mode=0o666)
    witness.chmod(0o666)
    importer(node, f"id -u > {witness}\n")
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": []})
    leave_data(node, empty_report)
    assert run(node, "prolog") == 0 and run(node, "epilog") == 0
    assert witness.read_text().strip() == str(node["user"].pw_uid)  # the importer ran, as the job's user


def test_nothing_the_job_names_runs_in_the_epilog(node):
    """The request used to name the nsys whose QdstrmImporter the epilog ran: the job chose the code."""
    witness = node["root"] / "ran"
    tools = node["root"] / "job-tools"
    tools.mkdir(mode=0o777)
    (tools / "nsys").write_text("#!/bin/sh\n")
    (tools / "QdstrmImporter").write_text(f"#!/bin/sh\ntouch {witness}\n")
    for f in tools.iterdir():
        f.chmod(0o777)
    importer(node, "exit 0\n", owner=node["user"].pw_uid)  # and a config naming one the user can change
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": [], "nsys": str(tools / "nsys")})
    leave_data(node)
    assert run(node, "prolog") == 0 and run(node, "epilog") == 0
    assert not witness.exists()
    assert "must belong to root and be writable by root alone" in node["log"].read_text()


def test_an_importer_that_hangs_or_daemonizes_is_killed_whole_at_the_deadline(node):
    pids = node["root"] / "pids"
    pids.touch(mode=0o666)
    pids.chmod(0o666)
    importer(node, f"sleep 300 & echo $! >> {pids}\nsleep 300 & echo $! >> {pids}\nwait\n")
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": []})
    leave_data(node)
    assert run(node, "prolog") == 0
    started = time.monotonic()
    assert run(node, "epilog") == 0
    assert time.monotonic() - started < 30  # finish_timeout 3 s: the epilog did not wait for it
    left = [int(p) for p in pids.read_text().split()]
    assert len(left) == 2
    deadline = time.monotonic() + 5
    while any(Path(f"/proc/{p}").exists() and "sleep" in Path(f"/proc/{p}/cmdline").read_text(errors="replace")
              for p in left):
        assert time.monotonic() < deadline, "a process the importer started outlived the epilog"
        time.sleep(0.1)
    assert "out of time" in node["log"].read_text() or "within 3 s" in node["log"].read_text()


def test_the_epilog_log_says_what_it_put_back(node):
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": ["kernel.perf_event_paranoid"]})
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "2"
    assert run(node, "epilog") == 0 and PARANOID.read_text().strip() == "3"
    line = [ln for ln in node["log"].read_text().splitlines() if "epilog" in ln][-1]
    done = json.loads(line.split("epilog ", 1)[1])
    assert done["released"]["restored"] == {"kernel.perf_event_paranoid": "3"}  # was always {}


@pytest.mark.parametrize("corrupt", ["{not json", "[]", '{"sysctls": {"kernel.perf_event_paranoid": 3}}',
                                     '{"sysctls": {"kernel.perf_event_paranoid": {"original": "3", "holders": [7]}}}'])
@pytest.mark.parametrize("op", ["prolog", "epilog"])
def test_a_corrupt_state_record_is_a_node_fault(node, corrupt, op):
    """Nobody can tell what was changed, and from what: not "left in service" as if all were well."""
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": ["kernel.perf_event_paranoid"]})
    state = Path(node["config"]["state_dir"])
    state.mkdir(mode=0o700)
    (state / "state.json").write_text(corrupt)
    (state / "state.json").chmod(0o600)
    config = dict(node["config"], fail_closed=True)
    Path(node["config_path"]).write_text(json.dumps(config))
    assert run(node, op) == 1  # fail-closed: slurmd drains the node
    assert "NODE FAULT" in node["log"].read_text() and "is corrupt" in node["log"].read_text()
    assert PARANOID.read_text().strip() == "3"  # and nothing was changed on a guess
    (state / "state.json").unlink()


def test_fail_closed_drains_only_for_a_node_fault(node):
    write_request(node, {"fleet": 1, "sysctls": ["kernel.perf_event_paranoid"]})
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "2"
    state = Path(node["config"]["state_dir"]) / "state.json"
    state.chmod(0o644)  # the record of the original value can no longer be trusted
    assert run(node, "epilog") == 0  # fail-open: logged
    assert "NODE FAULT" in node["log"].read_text()
    config = dict(node["config"], fail_closed=True)
    Path(node["config_path"]).write_text(json.dumps(config))
    assert run(node, "epilog") == 1  # fail-closed: slurmd drains the node
    state.chmod(0o600)
    assert run(node, "epilog") == 0 and PARANOID.read_text().strip() == "3"


@pytest.mark.parametrize("fail_closed", [True, False])
def test_a_lost_state_record_with_a_changed_value_is_a_node_fault_never_the_new_original(node, fail_closed):
    """The record of the job's change is gone (a wiped /var/lib, a tmpfs state dir) and the node's
    value is still the job's: the epilog used to find nothing to put back and exit 0, and the next
    prolog took the changed value as the "original", so it was never put back."""
    config = dict(node["config"], fail_closed=fail_closed, baseline_sysctls={"kernel.perf_event_paranoid": 3})
    Path(node["config_path"]).write_text(json.dumps(config))
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": ["kernel.perf_event_paranoid"]})
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "2"
    state = Path(node["config"]["state_dir"]) / "state.json"
    state.unlink()  # the job's record, lost; the value it set stays
    assert run(node, "epilog") == (1 if fail_closed else 0)  # fail-closed: slurmd drains the node
    said = node["log"].read_text()
    assert "epilog: NODE FAULT: after job 4242: kernel.perf_event_paranoid is 2 on this node, not its baseline 3" in said
    assert "the state record was lost" in said and PARANOID.read_text().strip() == "2"  # nothing done on a guess
    # The next job's prolog does not adopt 2 as the original (it would "restore" 2 after that job).
    assert run(node, "prolog") == (1 if fail_closed else 0)
    assert said.count("NODE FAULT") < node["log"].read_text().count("NODE FAULT")
    record = json.loads(state.read_text()) if state.exists() else {"sysctls": {}}
    assert "kernel.perf_event_paranoid" not in record["sysctls"], record
    PARANOID.write_text("3")  # the admin puts the node back: it is in service again
    assert run(node, "prolog") == 0 and PARANOID.read_text().strip() == "2"
    assert run(node, "epilog") == 0 and PARANOID.read_text().strip() == "3"


def test_a_node_at_its_baseline_with_no_record_is_no_fault(node):
    config = dict(node["config"], fail_closed=True, baseline_sysctls={"kernel.perf_event_paranoid": 3})
    Path(node["config_path"]).write_text(json.dumps(config))
    write_request(node, {"fleet": 1, "tool": "nsys", "sysctls": []})  # opted in, holding nothing
    assert run(node, "prolog") == 0 and run(node, "epilog") == 0
    assert "NODE FAULT" not in (node["log"].read_text() if node["log"].exists() else "")


def test_slurm_install_writes_each_owned_sysctls_baseline_into_the_node_config(tmp_path):
    from tests.conftest import run_fleet

    def node_json(*args):
        r = run_fleet("slurm", "install", "--prefix", str(tmp_path), "--owned-sysctl", "kernel.perf_event_paranoid=2",
                      *args)
        assert r.returncode == 0, r.stderr
        text = r.stdout.split(f"# {tmp_path}/node.json (644)\n", 1)[1]
        return json.JSONDecoder().raw_decode(text)[0]

    assert node_json()["baseline_sysctls"] == {"kernel.perf_event_paranoid": "3"}  # this machine's, now
    assert node_json("--baseline-sysctl", "kernel.perf_event_paranoid=4")["baseline_sysctls"] == {
        "kernel.perf_event_paranoid": 4}
    stray = run_fleet("slurm", "install", "--baseline-sysctl", "kernel.kptr_restrict=1")
    assert stray.returncode == 2 and "not an owned sysctl" in stray.stderr
