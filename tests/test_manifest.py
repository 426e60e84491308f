"""The run manifest's types: one shape on every path, version 1 still read, a newer one refused."""

from __future__ import annotations

import json

import pytest

from fleet import exitcodes, policy, store
from fleet.lab import profile
from fleet.agent import node, task
from fleet.store.manifest import (SCHEMA_VERSION, HostEntry, ManifestError, ProcessSeen, ReportEntry, RunManifest,
                            SlurmInfo)
from fleet.plan import ProfileRequest, plan
from fleet.slurm.run import rank_entry
from tests.conftest import fleet_json, run_fleet
from tests.harness.manifests import V1, put_in_store

REPORT = ReportEntry(remote="/var/tmp/fleet/r/h02-1.nsys-rep", stored="/store/lab/2026-11-30/r/h02/h02-1.nsys-rep",
                     size=424, sha256="8f" * 32, status="complete", verified=True, resumed_from=100)
SUMMARY = ReportEntry(remote="/var/tmp/fleet/r/h02-1_cuda_gpu_kern_sum.csv", stored="/store/x.csv", size=88,
                      sha256="63" * 32, status="summary", verified=True, summary="cuda_gpu_kern_sum",
                      read_through="h01", removed_from_node=True)
LOST = ReportEntry(remote="/var/tmp/fleet/r/h03-1.nsys-rep", stored="/store/y", size=5, sha256="00" * 32,
                   error="could not bring it home: No space left on device; the node's copy is kept")
PROCESS = ProcessSeen(gpu=0, pid=4242, user="bob", used_memory=10**9, foreign=True, slurm_job="77")


def full_manifest() -> RunManifest:
    """A manifest with every type and every field set to something other than its default."""
    hosts = [HostEntry(host="node1", status="ok", rank=0, node="gpu-node-1", gpu="NVIDIA H200", driver="580.159.04",
                       tool_version="2025.3.1.90", tenants_seen=["GPU 0: pid 4242 (bob) belongs to another user"],
                       processes_seen=[PROCESS], given_up=["CPU sampling"], plan={"status": "ok", "argv": ["nsys"]},
                       result={"status": "ok", "rank": 0}, reports=[REPORT, SUMMARY]),
             HostEntry(host="node1", status="failed", worker="worker-node1-77.nsys-rep", missing_why="lost",
                       reports=[LOST]),
             HostEntry(host="(no result)", status="missing", rank=1, missing_why="rank 1 left no result")]
    slurm = SlurmInfo(cluster="hpc", login="login1", version="22.05.8", run_dir="/home/ana/fleet-runs/r",
                      job_id="41", state="COMPLETED", spec={"ntasks": 2}, script="#!/bin/bash\n", exit_code="0:0",
                      nodes="node1", reason="None", job_exit=0, stopped_before_time_limit=True, log=REPORT)
    return RunManifest(run_id="20261130-172733-c711", site="hpc", day="2026-11-30", started="2026-11-30T17:27:33+0000",
                       user="ana", request={"tool": "nsys", "command": ["python3", "train.py"]}, status="partial",
                       hosts=hosts, slurm=slurm, playbook={"name": "train", "metrics": []}, error="x")


def through_json(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def test_every_type_round_trips_through_json():
    for value in (REPORT, SUMMARY, LOST, PROCESS, *full_manifest().hosts, full_manifest().slurm):
        assert type(value).from_json(through_json(value.to_json())) == value
    m = full_manifest()
    doc = through_json(m.to_json())
    assert doc["schema"] == SCHEMA_VERSION == 2
    assert RunManifest.from_json(doc) == m
    lab = RunManifest(run_id="20261130-000000-abcd", hosts=[HostEntry("h01")])
    assert "slurm" not in lab.to_json() and "playbook" not in lab.to_json()  # "slurm" in it says a Slurm run
    assert RunManifest.from_json(through_json(lab.to_json())) == lab


def test_every_host_entry_has_the_same_keys_whatever_it_stands_for():
    keys = [set(h.to_json()) for h in full_manifest().hosts]
    assert keys[0] == keys[1] == keys[2]


def test_a_manifest_from_a_newer_fleet_is_refused_with_a_clear_error(tmp_path):
    doc = dict(full_manifest().to_json(), schema=SCHEMA_VERSION + 1)
    with pytest.raises(ManifestError, match=r"schema 3, newer than this fleet reads \(2\): upgrade fleet"):
        RunManifest.from_json(doc)
    with pytest.raises(ManifestError, match="not a version number"):
        RunManifest.from_json(dict(doc, schema="2"))
    put_in_store(tmp_path, doc)
    out = run_fleet("reports", "show", doc["run_id"], "--store", str(tmp_path))
    assert out.returncode == exitcodes.USAGE and out.stdout == ""
    [line] = out.stderr.splitlines()
    assert line.startswith("fleet: ") and "newer than this fleet reads" in line


@pytest.mark.parametrize("name", sorted(p.name for p in V1.glob("*.json")))
def test_manifests_written_before_the_schema_still_load(name):
    doc = json.loads((V1 / name).read_text())
    assert "schema" not in doc  # as main wrote them
    m = RunManifest.from_json(doc)
    assert m.schema == 1 and m.run_id == doc["run_id"] and len(m.hosts) == len(doc["hosts"])
    assert through_json(RunManifest.from_json(m.to_json()).to_json()) == through_json(m.to_json())


def test_manifests_written_before_the_schema_open_with_reports_show(tmp_path):
    shown, docs = {}, {path.stem: json.loads(path.read_text()) for path in sorted(V1.glob("*.json"))}
    for name, doc in docs.items():
        put_in_store(tmp_path, doc)
        out = run_fleet("reports", "show", doc["run_id"], "--store", str(tmp_path))
        assert out.returncode == 0, (name, out.stderr)
        shown[name] = out.stdout
    assert "  h03: refused (tenant: GPU 0: pid" in shown["lab-partial"]
    assert "  node1 rank 0: ok; NVIDIA H200, driver 580.159.04, nsys 2025.3.1.90" in shown["slurm-missing-rank"]
    assert "  (no result) rank 1: missing (rank 1 left no result (job FAILED; see slurm-1.out))" in \
        shown["slurm-missing-rank"]
    assert "  (no result) rank 0: missing (rank 0 left no result: the job was cancelled" in shown["slurm-cancelled"]
    assert shown["slurm-ray"].count(": ok") == 2 and "worker-" in shown["slurm-ray"]
    for doc in docs.values():  # --json: the manifest as this fleet writes it
        as_json = fleet_json(run_fleet("reports", "show", doc["run_id"], "--store", str(tmp_path), "--json").stdout)
        assert as_json["schema"] == SCHEMA_VERSION and as_json["run_id"] == doc["run_id"]


def test_processes_seen_have_the_same_keys_on_lab_servers_and_on_slurm(monkeypatch):
    state = {"host": "gpu-node-1", "nvml": {"driver": "580.159.04"},
             "tools": {"nsys": {"path": "/opt/nsys/bin/nsys", "version": "2025.3.1.90"}},
             "gpus": [{"index": 0, "uuid": "GPU-0", "name": "NVIDIA H200", "processes": [
                 {"pid": 4242, "user": "bob", "used_memory": 10**9, "foreign": True, "slurm_job": "77"}]}]}
    req = ProfileRequest(tool="nsys", command=("true",), run_id="20261130-000000-abcd")
    read = policy.NodeState.read(state)
    lab = profile.entry_for(req, profile.HostRun("h01", "planned", plan("h01", read, req), read))
    # On Slurm the rank plans itself on its node and its result carries what it saw there.
    monkeypatch.setattr(node, "probe", lambda args: state)
    _, context = task.plan_rank(task.TaskArgs({"request": {"tool": "nsys", "run_id": req.run_id}, "report_dir": "/scratch/fleet"}),
                                {"SLURM_JOB_ID": "78", "SLURMD_NODENAME": "node1"}, "rank0", ["true"])
    rank = rank_entry(dict(context, status="ok", rank=0, reports=[]))
    [on_lab], [on_slurm] = lab.processes_seen, rank.processes_seen
    assert set(on_lab.to_json()) == set(on_slurm.to_json()) == {"gpu", "pid", "user", "used_memory", "foreign",
                                                                 "slurm_job"}
    assert (on_lab.pid, on_lab.user, on_slurm.pid, on_slurm.user) == (4242, "bob", 4242, "bob")
    assert (lab.gpu, lab.driver, lab.tool_version) == (rank.gpu, rank.driver, rank.tool_version)
    assert set(lab.to_json()) == set(rank.to_json())


def manifest_of(status: str, *host_statuses: str, slurm: bool = False) -> RunManifest:
    return RunManifest(run_id="20261130-000000-abcd", status=status,
                       hosts=[HostEntry(f"h{i}", s) for i, s in enumerate(host_statuses)],
                       slurm=SlurmInfo(cluster="hpc") if slurm else None)


@pytest.mark.parametrize("m, waited, code", [
    (manifest_of("complete", "ok", "ok"), True, exitcodes.OK),
    (manifest_of("failed", "refused", "refused"), True, exitcodes.REFUSED),
    (manifest_of("partial", "ok", "refused"), True, exitcodes.PARTIAL),
    (manifest_of("failed", "refused", "unreachable"), True, exitcodes.UNREACHABLE),
    (manifest_of("failed", "refused", "failed"), True, exitcodes.FAILED),
    (manifest_of("dry-run", "planned", "planned"), True, exitcodes.OK),
    (manifest_of("dry-run", "planned", "refused"), True, exitcodes.PARTIAL),
    (manifest_of("dry-run", "refused"), True, exitcodes.REFUSED),
    (manifest_of("dry-run", slurm=True), True, exitcodes.OK),
    (manifest_of("submitted", slurm=True), False, exitcodes.OK),          # --no-wait: submitting was asked
    (manifest_of("submitted", slurm=True), True, exitcodes.PARTIAL),      # gather: the job has not ended
    (manifest_of("running", "planned"), True, exitcodes.PARTIAL),
    (manifest_of("cancelled", "ok", "missing", slurm=True), True, exitcodes.FAILED),
    (manifest_of("partial", "ok", "missing", slurm=True), True, exitcodes.PARTIAL),
    (manifest_of("failed", "refused", slurm=True), True, exitcodes.REFUSED),
    (manifest_of("failed", slurm=True), True, exitcodes.FAILED),           # not submitted
])
def test_one_exit_status_for_every_kind_of_run(m, waited, code):
    assert exitcodes.for_run(m, waited=waited) == code


def test_a_rank_entry_is_built_as_main_built_it():
    """A v1 fixture's Slurm result, read again through rank_entry, gives back the entry main wrote."""
    doc = json.loads((V1 / "slurm-missing-rank.json").read_text())
    written = HostEntry.from_json(doc["hosts"][0])
    again = rank_entry(written.result)
    again.reports = written.reports
    assert again == written


def test_a_store_with_slurm_runs_filed_under_the_login_host_still_reads_beside_those_under_the_cluster(tmp_path):
    """Before runs were filed under Slurm's ClusterName they went under the login host's name
    (h01): nothing moves, and both are found by their ids."""
    old = json.loads((V1 / "slurm-missing-rank.json").read_text())
    old_dir = tmp_path / "h01" / old["day"] / old["run_id"]
    old_dir.mkdir(parents=True)
    (old_dir / "manifest.json").write_text(json.dumps(old))
    new = RunManifest(run_id="20261201-090000-beef", site="fleetci", day="2026-12-01", status="complete",
                      hosts=[HostEntry("node1", "ok", rank=0)], slurm=SlurmInfo(cluster="h01", cluster_name="fleetci"))
    store.save(tmp_path, new)
    env = {"FLEET_STORE": str(tmp_path)}
    assert run_fleet("reports", "reindex", env=env).stdout == "catalogued 2 runs\n"
    rows = fleet_json(run_fleet("reports", "ls", "--json", env=env).stdout)
    assert {r["run_id"] for r in rows} == {old["run_id"], new.run_id}
    for run_id, site in ((old["run_id"], "h01"), (new.run_id, "fleetci")):
        shown = fleet_json(run_fleet("reports", "show", run_id, "--json", env=env).stdout)
        assert shown["site"] == site
    assert fleet_json(run_fleet("reports", "show", old["run_id"], "--json", env=env).stdout)["slurm"]["cluster_name"] is None


def test_listing_slurm_jobs_builds_only_the_runs_that_may_still_be_in_slurms_hands(tmp_path, monkeypatch):
    """`fleet jobs` and `fleet gather` look for runs not yet gathered among every manifest of the
    store: finished runs (here 40 Slurm runs and a lab run) are passed over from their status
    alone, never built and checked whole (1 ms each: a store of a few hundred runs made `fleet
    jobs` a second slower). A file that cannot be read is still built, to say so."""
    from fleet.slurm import runs

    tmp_path.chmod(0o700)
    for i in range(40):
        finished = RunManifest(run_id=f"20261201-0900{i:02d}-{i:04x}", site="fleetci", day="2026-12-01",
                               status="complete", hosts=[HostEntry("node1", "ok", rank=0)],
                               slurm=SlurmInfo(cluster="h01", cluster_name="fleetci", job_id=str(100 + i)))
        store.save(tmp_path, finished)
    waiting = RunManifest(run_id="20261201-100000-beef", site="fleetci", day="2026-12-01", status="submitted",
                          hosts=[], slurm=SlurmInfo(cluster="h01", cluster_name="fleetci", job_id="7"))
    store.save(tmp_path, waiting)
    lab = RunManifest(run_id="20261201-100100-1ab0", site="lab", day="2026-12-01", status="complete", hosts=[])
    store.save(tmp_path, lab)
    cut = tmp_path / "fleetci" / "2026-12-01" / "20261201-100200-c0de"
    cut.mkdir(mode=0o700)
    (cut / "manifest.json").write_text('{"run_id": "20261201-100200-c0de", "status": "subm')
    built = []
    real = store.read_manifest
    monkeypatch.setattr(store, "read_manifest", lambda path: built.append(path.parent.name) or real(path))
    skipped = []
    assert [m.run_id for m in runs.stored(tmp_path, on_skipped=skipped.append)] == [waiting.run_id]
    assert sorted(built) == sorted([waiting.run_id, "20261201-100200-c0de"])
    assert len(skipped) == 1 and "20261201-100200-c0de" in skipped[0]
