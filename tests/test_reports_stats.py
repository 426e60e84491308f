"""``fleet reports stats``: a run's top kernels, API calls and NVTX ranges, read from the summaries
in the store. The summaries here are what the real nsys 2025.3 and ncu 2025.3 wrote on an H200
(tests/fixtures), filed as fleet files them; one test reads what a lab run brought home."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

from fleet import exitcodes
from fleet.store.manifest import HostEntry, ReportEntry
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness.store_runs import NSYS, RUN, file_run, nsys_summaries, run_dir, summary

NCU_RAW = REPO / "tests" / "fixtures" / "ncu-raw-h200.csv"
CUTLASS = "void cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>(T1::Params)"
CUTLASS_SHORT = "cutlass::Kernel2<cutlass_80_simt_sgemm_256x128_8x4_nn_align1>"
# h03 of a real lab run, refused beside a tenant, as fleet wrote it (tests/fixtures/manifests-v1)
PARTIAL = json.loads((REPO / "tests" / "fixtures" / "manifests-v1" / "lab-partial.json").read_text())
REFUSED = PARTIAL["hosts"][1]
TENANT = "tenant: GPU 0: pid 22471 (fleettenant, 1.0 GB) belongs to another user"


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
    assert kernels[1].split(None, 3) == ["1752.856", "5151", "0.340", CUTLASS_SHORT]
    assert max(map(len, kernels)) < 140  # the 1,386-character kernel is one short row
    api = section(out.stdout, "CUDA API calls")
    assert api[1].split() == ["1718.424", "5151", "0.334", "cudaDeviceSynchronize"]
    assert len(api) == 1 + 10  # --top 10 of the 18 calls
    assert section(out.stdout, "NVTX ranges")[1].split() == ["2000.180", "1", "2000.180", ":fleet-check"]

    full = section(stats(tmp_path, RUN, "--full-names").stdout, "GPU kernels")
    assert full[1].split(None, 3)[3] == CUTLASS and max(map(len, full)) > 1_386

    doc = fleet_json(stats(tmp_path, RUN, "--top", "1", "--json").stdout, "reports stats")
    assert doc["columns"] == [{"label": "h02", "host": "h02", "rank": None, "worker": None, "status": "ok",
                               "why": None}]
    assert doc["left_out"] == []
    assert doc["kernels"]["rows"] == [{"name": CUTLASS, "short_name": CUTLASS_SHORT, "total_ns": 1752856203.0,
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
    assert out.stdout.splitlines()[1] == "not in these tables: rank 2 missing (killed)"
    kernels = section(out.stdout, "GPU kernels")
    assert kernels[0].split() == ["rank", "0", "ms", "rank", "1", "ms", "NAME"]
    assert kernels[1].split(None, 2) == ["1752.856", "1752.856", CUTLASS_SHORT] and len(kernels) == 3
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
    assert set(doc) == {"run_id", "tool", "status", "top", "columns", "left_out", "kernels"}  # no API or NVTX summary
    with open(NCU_RAW, newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows[0]["gpu__time_duration.sum"] == "us"
    expected = {r["Kernel Name"]: float(r["gpu__time_duration.sum"]) * 1e3 for r in rows[1:]}
    got = {r["name"]: r["total_ns"] for r in doc["kernels"]["rows"]}
    assert got.keys() == expected.keys() and all(abs(got[k] - v) < 1e-6 for k, v in expected.items())
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and "0.014" in out.stdout and "sm80_xmma_gemm_f32f32" in out.stdout
    shorts = {r["short_name"] for r in doc["kernels"]["rows"]}  # ncu's own spelling, shortened alike
    assert "at::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, normal_and_transform<…>(…)…>" in shorts


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
    assert out.returncode == 0 and "\x1b" not in out.stdout and ":\\x1b]0;owned\\x07x" in out.stdout  # shown, not obeyed
    assert fleet_json(stats(tmp_path, RUN, "--json").stdout)["nvtx_ranges"]["rows"][0]["name"] == ":\x1b]0;owned\x07x"


def compare(store_root: Path, *args: str):
    return run_fleet("reports", "compare", *args, "--store", str(store_root))


def test_a_refused_run_says_so_and_why_in_one_line_and_exits_no_reports(tmp_path):
    file_run(tmp_path, [HostEntry.from_json(REFUSED)], tool="ncu")
    for args in ((), ("--json",), ("h03",)):
        out = stats(tmp_path, RUN, *args)
        assert out.returncode == exitcodes.NO_REPORTS == 10 and out.stdout == "", out
        assert out.stderr == f"fleet: run {RUN} (ncu, failed) has no reports to show: h03 refused ({TENANT})\n"


def test_hosts_that_left_nothing_are_folded_by_status_and_reason(tmp_path):
    refused = [HostEntry.from_json(dict(REFUSED, host=f"h0{i}")) for i in (3, 4, 5)]
    gone = HostEntry("h07", "unreachable", missing_why="connection refused")
    file_run(tmp_path, [*refused, gone], tool="ncu")
    out = stats(tmp_path, RUN)
    assert out.returncode == 10 and out.stderr == (f"fleet: run {RUN} (ncu, failed) has no reports to show: "
                                                   f"h[03-05] refused ({TENANT}); h07 unreachable (connection refused)\n")


def test_a_run_whose_hosts_left_reports_but_no_summary_says_what_each_lacks(tmp_path):
    d = run_dir(tmp_path)
    rep = d / "vm" / "vm-1.nsys-rep"
    rep.parent.mkdir(parents=True)
    rep.write_bytes(b"report")
    file_run(tmp_path, [HostEntry("vm", "ok", reports=[ReportEntry(stored=str(rep), status="complete", verified=True)])])
    out = stats(tmp_path, RUN)
    assert out.returncode == 10 and out.stderr == (f"fleet: run {RUN} (nsys, complete) has no reports to show: "
                                                   "vm ok (no cuda_gpu_kern_sum summary was made)\n")


def test_a_partial_run_shows_the_hosts_that_ran_and_names_those_not_in_the_tables(tmp_path):
    d = run_dir(tmp_path)
    file_run(tmp_path, [HostEntry("h02", "ok", reports=[summary(d, "h02", "h02-451", "ncu_raw", NCU_RAW)]),
                        HostEntry.from_json(REFUSED)], tool="ncu")
    out = stats(tmp_path, RUN)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:2] == [f"run {RUN} (ncu, partial): top 10 by total time",
                                           f"not in these tables: h03 refused ({TENANT})"]
    assert section(out.stdout, "GPU kernels")[0].split() == ["TOTAL", "ms", "COUNT", "MEAN", "ms", "NAME"]
    doc = fleet_json(stats(tmp_path, RUN, "--json").stdout)
    assert [c["label"] for c in doc["columns"]] == ["h02"]
    assert doc["left_out"] == [{"label": "h03", "host": "h03", "rank": None, "worker": None, "status": "refused",
                                "why": TENANT}]
    only = stats(tmp_path, RUN, "h03")  # the one asked for left nothing: said, not "no such host"
    assert only.returncode == 10 and only.stderr.endswith(f"has no reports to show: h03 refused ({TENANT})\n")


def test_a_host_in_the_tables_whose_status_is_not_ok_is_said(tmp_path):
    d = run_dir(tmp_path)
    file_run(tmp_path, [HostEntry("h02", "workload-failed", missing_why="the workload exited 3",
                                  reports=nsys_summaries(d, "h02", "h02-1"))])
    out = stats(tmp_path, RUN)
    assert out.returncode == 0 and out.stdout.splitlines()[1] == \
        "in them, though not ok: h02 workload-failed (the workload exited 3)", out.stdout


def test_kernels_whose_short_names_collide_are_told_apart_by_a_tag_of_their_full_name(tmp_path):
    from fleet.kernelnames import tag

    d = run_dir(tmp_path)
    kern = d / "h02" / "h02-1_cuda_gpu_kern_sum.csv"
    kern.parent.mkdir(parents=True)
    with open(NSYS / "with-nvtx_cuda_gpu_kern_sum.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    overload = CUTLASS.replace("(T1::Params)", "(T1::Params, int)")  # another kernel, the same short name
    with open(kern, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows + [dict(rows[0], Name=overload, **{"Total Time (ns)": "5"})])
    file_run(tmp_path, [HostEntry("h02", "ok", reports=[ReportEntry(stored=str(kern), status="summary", verified=True,
                                                                    summary="cuda_gpu_kern_sum")])])
    names = [line.split(None, 3)[3] for line in section(stats(tmp_path, RUN, "--top", "30").stdout, "GPU kernels")[1:]]
    assert f"{CUTLASS_SHORT} #{tag(CUTLASS)}" in names and f"{CUTLASS_SHORT} #{tag(overload)}" in names
    rows = fleet_json(stats(tmp_path, RUN, "--json", "--top", "30").stdout)["kernels"]["rows"]
    assert {r["name"]: r["short_name"] for r in rows}[overload] == f"{CUTLASS_SHORT} #{tag(overload)}"


def file_two(store_root: Path, a_hosts: list[HostEntry], b_hosts: list[HostEntry], a_tool="nsys", b_tool="nsys"):
    b_run = RUN[:-4] + "b000"
    file_run(store_root, a_hosts, tool=a_tool)
    file_run(store_root, b_hosts, tool=b_tool, run_id=b_run)
    return RUN, b_run


def test_compare_refuses_runs_of_different_tools_and_runs_without_reports(tmp_path):
    a = [HostEntry("h02", "ok", reports=nsys_summaries(run_dir(tmp_path), "h02", "h02-1"))]
    run_a, run_b = file_two(tmp_path, a, [HostEntry.from_json(REFUSED)], b_tool="ncu")
    out = compare(tmp_path, run_a, run_b)  # the case: was -100% for every kernel, exit 0
    assert out.returncode == 2 and out.stdout == "" and out.stderr == (
        f"fleet: run {run_a} is an nsys run and run {run_b} an ncu run: they measure kernels differently "
        "(nsys as they run, ncu replayed with clocks locked), so fleet compares runs of one tool\n")

    shutil.rmtree(tmp_path / "lab")
    (tmp_path / "catalog.sqlite").unlink()
    a = [HostEntry("h02", "ok", reports=nsys_summaries(run_dir(tmp_path), "h02", "h02-1"))]
    run_a, run_b = file_two(tmp_path, a, [HostEntry.from_json(REFUSED)])
    for args in ((run_a, run_b), (run_b, run_a), (run_a, run_b, "--json")):
        out = compare(tmp_path, *args)
        assert out.returncode == 10 and out.stdout == "", out
        assert out.stderr == f"fleet: run {run_b} (nsys, failed) has no reports to compare: h03 refused ({TENANT})\n"


def test_compare_shows_short_names_says_what_a_partial_run_lacks_and_keeps_full_names_in_json(tmp_path):
    d = run_dir(tmp_path)
    a = [HostEntry("h02", "ok", reports=nsys_summaries(d, "h02", "h02-1")),
         HostEntry("h04", "ok", reports=nsys_summaries(d, "h04", "h04-1"))]
    db = run_dir(tmp_path, run_id=RUN[:-4] + "b000")
    b = [HostEntry("h02", "ok", reports=nsys_summaries(db, "h02", "h02-2")), HostEntry.from_json(REFUSED)]
    run_a, run_b = file_two(tmp_path, a, b)
    out = compare(tmp_path, run_a, run_b)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # which run is A and which is B, said above the columns that name them (they said neither)
    assert lines[:5] == [f"A: run {run_a} (nsys, complete, 2 host(s) or rank(s))",
                         f"B: run {run_b} (nsys, partial, 1 host(s) or rank(s))",
                         f"run {run_b}: not in its totals: h03 refused ({TENANT})",
                         f"run {run_a} sums 2 host(s) or rank(s), run {run_b} 1",
                         f"{'A ms':>10} {'B ms':>10} {'change':>8}  kernel"]
    assert lines[5].split() == ["3505.712", "1752.856", "-50.0%", CUTLASS_SHORT]
    assert max(map(len, lines)) < 140
    full = compare(tmp_path, run_a, run_b, "--full-names").stdout.splitlines()
    assert full[5].split(None, 3)[3] == CUTLASS and max(map(len, full)) > 1_386
    rows = fleet_json(compare(tmp_path, run_a, run_b, "--json").stdout, "reports compare")
    assert rows[0] == {"kernel": CUTLASS, "short_name": CUTLASS_SHORT, "a_ns": 2 * 1752856203.0,
                       "b_ns": 1752856203.0, "change_ns": -1752856203.0, "change": -0.5}


def test_two_ncu_runs_are_compared_from_their_raw_pages(tmp_path):
    run_b = RUN[:-4] + "b000"
    a = [HostEntry("h02", "ok", reports=[summary(run_dir(tmp_path), "h02", "h02-1", "ncu_raw", NCU_RAW)])]
    b = [HostEntry("h02", "ok", reports=[summary(run_dir(tmp_path, run_id=run_b), "h02", "h02-2", "ncu_raw", NCU_RAW)])]
    file_two(tmp_path, a, b, "ncu", "ncu")
    rows = fleet_json(compare(tmp_path, RUN, run_b, "--json").stdout)
    with open(NCU_RAW, newline="") as f:
        kernels = {r["Kernel Name"] for r in list(csv.DictReader(f))[1:]}
    assert {r["kernel"] for r in rows} == kernels and all(r["change"] == 0 for r in rows)


def test_a_real_history_from_an_h200_reads_short_and_compares_its_planted_slowdown(tmp_path):
    """The store the nightly reference playbook left on an H200 (tests/fixtures/nightly-h200):
    seven runs, the last two with the workload's planted slowdown."""
    from fleet.kernelnames import short_name

    shutil.copytree(REPO / "tests" / "fixtures" / "nightly-h200" / "lab", tmp_path / "lab")
    assert run_fleet("reports", "reindex", "--store", str(tmp_path)).stdout.strip() == "catalogued 7 runs"
    base, slow = "20261130-221709-ccc0", "20261130-221754-b4d4"
    out = stats(tmp_path, slow, "--top", "30")
    assert out.returncode == 0 and not out.stderr, out.stderr
    kernels = section(out.stdout, "GPU kernels")
    doc = fleet_json(stats(tmp_path, slow, "--top", "30", "--json").stdout)
    assert len(kernels) == 1 + len(doc["kernels"]["rows"]) == 1 + 17  # every kernel of the run, one line each
    assert max(map(len, kernels)) <= 40 + 100  # numbers, then a name of at most 100 characters
    longest = max(doc["kernels"]["rows"], key=lambda r: len(r["name"]))
    assert len(longest["name"]) > 1_300 and longest["short_name"] == short_name(longest["name"])
    assert longest["short_name"] in out.stdout and longest["name"] not in out.stdout
    assert longest["name"] in stats(tmp_path, slow, "--top", "30", "--full-names").stdout

    moved = compare(tmp_path, base, slow, "--top", "1")
    gemm = ("sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
            "execute_kernel__5x_cublas")
    assert moved.returncode == 0, moved.stderr
    assert moved.stdout.splitlines()[3].split() == ["216.985", "325.871", "+50.2%", short_name(gemm)]


def test_a_reason_from_a_node_reaches_the_terminal_without_control_characters(tmp_path):
    file_run(tmp_path, [HostEntry("h03", "failed", missing_why="agent said \x1b]0;owned\x07")])
    out = stats(tmp_path, RUN)
    assert out.returncode == 10 and "\x1b" not in out.stderr and "h03 failed (agent said \\x1b]0;owned\\x07)" in out.stderr
