"""``fleet reports ranks``: which rank was slow, and why, from synthetic nsys exports with a planted
cause (tests/harness/nsys_export.py, in nsys's schema), each verdict checked against what was
planted: 8 ranks with one late; clocks skewed by seconds; a missing rank; ranks sharing a GPU
(with each other, or with a tenant); a rank throttled; a CPU gap; NCCL kernels as the sync; the
two-rank run of an H200 test machine. Then the command line and the page in headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from fleet import store
from fleet.analysis import export, ranks
from fleet.analysis.load import analyze_run
from fleet.collection.fetch import sha256_of
from fleet.store.manifest import HostEntry, ReportEntry, RunManifest
from tests.harness.browser import CHROMIUM, screenshot
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness import nsys_export as nx
from tests.harness.rank_plants import UUIDS, eight
from tests.harness.rank_store import RUN, file_run

H200 = json.loads((REPO / "tests" / "fixtures" / "ranks-h200" / "h200-analysis.json").read_text())["data"]


def analysis(root: Path, sync_range: str | None = "sync") -> ranks.Analysis:
    return analyze_run(root, store.load_run(root, RUN), ranks.Source(sync_range), "step")


def causes(v: dict) -> list[str]:
    return [c["cause"] for c in v["causes"]]


def test_eight_ranks_one_late_rank_is_named_with_more_work_and_the_rank_seconds_it_cost(tmp_path):
    a = analysis(file_run(tmp_path, nx.Scenario(eight(), jitter=[0, 150_000, 40_000, 90_000])))
    [v] = a.verdicts
    assert v["rank"] == "rank 5" and v["last"] == 12 == a.collectives and causes(v) == ["more work"]
    assert "60 kernels" in v["causes"][0]["evidence"] and "against 20" in v["causes"][0]["evidence"]
    # Each other rank waited for 40 more kernels of 2.66 ms (and 3 us between them), 12 times.
    planted = 7 * 12 * 40 * (2_660_000 + 3_000) / 1e9
    assert a.lost_s == pytest.approx(planted, rel=0.02)
    assert {r.label: r.last for r in a.ranks}["rank 5"] == 12 and sum(r.last for r in a.ranks) == 12
    assert all(r.steps == 12 and r.kernels in (240, 720) for r in a.ranks)


def test_clocks_skewed_by_seconds_between_ranks_change_nothing(tmp_path):
    straight = analysis(file_run(tmp_path / "a", nx.Scenario(eight())))
    plants = eight()
    for i, p in enumerate(plants):  # up to 7 s apart, either way, as nodes without a common clock
        p.skew_ns = (-1) ** i * i * 1_000_000_000
    skewed = analysis(file_run(tmp_path / "b", nx.Scenario(plants)))
    assert skewed.verdicts == straight.verdicts and skewed.per_collective == straight.per_collective
    assert skewed.lost_s == pytest.approx(straight.lost_s)
    [p] = export.read(tmp_path / "b" / "store" / "cluster" / "2026-12-01" / RUN / "node1" / "rank7.sqlite")
    assert p.kernels[0][0] < 0 and p.epoch_ns < nx.Scenario([]).epoch_ns  # its clock really is 7 s behind


def test_a_missing_rank_is_said_and_when_it_was_the_late_one_the_verdict_points_at_it(tmp_path):
    a = analysis(file_run(tmp_path / "a", nx.Scenario(eight()), missing={2}))
    assert a.missing == [{"label": "rank 2", "why": "the rank left no result"}]
    assert [v["rank"] for v in a.verdicts] == ["rank 5"] and causes(a.verdicts[0]) == ["more work"]
    gone = analysis(file_run(tmp_path / "b", nx.Scenario(eight()), missing={5}))
    [v] = gone.verdicts
    assert causes(v) == ["missing rank"] and "rank 5" in v["causes"][0]["evidence"]
    assert "more work" not in json.dumps(gone.verdicts)


def test_ranks_sharing_a_gpu_are_named_and_their_kernels_not_blamed(tmp_path):
    """Ranks 2 and 3 on one GPU: each one's kernels run 2x as long, the same count. The verdict is
    the shared GPU, never "slower kernels" (which would blame the GPU or its clocks)."""
    plants = [nx.Plant(kernels=20, gpu=g) for g in (0, 1, 2, 2)]
    plants[2].kernel_ns, plants[3].kernel_ns = 5_320_000, 5_330_000
    a = analysis(file_run(tmp_path, nx.Scenario(plants)))
    v = a.verdicts[0]
    assert v["rank"] == "rank 3" and causes(v) == ["shared GPU"]
    assert "shared GPU 2" in v["causes"][0]["evidence"] and "with rank 2 of this job" in v["causes"][0]["evidence"]
    # A result from before fleet recorded conditions: the GPU is known by its bus id, not guessed at.
    old = analysis(file_run(tmp_path / "old", nx.Scenario(plants), conditions=False)).verdicts[0]
    assert "shared the GPU at 0000:1a:00.0 (" in old["causes"][0]["evidence"] and old["gpu"]["index"] is None


def test_a_tenant_on_the_late_ranks_gpu_is_named_from_what_fleet_recorded(tmp_path):
    plants = [nx.Plant(kernels=20, gpu=g) for g in range(4)]
    plants[1].kernel_ns = 4_000_000  # slowed by another user's process on its GPU
    tenant = {1: [{"gpu": 1, "pid": 7771, "user": "bob", "used_memory": 1 << 30, "foreign": True}]}
    conditions = {1: {"gpus": [{"index": 1, "uuid": "GPU-" + UUIDS[1]}], "samples": [
        {"t": t, "gpu": 1, "sm_clock_mhz": 1980, "throttle": [], "processes": [
            {"pid": 4001, "user": "ana", "own": True}, {"pid": 7772, "user": "carol", "own": False}]}
        for t in range(3)]}}
    v = analysis(file_run(tmp_path, nx.Scenario(plants), processes=tenant, conditions=conditions)).verdicts[0]
    assert v["rank"] == "rank 1" and causes(v) == ["shared GPU"] and v["gpu"]["index"] == 1
    assert "pid 7771 (bob)" in v["causes"][0]["evidence"] and "pid 7772 (carol)" in v["causes"][0]["evidence"]


def test_a_throttled_rank_has_slower_kernels_and_its_clocks_as_the_evidence(tmp_path):
    plants = [nx.Plant(kernels=20, gpu=g) for g in range(8)]
    plants[6].kernel_ns = 4_000_000
    conditions = {r: {"gpus": [{"index": r, "uuid": "GPU-" + UUIDS[r]}], "samples": [
        {"t": t, "gpu": r, "sm_clock_mhz": 1100 if r == 6 else 1980,
         "throttle": ["HwSlowdown", "SwThermalSlowdown"] if r == 6 else ["GpuIdle"]} for t in range(4)]}
        for r in range(8)}
    [v] = analysis(file_run(tmp_path, nx.Scenario(plants), conditions=conditions)).verdicts
    assert v["rank"] == "rank 6" and causes(v) == ["slower kernels", "clocks or throttling"]
    clocks = v["causes"][1]["evidence"]
    assert "GPU 6" in clocks and "HwSlowdown, SwThermalSlowdown" in clocks and "4 of 4 samples" in clocks
    assert "1100 MHz against 1980 MHz" in clocks


def look_line(host: str, t: float, gpus: list[dict]) -> str:
    """One line of ``fleet top --record FILE``, as top writes it (fleet/cli/top.py's _view_json)."""
    return json.dumps({"host": host, "seq": 0, "time": t, "error": None, "stale": False, "gpus": gpus}) + "\n"


def recorded_gpu(host: str, r: int, clock: int, throttle: list[str], processes=()) -> dict:
    return {"host": host, "index": r % 4, "name": "NVIDIA H200", "uuid": "GPU-" + UUIDS[r], "memory_used": 0,
            "memory_total": 1, "activity": {}, "conditions": {"sm_clock_mhz": clock, "throttle": throttle},
            "processes": list(processes), "unseen": [], "ncu": "refused", "ncu_reasons": [], "free": False}


def test_a_look_recorded_beside_a_run_without_conditions_gives_the_throttled_ranks_clocks(tmp_path):
    """A run whose ranks carry no conditions (fleet's watch did not run there), and a `fleet top
    --record` kept beside it: each rank's GPU, found by its UUID, at the times it ran, gives the
    throttled rank's clocks and the tenant that was on another's GPU as evidence; samples outside
    the run, or of another host, count for nothing."""
    plants = [nx.Plant(kernels=20, gpu=g) for g in range(8)]
    plants[6].kernel_ns = 4_000_000
    root = file_run(tmp_path, nx.Scenario(plants), conditions=False)
    start = nx.Scenario(plants).epoch_ns / 1e9
    lines = []
    for t in (start - 3600, start + 1.3, start + 3600):  # an hour before, while it ran (from 1 s on), an hour after
        during = t == start + 1.3
        for node in ("node0", "node1", "node9"):
            gpus = [recorded_gpu(node, r, 1100 if r == 6 and during else 1980,
                                 ["HwSlowdown"] if r == 6 and during else ["GpuIdle"],
                                 # the run's own user's process, called foreign by a look another ran
                                 [{"pid": 4242, "user": "ana", "foreign": True}] if r == 6 else [])
                    for r in range(8) if f"node{r // 4}" == node or node == "node9"]
            lines.append(look_line(node, t, gpus))
    lines.append("not json\n")
    lines.append('{"host": "node1", "time": 1%s, "gpus": %s}\n' % ("0" * 400, json.dumps([recorded_gpu("node1", 6, 1, [])])))
    lines.append(look_line("node1", start + 1.3, [dict(recorded_gpu("node1", 7, 1980, []),
                                                      conditions={"throttle": 5, "sm_clock_mhz": "fast"})]))
    lines.append(look_line("node1", start + 1.3, []) + json.dumps({"host": "node1", "time": 1, "error": "gone",
                                                                   "gpus": []}) + "\n")  # a host's error
    record = tmp_path / "look.jsonl"
    record.write_text("".join(lines))
    out = run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--record", str(record), "--json",
                    "--store", str(root))
    assert out.returncode == 0, out.stderr
    found = fleet_json(out.stdout)
    [v] = found["verdicts"]
    assert v["rank"] == "rank 6" and causes(v) == ["slower kernels", "clocks or throttling"], v
    assert "HwSlowdown" in v["causes"][1]["evidence"] and "1 of 1 samples" in v["causes"][1]["evidence"], v
    assert "1100 MHz against 1980 MHz" in v["causes"][1]["evidence"]
    assert any("matched to 8 of 8 rank(s)" in n and "2 line(s)" in n for n in found["notes"]), found["notes"]
    without = fleet_json(run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--json",
                                   "--store", str(root)).stdout)
    assert causes(without["verdicts"][0]) == ["slower kernels"]  # no conditions of its own: no clocks


def test_a_record_that_is_not_a_file_is_one_line_and_analyses_nothing(tmp_path):
    root = file_run(tmp_path, nx.Scenario(eight()), conditions=False)
    out = run_fleet("reports", "ranks", RUN, "--record", str(tmp_path / "nosuch.jsonl"), "--store", str(root))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "nosuch.jsonl" in out.stderr, out.stderr


def test_a_cpu_gap_before_the_collective_is_the_cause_when_the_gpu_sat_idle(tmp_path):
    plants = eight()
    plants[5] = nx.Plant(kernels=20, gpu=5, gap_ns=120_000_000)
    [v] = analysis(file_run(tmp_path, nx.Scenario(plants))).verdicts
    assert v["rank"] == "rank 5" and causes(v) == ["CPU gap"] and "idle 12" in v["causes"][0]["evidence"]


def test_nccl_kernels_are_the_collectives_when_no_range_is_named(tmp_path):
    a = analysis(file_run(tmp_path, nx.Scenario(eight(late=2), sync="nccl")), sync_range=None)
    assert a.source == "NCCL kernels" and a.verdicts[0]["rank"] == "rank 2" and causes(a.verdicts[0]) == ["more work"]
    assert all(r.kernels == (60 if r.label == "rank 2" else 20) * 12 + 12 for r in a.ranks)  # NCCL kernels too


def lab_run(tmp_path: Path, scenario: nx.Scenario, mark_rank: bool = True) -> Path:
    """A lab run as fleet profile of torchrun makes it: one nsys over the launcher, one export
    holding the launcher (pid 3999) and every worker; the run asked for GPU 0."""
    root = tmp_path / "store"
    m = RunManifest(run_id=RUN, site="lab", day="2026-12-01", request={"tool": "nsys", "gpus": [0]},
                    status="complete", hosts=[HostEntry("h01", "ok")])
    directory = store.save(root, m)
    (directory / "h01").mkdir()
    path = nx.write(directory / "h01" / "vm-3999.sqlite", scenario, list(range(len(scenario.plants))),
                    nx.recorded_schema(), nx.recorded_names(), UUIDS, mark_rank=mark_rank, launcher=3999)
    m.hosts[0].reports = [ReportEntry(stored=str(path), size=path.stat().st_size, sha256=sha256_of(path),
                                      status="export", verified=True, summary="sqlite")]
    store.save(root, m)
    return root


def test_one_export_of_a_launcher_and_its_workers_is_split_into_ranks_by_their_marks(tmp_path):
    plants = [nx.Plant(kernels=20, kernel_ns=5_180_000), nx.Plant(kernels=60)]
    a = analysis(lab_run(tmp_path / "a", nx.Scenario(plants)))
    assert [r.label for r in a.ranks] == ["rank 0", "rank 1"]  # the launcher did no GPU work: no rank
    assert a.verdicts[0]["rank"] == "rank 1" and "shared GPU 0" in a.verdicts[0]["causes"][0]["evidence"]
    unmarked = analysis(lab_run(tmp_path / "b", nx.Scenario(plants), mark_rank=False))
    assert [r.label for r in unmarked.ranks] == ["h01 pid 4000", "h01 pid 4001"]
    assert unmarked.verdicts[0]["rank"] == "h01 pid 4001"


def launched_run(tmp_path: Path, scenario: nx.Scenario, launcher: str | None, host: str = "h02") -> Path:
    """A lab run of ``fleet profile --launcher torchrun``: each worker under its own nsys, its report
    named by its rank (``h02/rank1.sqlite``), the workers marking no rank; ``launcher`` None: the same
    files in a run fleet did not launch (a host whose reports are so named by chance)."""
    root = tmp_path / "store"
    plan = {"command": {"launcher": [launcher, "--nproc-per-node", "2"]}} if launcher else {"command": {}}
    m = RunManifest(run_id=RUN, site="lab", day="2026-12-01", request={"tool": "nsys", "gpus": [0]},
                    status="complete", hosts=[HostEntry(host, "ok", plan=plan)])
    directory = store.save(root, m)
    (directory / host).mkdir()
    for r in range(len(scenario.plants)):
        path = nx.write(directory / host / f"rank{r}.sqlite", scenario, r, nx.recorded_schema(), nx.recorded_names(),
                        UUIDS, mark_rank=False)
        m.hosts[0].reports.append(ReportEntry(stored=str(path), size=path.stat().st_size, sha256=sha256_of(path),
                                              status="export", verified=True, summary="sqlite"))
    store.save(root, m)
    return root


def test_ranks_a_launcher_started_each_under_nsys_are_named_by_their_reports_with_the_pid_beside(tmp_path):
    plants = [nx.Plant(kernels=20), nx.Plant(kernels=20), nx.Plant(kernels=60)]
    root = launched_run(tmp_path / "a", nx.Scenario(plants), "torchrun")
    a = analysis(root)
    assert [(r.label, r.rank) for r in a.ranks] == [("rank 0", 0), ("rank 1", 1), ("rank 2", 2)]
    assert a.verdicts[0]["rank"] == "rank 2" and not a.notes
    out = run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--store", str(root))
    assert out.returncode == 0, out.stderr
    pids = {r.label: r.pid for r in a.ranks}
    assert re.search(rf"^rank 2 +h02 +{pids['rank 2']} +0 .* 12 of 12$", out.stdout, re.M), out.stdout
    assert out.stdout.splitlines()[1].split()[:4] == ["RANK", "HOST", "PID", "GPU"]
    # Not launched by fleet: a report's name is no rank (the host may be named rank1 itself).
    unlaunched = analysis(launched_run(tmp_path / "b", nx.Scenario(plants), None))
    assert [r.label for r in unlaunched.ranks] == [f"h02 pid {pids[f'rank {i}']}" for i in range(3)]


def test_a_blocking_call_is_the_sync_where_only_gloo_is_traced_and_the_launcher_is_no_rank(tmp_path):
    root = lab_run(tmp_path, nx.Scenario([nx.Plant(kernels=20, kernel_ns=5_180_000), nx.Plant(kernels=60)],
                                         sync="osrt"))
    a = analyze_run(root, store.load_run(root, RUN), ranks.Source(sync_call="pthread_cond_wait"), "step")
    assert a.source == "blocking calls pthread_cond_wait" and [r.label for r in a.ranks] == ["rank 0", "rank 1"]
    assert a.collectives == 12 and a.verdicts[0]["rank"] == "rank 1" and not a.notes
    assert [c["cause"] for c in a.verdicts[0]["causes"]] == ["shared GPU", "more work"]


def test_the_h200_run_two_ranks_on_one_gpu_rank_1_with_3x_the_products(tmp_path):
    """As recorded on an H200 (tests/fixtures/ranks-h200/h200-analysis.json): both ranks on GPU 0,
    rank 1 with 60 products a step against 20, whose kernels then ran at 3.76 ms against 5.9 ms
    (the waiting rank's looked slower: they shared the GPU). The same verdict from the same shape."""
    recorded = {r["label"]: r for r in H200["ranks"]}
    plants = [nx.Plant(kernels=20, kernel_ns=int(recorded["rank 0"]["kernel_s"] / recorded["rank 0"]["kernels"] * 1e9)),
              nx.Plant(kernels=60, kernel_ns=int(recorded["rank 1"]["kernel_s"] / recorded["rank 1"]["kernels"] * 1e9))]
    a = analysis(file_run(tmp_path, nx.Scenario(plants)))
    [v] = a.verdicts
    assert (v["rank"], causes(v)) == (H200["straggler"], [c["cause"] for c in H200["verdicts"][0]["causes"]])
    assert causes(v) == ["shared GPU", "more work"] and "shared GPU 0" in v["causes"][0]["evidence"]
    assert a.lost_s == pytest.approx(H200["lost_s"], rel=0.1)


def test_the_command_prints_the_table_the_verdict_and_json_in_fleets_envelope(tmp_path):
    root = file_run(tmp_path, nx.Scenario(eight()), missing={7})
    out = run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--store", str(root))
    assert out.returncode == 0, out.stderr
    assert re.search(r"^run \S+: 7 ranks, 12 collectives from NVTX range 'sync'; [\d.]+ rank-seconds lost waiting$",
                     out.stdout, re.M)
    assert re.search(r"^rank 5 +node1 +\d+ +5 .* 12 of 12$", out.stdout, re.M)
    assert "straggler: rank 5, last in 12 of 12 collectives" in out.stdout and "  more work: 60 kernels" in out.stdout
    assert "no export: rank 7 (the rank left no result)" in out.stdout
    data = fleet_json(run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--store", str(root),
                                "--json").stdout, "reports ranks")
    assert data["straggler"] == "rank 5" and data["collectives"] == 12 and len(data["ranks"]) == 7
    assert data["verdicts"][0]["causes"][0]["cause"] == "more work"
    assert [r["last_share"] for r in data["ranks"] if r["label"] == "rank 5"] == [1.0]
    none = run_fleet("reports", "ranks", RUN, "--store", str(root))  # no NCCL kernels and no range named
    assert none.returncode == 2 and none.stderr.startswith("fleet: no NCCL kernels on two ranks or more: name")
    assert "Traceback" not in none.stderr
    both = run_fleet("reports", "ranks", RUN, "--sync-range", "a", "--sync-call", "b", "--store", str(root))
    assert both.returncode != 0 and "give one" in both.stderr


def test_a_run_without_exports_and_a_file_that_is_no_export_get_one_line(tmp_path):
    root = tmp_path / "store"
    m = RunManifest(run_id=RUN, site="lab", day="2026-12-01", request={"tool": "nsys"}, status="complete",
                    hosts=[HostEntry("h01", "ok")])
    directory = store.save(root, m)
    out = run_fleet("reports", "ranks", RUN, "--store", str(root))
    assert out.returncode != 0 and out.stderr.strip().startswith(f"fleet: run {RUN} has no SQLite export")
    bogus = directory / "h01" / "r.sqlite"
    bogus.parent.mkdir()
    bogus.write_text("not a database")
    m.hosts[0].reports = [ReportEntry(stored=str(bogus), status="export", verified=True, summary="sqlite")]
    store.save(root, m)
    out = run_fleet("reports", "ranks", RUN, "--store", str(root))
    assert out.returncode != 0 and "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr



def test_the_page_shows_each_ranks_timeline_the_straggler_highlighted_and_its_waits(tmp_path):
    root = file_run(tmp_path, nx.Scenario(eight()))
    page = tmp_path / "site" / "ranks.html"
    page.parent.mkdir()
    out = run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--store", str(root), "--html", str(page))
    assert out.returncode == 0 and f"page: {page}" in out.stdout, out.stderr
    assert CHROMIUM, "chromium is not installed: scripts/test installs it (Debian's chromium package)"
    png = tmp_path / "ranks.png"
    dom = screenshot(page, png, "1100,1200")
    rows = re.findall(r'<g class="rank-row( straggler)?" data-rank="([^"]*)"', dom)
    assert [label for _, label in rows] == [f"rank {r}" for r in range(8)]
    assert [label for late, label in rows if late] == ["rank 5"]
    assert dom.count('class="step"') == 8 * 12 and dom.count('class="wait"') == 8 * 12
    bars = re.findall(r'<rect class="wait-bar" data-rank="([^"]*)" data-collective="\d+" [^>]*height="([\d.]+)"', dom)
    assert len(bars) == 8 * 12
    late = [float(h) for label, h in bars if label == "rank 5"]
    assert max(late) < min(float(h) for label, h in bars if label != "rank 5")  # the shortest waits: its own
    assert re.search(r'<tr class="rank straggler"><td>rank 5</td>', dom)
    assert "<script" not in dom and "http" not in dom
    assert png.stat().st_size > 10_000


def test_the_real_exports_of_two_ranks_recorded_on_an_h200_name_rank_1_with_more_work(tmp_path):
    """tests/fixtures/ranks-h200/recorded/: the two SQLite exports nsys 2025.3.1 wrote on an H200
    (scripts/gpu-node/ranks-check.sh; rank 1 does 3x the matrix products, a gloo all-reduce in an
    NVTX range `sync`, both ranks on GPU 0), read as they are."""
    recorded = REPO / "tests" / "fixtures" / "ranks-h200" / "recorded"
    root = tmp_path / "store"
    m = RunManifest(run_id=RUN, site="lab", day="2026-12-01", started="2026-12-01T13:18:50", user="root",
                    request={"tool": "nsys"}, status="complete")
    directory = store.save(root, m)
    (directory / "vm").mkdir()
    gpu = {"gpus": [{"index": 0, "uuid": "GPU-7ad7e474-b7a2-3fd1-a48b-45288deae15e"}], "samples": []}
    for r in (0, 1):
        path = directory / "vm" / f"rank{r}.sqlite"
        shutil.copy(recorded / f"rank{r}.sqlite", path)
        rep = ReportEntry(remote=f"/r/vm/rank{r}.sqlite", stored=str(path), size=path.stat().st_size,
                          sha256=sha256_of(path), status="export", verified=True, summary="sqlite")
        m.hosts.append(HostEntry("vm", "ok", rank=r, node="vm", gpu="NVIDIA H200", reports=[rep],
                                 result={"conditions": gpu}))
    store.save(root, m)
    a = analysis(root)
    [v] = a.verdicts
    assert v["rank"] == "rank 1" and v["last"] == v["of"] == 12 and causes(v) == ["shared GPU", "more work"], v
    assert "shared GPU 0" in v["causes"][0]["evidence"]
    assert 1.0 < a.lost_s < 1.5  # 1.232 rank-seconds on the H200 itself


def test_reports_ranks_example_reads_the_recorded_h200_exports_and_writes_nothing(tmp_path):
    """`fleet reports ranks --example DIR`: the two exports recorded on an H200, analysed as a run of
    the store would be, with no multi-rank job of one's own; the user's store is left untouched.
    Before, `reports ranks` could not be tried at all without such a job."""
    recorded = str(REPO / "tests" / "fixtures" / "ranks-h200" / "recorded")
    root = tmp_path / "store"
    out = run_fleet("reports", "ranks", "--example", recorded, "--store", str(root))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("run example-h200: 2 ranks, 12 collectives from NVTX range 'sync'"), out.stdout
    assert "straggler: rank 1, last in 12 of 12 collectives" in out.stdout
    assert "  shared GPU: " in out.stdout and "  more work: " in out.stdout
    doc = fleet_json(run_fleet("reports", "ranks", "--example", recorded, "--json", "--store", str(root)).stdout)
    assert doc["run_id"] == "example-h200" and [v["rank"] for v in doc["verdicts"]] == ["rank 1"]
    assert not root.exists()  # nothing filed in the user's store
    for args in (("RUN", "--example", recorded), ("--example", str(tmp_path)), ()):
        wrong = run_fleet("reports", "ranks", *args)
        assert wrong.returncode == 2 and wrong.stderr.count("\n") == 1 and "--example" in wrong.stderr, wrong.stderr


def test_nightly_reads_the_node_record_a_playbook_names_for_each_runs_straggler(tmp_path):
    """`ranks: {record: FILE}` in a playbook: the straggler share of a run without conditions of
    its own takes the throttled GPU's clocks from the look kept beside it."""
    from fleet.nightly import stragglers

    plants = [nx.Plant(kernels=20, gpu=g) for g in range(8)]
    plants[6].kernel_ns = 4_000_000
    root = file_run(tmp_path, nx.Scenario(plants), conditions=False)
    during = nx.Scenario(plants).epoch_ns / 1e9 + 1.3
    record = tmp_path / "look.jsonl"
    record.write_text("".join(look_line(node, during, [recorded_gpu(node, r, 1100 if r == 6 else 1980,
                                                                   ["HwSlowdown"] if r == 6 else [])
                                                      for r in range(8) if f"node{r // 4}" == node])
                              for node in ("node0", "node1")))
    m = store.load_run(root, RUN)
    plain = stragglers.of_run(root, m, {"sync_range": "sync"})
    kept = stragglers.of_run(root, m, {"sync_range": "sync", "record": str(record)})
    assert plain["straggler"] == kept["straggler"] == "rank 6"
    assert plain["causes"] == ["slower kernels"] and kept["causes"] == ["slower kernels", "clocks or throttling"]
    assert "note" in stragglers.of_run(root, m, {"sync_range": "sync", "record": str(tmp_path / "nosuch")})
