"""The nightly report of a real history: the reference playbook run seven times on an H200
test machine, the last two with its planted slowdown (tests/fixtures/nightly-h200/). The store
is copied to another place, catalogued again there, judged, and the page opened in headless
Chromium as a person would look at it."""

from __future__ import annotations

import html
import json
import os
import re
import shutil
from pathlib import Path
from urllib.parse import unquote

from fleet.kernelnames import WIDTH, short_name
from tests.conftest import REPO
from tests.harness.browser import CHROMIUM, screenshot
from tests.harness.store_runs import judged_copy

FIXTURE = REPO / "tests" / "fixtures" / "nightly-h200"
RUNS = ["20261130-221624-9aa0", "20261130-221639-6cb5", "20261130-221655-4d61", "20261130-221709-ccc0",
        "20261130-221723-ea81", "20261130-221738-3236", "20261130-221754-b4d4"]
GEMM = "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"


def test_the_h200_history_is_judged_a_regression_and_drawn_with_its_times_band_and_kernels(tmp_path):
    r, out = judged_copy(FIXTURE, tmp_path / "moved store", runs=7)
    assert r.returncode == 7, r.stdout + r.stderr
    verdicts = {v["metric"]: v for v in json.loads(out.with_suffix(".json").read_text())["playbooks"][0]["verdicts"]}
    assert verdicts["kernel *gemm*"]["verdict"] == "Regression" and verdicts["kernel *gemm*"]["points"] == 7
    assert "REGRESSION reference: kernel *gemm* on NVIDIA H200 on vm +49.9%" in r.stdout
    assert CHROMIUM, "chromium is not installed: scripts/test installs it (Debian's chromium package)"
    png = tmp_path / "nightly-h200.png"
    dom = screenshot(out, png)
    # Runs a quarter of a minute apart: the ticks are times of day, each its own, the day in the caption.
    ticks = re.findall(r'<text class="xtick"[^>]*>([^<]*)</text>', dom)
    assert "22:16:24" in ticks and "22:17:54" in ticks and all(re.fullmatch(r"\d\d:\d\d:\d\d", t) for t in ticks)
    assert "run started on 2026-11-30 (UTC)" in dom
    # Every plot in ms: a kernel's name ending in "(T1::Params)" is not a unit.
    units = re.findall(r'class="yunit"[^>]*>([^<]*)<', dom)
    assert len(units) == len(verdicts) and set(units) == {"ms"}
    assert "T1::Params</td>" not in dom and ">2.119e+08" not in dom
    assert dom.count('class="band regression"') == len(verdicts) and 'class="baseline"' in dom
    # The kernels that moved, read from the summaries at the store's new place.
    moved = re.search(r'<table class="moved">.*?</table>', dom, re.S).group(0)
    assert RUNS[3] in moved and RUNS[-1] in moved  # the baseline run (the median's) and the judged one
    # each kernel by its short name, its full name the cell's tooltip
    title, first = re.search(r'<tr class="moved-kernel slower"><td class="kernel" title="([^"]*)">([^<]*)<',
                             moved).groups()
    assert html.unescape(title) == GEMM and html.unescape(first) == short_name(GEMM) != GEMM and "+50.2%" in moved
    cells = [tuple(map(html.unescape, c)) for c in re.findall(r'<td class="kernel" title="([^"]*)">([^<]*)<', moved)]
    assert len(cells) > 3 and all(len(shown) <= WIDTH and shown == short_name(full) for full, shown in cells)
    assert sum(len(full) > WIDTH for full, _ in cells) >= 3  # cuBLAS's and PyTorch's longer names, within it
    # a top_kernels metric is named after its kernel: short in the verdicts and the headings, full in the tooltip
    cutlass = "kernel void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(T1::Params)"
    spans = [tuple(map(html.unescape, s)) for s in re.findall(r'<span class="short-name" title="([^"]*)">([^<]*)<', dom)]
    assert spans.count((cutlass, "kernel cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>")) == 2
    assert f"kernel {GEMM}" in verdicts and (f"kernel {GEMM}", f"kernel {short_name(GEMM)}") in spans
    titles = [html.unescape(t) for t in re.findall(r"<svg[^>]*><title>([^<]*)</title>", dom)]
    assert f"{cutlass} on NVIDIA H200 on vm" in titles  # the plot's own tooltip
    assert "(T1::Params)" not in re.sub(r'title="[^"]*"|<title>[^<]*</title>', "", dom)  # nowhere as text
    links = re.findall(r'<a class="run-link" href="([^"]*)/">', dom)
    assert links and all((out.parent / unquote(html.unescape(h)) / "manifest.json").exists() for h in links)
    assert "moved%20store" in links[0]  # a link is a URL: the folder's space percent-encoded
    assert png.stat().st_size > 10_000
    if os.environ.get("FLEET_UPDATE_DOCS"):
        shutil.copy(png, REPO / "docs" / "nightly-report.png")


def test_a_copied_store_reads_its_own_files_and_no_manifest_leads_out_of_its_run(tmp_path):
    from fleet import store

    a, b = tmp_path / "a", tmp_path / "b"
    shutil.copytree(FIXTURE / "lab", a / "lab")
    shutil.copytree(a, b)  # the copy, its original still there
    manifest = next(b.glob(f"lab/*/{RUNS[0]}/manifest.json"))
    doc = json.loads(manifest.read_text())
    outside = tmp_path / "outside.csv"  # kernel rows a hostile manifest or link would bring in
    outside.write_text((FIXTURE / "lab" / "2026-11-30" / RUNS[0] / "vm" / "vm-1449_cuda_gpu_kern_sum.csv").read_text())
    reports = doc["hosts"][0]["reports"]
    [kern] = [r for r in reports if r["stored"].endswith("_cuda_gpu_kern_sum.csv")]
    kern["stored"] = f"/gone/{RUNS[0]}/vm/../../../../{outside}"
    [nvtx] = [r for r in reports if r["stored"].endswith("_nvtx_sum.csv")]
    link = manifest.parent / "vm" / "link.csv"
    link.symlink_to(outside)
    nvtx["stored"] = f"/gone/{RUNS[0]}/vm/link.csv"
    manifest.write_text(json.dumps(doc))
    assert store.reindex(b)[0] == 7
    rows = store.reports(b)
    paths = [Path(r["path"]) for r in rows if r["status"] == "summary"]
    # each in the copy (none in the original), or, where the manifest's path led nowhere, the node's path
    assert paths and all(p.is_relative_to(b) or not p.is_relative_to(tmp_path) for p in paths), paths
    assert str(outside) not in {r["path"] for r in rows} and str(link) not in {r["path"] for r in rows}
    first = store.read_manifest(manifest).hosts[0].reports
    assert not [r for r in first if str(outside) in r.stored or r.stored == str(link)]
