"""``fleet reports stats``: a run's top kernels, API calls and NVTX ranges, read from the summaries
in the store. The summaries here are what the real nsys 2025.3 and ncu 2025.3 wrote on an H200
(tests/fixtures), filed as fleet files them; one test reads what a lab run brought home."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

from fleet import store
from fleet.store.collect import sha256_of
from fleet.store.manifest import HostEntry, ReportEntry, RunManifest
from tests.conftest import REPO, fleet_json, run_fleet

NSYS = REPO / "tests" / "fixtures" / "nsys-2025.3-h200"
NCU_RAW = REPO / "tests" / "fixtures" / "ncu-raw-h200.csv"
CUTLASS = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"
RUN = "20261130-173936-5586"


def summary(directory: Path, host: str, base: str, name: str, source: Path) -> ReportEntry:
    """A summary CSV filed in the store as a run files it: RUN_DIR/HOST/BASE_NAME.csv."""
    target = directory / host / f"{base}_{name}.csv"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return ReportEntry(remote=f"/node/{target.name}", stored=str(target), size=target.stat().st_size,
                       sha256=sha256_of(target), status="summary", verified=True, summary=name)


def nsys_summaries(directory: Path, host: str, base: str, nvtx: str = "with-nvtx") -> list[ReportEntry]:
    return [summary(directory, host, base, "cuda_gpu_kern_sum", NSYS / "with-nvtx_cuda_gpu_kern_sum.csv"),
            summary(directory, host, base, "cuda_api_sum", NSYS / "with-nvtx_cuda_api_sum.csv"),
            summary(directory, host, base, "nvtx_sum", NSYS / f"{nvtx}_nvtx_sum.csv")]


def file_run(store_root: Path, hosts: list[HostEntry], *, site: str = "lab", tool: str = "nsys",
             run_id: str = RUN) -> RunManifest:
    m = RunManifest(run_id, site=site, day="2026-11-30", started="2026-11-30T17:39:36+0000", user="ana",
                    request={"tool": tool, "command": ["python3", "app.py"]}, status="complete", hosts=hosts)
    store.save(store_root, m)
    return m


def run_dir(store_root: Path, site: str = "lab", run_id: str = RUN) -> Path:
    return store.run_dir(store_root, site, run_id)


def section(text: str, title: str) -> list[str]:
    """The lines under a section's title, up to the blank line that ends it."""
    lines = text.splitlines()
    rest = lines[lines.index(title) + 1:]
    return rest[:rest.index("")] if "" in rest else rest


def stats(store_root: Path, *args: str):
    return run_fleet("reports", "stats", *args, "--store", str(store_root))


def test_one_lab_host_shows_what_nsys_wrote_with_totals_counts_and_means(tmp_path):
    file_run(tmp_path, [HostEntry("h02", "ok", reports=nsys_summaries(run_dir(tmp_path), "h02", "h02-2617"))])
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert out.stdout.splitlines()[0] == f"run {RUN} (nsys, complete): top 10 by total time"
    kernels = section(out.stdout, "GPU kernels")
    assert kernels[0].split() == ["TOTAL", "ms", "COUNT", "MEAN", "ms", "NAME"]
    assert kernels[1].split(None, 3) == ["1752.856", "5151", "0.340", CUTLASS]
    api = section(out.stdout, "CUDA API calls")
    assert api[1].split() == ["1718.424", "5151", "0.334", "cudaDeviceSynchronize"]
    assert len(api) == 1 + 10  # --top 10 of the 18 calls
    assert section(out.stdout, "NVTX ranges")[1].split() == ["2000.180", "1", "2000.180", ":fleet-check"]

    doc = fleet_json(stats(tmp_path, RUN, "--top", "1", "--json").stdout, "reports stats")
    assert doc["columns"] == [{"label": "h02", "host": "h02", "rank": None, "worker": None}]
    assert doc["kernels"]["rows"] == [{"name": CUTLASS, "total_ns": 1752856203.0,
                                      "by": {"h02": {"total_ns": 1752856203.0, "count": 5151}}}]
    assert [r["name"] for r in doc["api_calls"]["rows"]] == ["cudaDeviceSynchronize"]
    assert doc["nvtx_ranges"] == {"rows": [{"name": ":fleet-check", "total_ns": 2000179546.0,
                                            "by": {"h02": {"total_ns": 2000179546.0, "count": 1}}}], "notes": {}}


def test_the_empty_nvtx_summary_of_a_workload_without_ranges_reads_no_nvtx_ranges(tmp_path):
    reports = nsys_summaries(run_dir(tmp_path), "h02", "h02-1", nvtx="without-nvtx")
    assert Path(reports[2].stored).stat().st_size == 0  # as nsys 2025.3 wrote it
    file_run(tmp_path, [HostEntry("h02", "ok", reports=reports)])
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and not out.stderr, out.stderr
    assert out.stdout.rstrip().endswith("NVTX ranges\nh02: no NVTX ranges"), out.stdout
    doc = fleet_json(stats(tmp_path, RUN, "--json").stdout)
    assert doc["nvtx_ranges"] == {"rows": [], "notes": {"h02": "no NVTX ranges"}}
    assert doc["kernels"]["rows"][0]["name"] == CUTLASS


def test_slurm_ranks_are_side_by_side_and_one_rank_or_node_can_be_chosen(tmp_path):
    d = run_dir(tmp_path, "fleetci")
    file_run(tmp_path, [HostEntry("node1", "ok", rank=0, reports=nsys_summaries(d, "node1", "rank0")),
                        HostEntry("node2", "ok", rank=1, reports=nsys_summaries(d, "node2", "rank1", "without-nvtx")),
                        HostEntry("(no result)", "missing", rank=2, missing_why="killed")], site="fleetci")
    out = stats(tmp_path, RUN, "--top", "2")
    assert out.returncode == 0, out.stderr
    kernels = section(out.stdout, "GPU kernels")
    assert kernels[0].split() == ["rank", "0", "ms", "rank", "1", "ms", "NAME"]
    assert kernels[1].split(None, 2) == ["1752.856", "1752.856", CUTLASS] and len(kernels) == 3
    nvtx = section(out.stdout, "NVTX ranges")
    assert nvtx[1].split() == ["2000.180", "-", ":fleet-check"] and nvtx[2] == "rank 1: no NVTX ranges"

    for which, labels in (("1", ["rank 1"]), ("node1", ["rank 0"]), (None, ["rank 0", "rank 1"])):
        doc = fleet_json(stats(tmp_path, RUN, *([which] if which else []), "--json").stdout)
        assert [c["label"] for c in doc["columns"]] == labels
    assert fleet_json(stats(tmp_path, RUN, "--json").stdout)["kernels"]["rows"][0]["total_ns"] == 2 * 1752856203.0

    for which in ("7", "node9", "../h02"):
        bad = stats(tmp_path, RUN, which)
        assert bad.returncode == 2 and bad.stdout == "", bad
        assert bad.stderr == (f"fleet: run {RUN} has no host or rank {which!r} with reports; "
                              "it has: node1, node2, rank 0, rank 1\n")


def test_an_ncu_run_shows_its_kernels_from_the_raw_page_in_the_unit_ncu_gave(tmp_path):
    d = run_dir(tmp_path)
    file_run(tmp_path, [HostEntry("h02", "ok", reports=[summary(d, "h02", "h02-451", "ncu_raw", NCU_RAW)])], tool="ncu")
    doc = fleet_json(stats(tmp_path, RUN, "--json").stdout)
    assert set(doc) == {"run_id", "tool", "status", "top", "columns", "kernels"}  # ncu has no API or NVTX summary
    with open(NCU_RAW, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["gpu__time_duration.sum"] == "us"
    expected = {r["Kernel Name"]: float(r["gpu__time_duration.sum"]) * 1e3 for r in rows[1:]}
    got = {r["name"]: r["total_ns"] for r in doc["kernels"]["rows"]}
    assert got.keys() == expected.keys() and all(abs(got[k] - v) < 1e-6 for k, v in expected.items())
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and "0.014" in out.stdout and "sm80_xmma_gemm_f32f32" in out.stdout


def test_summaries_missing_unreadable_or_outside_the_store_are_said_and_the_rest_shown(tmp_path):
    d = run_dir(tmp_path)
    reports = nsys_summaries(d, "h02", "h02-1")
    reports[1] = ReportEntry(remote="/node/h02-1_cuda_api_sum.csv", stored=str(d / "h02" / "h02-1_cuda_api_sum.csv"),
                             status="summary", summary="cuda_api_sum", error="No such file or directory")
    outside = tmp_path.parent / f"{tmp_path.name}-elsewhere.csv"
    outside.write_text("Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Style,Range\n"
                       "1,5,1,5,5,5,5,0,PushPop,secret\n")
    reports[2].stored = str(outside)
    garbled = d / "h03" / "h03-1_cuda_gpu_kern_sum.csv"
    garbled.parent.mkdir()
    garbled.write_text("Kernel,Time\nk,1\n")
    file_run(tmp_path, [HostEntry("h02", "ok", reports=reports),
                        HostEntry("h03", "ok", reports=[ReportEntry(stored=str(garbled), status="summary",
                                                                    verified=True, summary="cuda_gpu_kern_sum")])])
    doc = fleet_json(stats(tmp_path, RUN, "--json").stdout)
    assert doc["kernels"]["rows"][0]["by"] == {"h02": {"total_ns": 1752856203.0, "count": 5151}}
    assert doc["kernels"]["notes"] == {"h03": "h03-1_cuda_gpu_kern_sum.csv cannot be read: no column "
                                              "'Total Time (ns)', 'Name', 'Instances' (it has Kernel, Time)"}
    assert doc["api_calls"]["notes"] == {
        "h02": "its cuda_api_sum summary is not in the store (No such file or directory)",
        "h03": "no cuda_api_sum summary was made"}
    assert doc["nvtx_ranges"]["notes"]["h02"] == "its nvtx_sum summary is named outside the store: not read"
    assert doc["nvtx_ranges"]["rows"] == []
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and "Traceback" not in out.stderr and "secret" not in out.stdout


def test_a_run_id_that_is_no_run_or_a_pattern_is_one_line_and_exit_2(tmp_path):
    file_run(tmp_path, [HostEntry("h02", "ok", reports=nsys_summaries(run_dir(tmp_path), "h02", "h02-1"))])
    for run_id, said in ((RUN[:-1] + "0", f"no run '{RUN[:-1]}0' in {tmp_path}"),
                         ("2026*", "(run ids are exact, never patterns)")):
        out = stats(tmp_path, run_id)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
        assert out.stderr.startswith("fleet: ") and said in out.stderr
    assert stats(tmp_path, RUN, "--top", "0").returncode == 2


def test_names_from_the_workload_reach_the_terminal_without_control_characters(tmp_path):
    d = run_dir(tmp_path)
    nvtx = d / "h02" / "h02-1_nvtx_sum.csv"
    nvtx.parent.mkdir(parents=True)
    nvtx.write_text((NSYS / "with-nvtx_nvtx_sum.csv").read_text().replace(":fleet-check", ":\x1b]0;owned\x07x"))
    file_run(tmp_path, [HostEntry("h02", "ok", reports=[ReportEntry(stored=str(nvtx), status="summary", verified=True,
                                                                    summary="nvtx_sum")])])
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and "\x1b" not in out.stdout and ":?]0;owned?x" in out.stdout
    assert fleet_json(stats(tmp_path, RUN, "--json").stdout)["nvtx_ranges"]["rows"][0]["name"] == ":\x1b]0;owned\x07x"
