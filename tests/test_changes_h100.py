"""The change points of a real history: the reference playbook run 18 times as nightly runs on an
H100 test machine by scripts/gpu-node/changes-check.sh, with a known truth (tests/fixtures/changes-h100/):
runs 1-5 of v1, run 6 beside another user's CUDA process, runs 7-10 with the GPU's clocks locked
at 990 MHz, runs 11-13 with them restored, runs 14-18 of v2 with the planted slowdown; then the
four runs of `fleet nightly confirm` (A/B/B/A), which are no nights of the history."""

from __future__ import annotations

import json
import os
import re
import shutil

from tests.conftest import REPO
from tests.harness.store_runs import judged_copy
from tests.harness.browser import CHROMIUM, screenshot

FIXTURE = REPO / "tests" / "fixtures" / "changes-h100"
TENANT_RUN, LOCKED, RESTORED, V2 = "20261206-042928-bcae", "20261206-042943-89b6", "20261206-043051-6f08", \
    "20261206-043142-ef73"
DEVICE = "NVIDIA H100 80GB HBM3 on vm"


def test_the_h100_history_names_the_locked_clocks_keeps_the_tenants_night_out_and_blames_v2(tmp_path):
    r, out = judged_copy(FIXTURE, tmp_path / "store", runs=22)
    assert r.returncode == 7, r.stdout + r.stderr
    assert "over 18 run(s)" in r.stdout  # the confirmation's runs are kept apart
    # nsys is allowed beside a tenant, so the plan weighed none; the node and the run watch saw one
    assert f"kept out as contaminated: 1 run(s) ({TENANT_RUN})" in r.stdout
    assert f"change: kernel *gemm* ({DEVICE}) +99.5% at run {LOCKED}, environment: SM clock 1980 -> 990 MHz" in r.stdout
    assert f"-24.9% at run {RESTORED}, environment: SM clock 990 -> 1980 MHz" in r.stdout
    assert (f"REGRESSION reference: nvtx *train_step on {DEVICE} +112.7%, changed at run {V2}: code (workload v1 -> v2)"
            in r.stdout)
    assert r.stdout.count("REGRESSION reference: nvtx *train_step") == 1  # the change, not its threshold verdict too
    judged = json.loads(out.with_suffix(".json").read_text())["playbooks"][0]
    nvtx = next(v for v in judged["verdicts"] if v["metric"] == "nvtx *train_step")
    # the threshold verdict alone judges the level since the change: "No change"; said as the change instead
    assert (nvtx["verdict"], round(nvtx["rel"], 3)) == ("Regression", 1.127)
    assert nvtx["note"] == f"changed at run {V2}: code (workload v1 -> v2)"
    series = {s["metric"]: s for s in judged["changes"]}
    gemm = series["kernel *gemm*"]
    assert [(c["label"], c["run_after"]) for c in gemm["changes"]] == [("environment", LOCKED), ("environment", RESTORED)]
    assert gemm["contaminated"] == [{"run_id": TENANT_RUN, "why": ["tenant: tenant pid 2260"]}]


def test_the_page_of_that_history_draws_the_changes_in_their_colours_and_the_tenants_night_hollow(tmp_path):
    r, out = judged_copy(FIXTURE, tmp_path / "store", runs=22)
    assert r.returncode == 7
    assert CHROMIUM, "chromium is not installed: scripts/test installs it (Debian's chromium package)"
    png = tmp_path / "nightly-changes.png"
    dom = screenshot(out, png, size="1000,2200")
    rows = re.findall(r'<tr class="change-row (\w+)">(.*?)</tr>', dom, re.S)
    assert [kind for kind, _ in rows].count("environment") == 10 and [kind for kind, _ in rows].count("code") == 1
    assert all("SM clock" in row for kind, row in rows if kind == "environment")
    assert "workload v1 -&gt; v2" in next(row for kind, row in rows if kind == "code")
    assert "1 run(s) kept out as contaminated" in dom
    # the kernels that moved for the code change: a run of v1 against the newest, not two runs of v2
    assert re.search(r"from the baseline run <a[^>]*>20261206-042907-1c0e</a> to <a[^>]*>20261206-043239-c0ec<", dom)
    # the tenant's night, hollow in each of the six plots, its title saying who was there
    hollow = re.findall(r'<circle class="point"[^>]*fill="#fff"[^>]*><title>([^<]*)</title>', dom)
    assert len(hollow) == 6 and all(t.startswith(TENANT_RUN) and "tenant: tenant pid 2260" in t for t in hollow)
    assert png.stat().st_size > 10_000
    if os.environ.get("FLEET_UPDATE_DOCS"):
        shutil.copy(png, REPO / "docs" / "nightly-changes.png")
