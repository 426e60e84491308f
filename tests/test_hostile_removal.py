"""`remove_gathered_reports` deletes only what fleet's own agent wrote there this run.

Two real sshd hosts share one report directory (``shared_report_dir``) and ask for their copies
to be removed once verified home. h01 is hostile: its interpreter runs the real agent for the
probe, and answers the profile round trip by planting files in the run's folder (and beside it)
and naming them all in its result, with their true sizes and sha256s, as if its agent had made
them. h02 is an honest node with the stand-in nsys.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleet.agent import wire
from tests.conftest import fleet_json, run_fleet
from tests.harness.sshd import SSHCluster

INTERPRETER = """#!/bin/sh
case "$3:$4" in  # the profile round trip (started ahead of its plan, or not): plan on stdin
  -:*|*:-ahead) exec /usr/bin/python3 "$(dirname "$0")/answer.py" ;;
  *) exec /usr/bin/python3 "$@" ;;                         # the probe: the real agent
esac
"""

# Reads the plan after the agent on stdin, plants files, and answers naming them.
ANSWER = """import hashlib, json, os, sys
data = sys.stdin.buffer.read()
at = data.rfind(b'{"mode":"profile"')
plan = json.JSONDecoder().raw_decode(data[at:].decode())[0]["plan"]
run_dir = os.path.dirname(plan["output"])
os.makedirs(run_dir, 0o700, exist_ok=True)
named = []
for path in (os.path.join(run_dir, "h01-4242.nsys-rep"),    # named as its agent names its reports
             os.path.join(run_dir, "precious.txt"),         # a file of the run's folder it did not write
             os.path.join(run_dir, "gpu07-999.nsys-rep"),     # named as the report of another host sharing the folder
             os.path.join(os.path.dirname(run_dir), "outside.nsys-rep")):  # the shared folder, outside the run's
    if not os.path.exists(path):
        with open(path, "wb") as f:
            f.write(b"planted " + path.encode())
    body = open(path, "rb").read()
    named.append({"path": path, "size": len(body), "sha256": hashlib.sha256(body).hexdigest()})
sys.stdout.write(MARK + json.dumps({"wire": 1, "kind": "profile",
                                    "body": {"status": "ok", "host": "h01", "reports": named}}) + "\\n")
""".replace("MARK", repr(wire.MARK))


@pytest.fixture(scope="module")
def lab():
    with SSHCluster(2) as c:
        node = c.scratch("hostile")
        (node / "python3").write_text(INTERPRETER)
        (node / "python3").chmod(0o755)
        (node / "answer.py").write_text(ANSWER)
        (node / "answer.py").chmod(0o644)
        reports = c.scratch("reports")  # shared as /var/tmp is: sticky, root's
        c.hosts[0].vars["ansible_python_interpreter"] = str(node / "python3")
        c.hosts[1].vars["ansible_python_interpreter"] = "/usr/bin/python3"
        c.inventory_vars = {"nsys_path": str(c.standins() / "nsys"), "report_dir": str(reports),
                            "shared_report_dir": "scratch", "remove_gathered_reports": True}
        c.write_client_files()
        yield {"c": c, "reports": reports, "store": c.dir / "store"}


def test_only_the_files_fleets_agent_wrote_this_run_are_removed_and_a_planted_one_survives(lab):
    out = run_fleet("profile", "--store", str(lab["store"]), "--json", "--hosts", "h01,h02", "--", "true",
                    env=lab["c"].env(), timeout=180)
    doc = fleet_json(out.stdout)
    assert "Traceback" not in out.stderr, out.stderr
    run_dir = lab["reports"] / doc["run_id"]
    entries = {Path(r["remote"]).name: r for h in doc["hosts"] if h["host"] == "h01" for r in h["reports"]}
    # its own name: fetched, verified, and gone from the node
    assert entries["h01-4242.nsys-rep"]["verified"] and entries["h01-4242.nsys-rep"]["removed_from_node"]
    assert not (run_dir / "h01-4242.nsys-rep").exists()
    # in the run's folder, yet no name of h01's agent: brought home, and left on the node, saying why
    for name in ("precious.txt", "gpu07-999.nsys-rep"):
        assert entries[name]["verified"] and not entries[name]["removed_from_node"], entries[name]
        assert "is not a name fleet's agent gives h01's files in this run" in entries[name]["kept_on_node"]
        assert (run_dir / name).read_bytes().startswith(b"planted "), name
    # outside the run's folder: neither fetched nor removed
    assert "is not in the run's folder on the node" in entries["outside.nsys-rep"]["error"]
    assert (lab["reports"] / "outside.nsys-rep").exists()
    # the honest host's own reports: removed, through its own login
    h02 = next(h for h in doc["hosts"] if h["host"] == "h02")
    assert h02["status"] == "ok" and h02["reports"], json.dumps(h02)[:2000]
    for r in h02["reports"]:
        assert r["verified"] and r["removed_from_node"] and not Path(r["remote"]).exists(), r
