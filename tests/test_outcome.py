"""One outcome on both paths: every answer an agent can give maps to the same host status, the
same reason and the same exit status on a lab server and on a Slurm rank.

Each case is an agent's answer. On the lab path it comes back over the real transport from a
node whose interpreter gives that answer (with its report written into the run's folder, as
the agent writes it); on the Slurm path it is a rank's result file in the run's directory, read
by the real gather. Both then go through what each path does with an answer.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from fleet import exitcodes, policy
from fleet.agent import node, wire
from fleet.agent.messages import ProfileResult
from fleet.inventory import Host
from fleet.lab import profile as lab
from fleet.outcome import HostStatus, of_result, run_status, workload_said
from fleet.plan import ProfileRequest, plan
from fleet.slurm import run as slurm
from fleet.slurm.jobstate import JobMarks
from fleet.slurm.results import RankResult
from fleet.store.manifest import RunManifest, SlurmInfo
from fleet.transport import Fanout

STANDINS = Path(__file__).parent / "standins"

# A node's interpreter that answers the profile round trip with ANSWER, after writing the report
# it names into the plan's own output folder (as the agent does), with its true size and sha256.
ANSWERING_PYTHON = """#!{python}
import hashlib, json, os, sys, zlib
rest = zlib.decompressobj()
rest.decompress(sys.stdin.buffer.read())
plan = json.loads(rest.unused_data)["plan"]  # the arguments follow the agent on stdin
body = json.load(open({answer!r}))
for entry in body.get("reports", []):
    entry["path"] = os.path.join(os.path.dirname(plan["output"]), entry["path"])
    with open(entry["path"], "wb") as f:
        f.write(b"report")
    entry.update(size=6, sha256=hashlib.sha256(b"report").hexdigest())
sys.stdout.write({mark!r} + json.dumps({{"wire": 1, "kind": "profile", "body": body}}) + "\\n")
"""

REPORT = {"path": "h01-1.nsys-rep", "status": "complete"}
CASES = [  # (the agent's answer, the host status, words its reason holds, the run's exit status)
    ({"status": "ok", "reports": [REPORT]}, HostStatus.OK, None, exitcodes.OK),
    ({"status": "ok", "reports": [REPORT], "workload": {"exit_status": 3, "signal": None}},
     HostStatus.WORKLOAD_FAILED, "the workload exited 3", exitcodes.WORKLOAD_FAILED),
    ({"status": "ok", "reports": [REPORT], "workload": {"exit_status": None, "signal": "SIGSEGV"}},
     HostStatus.WORKLOAD_FAILED, "killed by SIGSEGV", exitcodes.WORKLOAD_FAILED),
    ({"status": "ok", "reports": [REPORT], "exit_status": 139},  # an agent older than the workload record
     HostStatus.WORKLOAD_FAILED, "killed by SIGSEGV", exitcodes.WORKLOAD_FAILED),
    ({"status": "ok", "reports": [REPORT], "exit_status": 143, "stopped": True},  # fleet stopped it: no failure
     HostStatus.OK, None, exitcodes.OK),
    ({"status": "ok", "reports": [REPORT], "profiler_errors": ['==ERROR== Failed to profile "Kernel2"']},
     HostStatus.PROFILER_ERROR, "Failed to profile", exitcodes.FAILED),
    ({"status": "yielded", "reports": [REPORT],
      "newcomer": {"gpu": 0, "pid": 4242, "user": "bob", "used_memory": 1 << 30, "unseen": False,
                   "appeared_s": 10.2, "overlap_s": 0.4, "action": "ncu stopped (SIGINT), the workload went on"}},
     HostStatus.YIELDED, "pid 4242 (bob, 1.0 GiB) on GPU 0, 10.2 s after", exitcodes.YIELDED),
    ({"status": "refused", "reasons": ["GPU 0: pid 4242 (bob)"]}, HostStatus.REFUSED, "pid 4242", exitcodes.REFUSED),
    ({"status": "stopped", "reasons": ["told to stop"]}, HostStatus.STOPPED, "told to stop", exitcodes.FAILED),
    ({"status": "no-report", "reasons": ["the profiler exited 1 and left no report"]}, HostStatus.FAILED,
     "left no report", exitcodes.FAILED),
    ({"status": "error", "reasons": ["the agent failed: OSError"]}, HostStatus.FAILED, "OSError", exitcodes.FAILED),
    ({"status": "ok", "reports": []}, HostStatus.FAILED, "named no report", exitcodes.FAILED),
    ({"status": "finished, trust me"}, HostStatus.FAILED, "malformed", exitcodes.FAILED),
    ({"status": "ok", "reports": [REPORT], "notes": 5}, HostStatus.FAILED, "malformed", exitcodes.FAILED),
]
IDS = [f"{c[1]}-{i}" for i, c in enumerate(CASES)]


def local_host(python: str = sys.executable) -> Host:
    return Host("h01", {"ansible_connection": "local", "ansible_python_interpreter": python}, (), "test")


def on_lab(tmp_path: Path, answer: dict):
    (tmp_path / "answer.json").write_text(json.dumps(answer))
    script = tmp_path / "python3"
    script.write_text(ANSWERING_PYTHON.format(python=sys.executable, answer=str(tmp_path / "answer.json"),
                                              mark=wire.MARK))
    script.chmod(0o755)
    req = ProfileRequest(tool="nsys", command=("true",), run_id="20261201-000000-abcd")
    state = node.probe({"tools": {"nsys": str(STANDINS / "nsys")}, "report_dir": str(tmp_path / "node"),
                        "environment_check": False})
    state = policy.NodeState.read(state)
    run = lab.HostRun("h01", HostStatus.PLANNED, plan=plan("h01", state, req), state=state)
    assert run.plan.status == "ok", run.plan.reasons
    os.makedirs(os.path.dirname(run.plan.output), mode=0o700, exist_ok=True)

    async def go():
        async with Fanout() as fan:
            await lab.run_planned(fan, [local_host(str(script))], {"h01": run}, req, out=tmp_path / "store")

    asyncio.run(go())
    manifest = RunManifest(run_id=req.run_id, hosts=[lab.entry_for(req, run)])
    manifest.status = run_status(h.status for h in manifest.hosts)
    return manifest


class ResultsOnly:
    """The login node's side of a gather: the ranks' result files as `read_results` reads them."""

    def __init__(self, text: str):
        self.text, self.login = text, local_host()

    async def read_results(self, run_dir: str):
        return [RankResult.of(body) for body in wire.answers(self.text, "profile")], JobMarks()


def on_slurm(tmp_path: Path, answer: dict):
    run_dir = tmp_path / "cluster" / "run"
    body = json.loads(json.dumps(answer))
    body.update(rank=0, slurm_node="node1")
    for entry in body.get("reports", []):  # as the rank left it in the run's directory
        (run_dir / "node1").mkdir(parents=True, exist_ok=True)
        (run_dir / "node1" / entry["path"]).write_bytes(b"report")
        entry.update(path=f"/scratch/{entry['path']}", size=6, sha256=hashlib.sha256(b"report").hexdigest())
    manifest = RunManifest(run_id="20261201-000000-abcd", request={"tool": "nsys"},
                           slurm=SlurmInfo(run_dir=str(run_dir), job_id="7", spec={"ntasks": 1}))
    (tmp_path / "store").mkdir(exist_ok=True)

    async def go():
        async with Fanout() as fan:
            return await slurm.gather(fan, ResultsOnly(wire.frame("profile", body)), manifest, tmp_path / "store",
                                      None)

    return asyncio.run(go())


@pytest.mark.parametrize("answer, status, words, code", CASES, ids=IDS)
def test_every_answer_maps_the_same_on_both_paths(tmp_path, answer, status, words, code):
    (tmp_path / "lab").mkdir()
    (tmp_path / "slurm").mkdir()
    on_lab_run, on_slurm_run = on_lab(tmp_path / "lab", answer), on_slurm(tmp_path / "slurm", answer)
    [host], [rank] = on_lab_run.hosts, on_slurm_run.hosts
    assert (host.status, rank.status) == (status, status), (host.missing_why, rank.missing_why)
    for entry in (host, rank):
        assert (words is None and entry.missing_why is None) or (words and words in (entry.missing_why or "")), \
            entry.missing_why
    assert exitcodes.for_run(on_lab_run) == exitcodes.for_run(on_slurm_run) == code
    if status in (HostStatus.OK, HostStatus.WORKLOAD_FAILED, HostStatus.YIELDED, HostStatus.PROFILER_ERROR):
        assert [r.verified for r in host.reports] == [r.verified for r in rank.reports] == [True], \
            "the report is kept whatever the workload did"


def test_a_workload_stopped_by_fleet_is_no_failure_and_a_killed_profiler_is_not_the_workloads():
    def said(result):
        return workload_said(ProfileResult.read(result))
    assert said({"stopped": True, "workload": {"exit_status": 143}}) is None
    assert said({"exit_status": -9}) is None  # nsys itself SIGKILLed: its report is finished after
    assert said({"workload": {"exit_status": 0, "signal": None}}) is None
    assert said({"exit_status": 3}) == "the workload exited 3"
    assert said({"exit_status": 137}) == "the workload was killed by SIGKILL"  # an agent older than the record


def test_a_lost_report_fails_the_host_and_a_lost_summary_does_not():
    from fleet.store.manifest import ReportEntry
    ok = ProfileResult.read({"status": "ok", "reports": [{"path": "/r/a"}]})
    lost_report = [ReportEntry(remote="/r/a", error="sha256 mismatch")]
    assert of_result(ok, lost_report) == (HostStatus.FAILED, "sha256 mismatch")
    kept = [ReportEntry(remote="/r/a", verified=True, status="complete"),
            ReportEntry(remote="/r/a.csv", status="summary", summary="nvtx_sum", error="gone")]
    assert of_result(ok, kept) == (HostStatus.OK, None)


@pytest.mark.parametrize("statuses, code", [
    (["ok", "ok"], exitcodes.OK), (["ok", "workload-failed"], exitcodes.PARTIAL),
    (["refused", "refused"], exitcodes.REFUSED), (["refused", "yielded"], exitcodes.YIELDED),
    (["workload-failed", "unreachable"], exitcodes.WORKLOAD_FAILED), (["refused", "failed"], exitcodes.FAILED),
    (["yielded", "yielded"], exitcodes.YIELDED), (["profiler-error"], exitcodes.FAILED),
])
def test_a_runs_exit_status_from_its_hosts(statuses, code):
    assert exitcodes.for_hosts(statuses) == code
