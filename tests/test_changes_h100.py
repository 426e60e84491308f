"""The change points of a real history: the reference playbook run 18 times as nightly runs on an
H100 test machine by scripts/gpu-node/changes-check.sh, with a known truth (tests/fixtures/changes-h100/):
runs 1-5 of v1, run 6 beside another user's CUDA process, runs 7-10 with the GPU's clocks locked
at 990 MHz, runs 11-13 with them restored, runs 14-18 of v2 with the planted slowdown; then the
four runs of `fleet nightly confirm` (A/B/B/A), which are no nights of the history."""

from __future__ import annotations

import json
import shutil

from tests.conftest import REPO, run_fleet

FIXTURE = REPO / "tests" / "fixtures" / "changes-h100"
TENANT_RUN, LOCKED, RESTORED, V2 = "20261206-042928-bcae", "20261206-042943-89b6", "20261206-043051-6f08", \
    "20261206-043142-ef73"
DEVICE = "NVIDIA H100 80GB HBM3 on vm"


def test_the_h100_history_names_the_locked_clocks_keeps_the_tenants_night_out_and_blames_v2(tmp_path):
    st = tmp_path / "store"
    shutil.copytree(FIXTURE / "lab", st / "lab")
    env = {"FLEET_STORE": str(st)}
    assert run_fleet("reports", "reindex", env=env).stdout.strip() == "catalogued 22 runs"
    out = tmp_path / "site" / "nightly.html"
    r = run_fleet("nightly", "report", str(REPO / "playbooks" / "reference.yaml"), "--out", str(out), env=env)
    assert r.returncode == 7, r.stdout + r.stderr
    assert "over 18 run(s)" in r.stdout  # the confirmation's runs are kept apart
    # nsys is allowed beside a tenant, so the plan weighed none; the node and the run watch saw one
    assert f"kept out as contaminated: 1 run(s) ({TENANT_RUN})" in r.stdout
    assert f"change: kernel *gemm* ({DEVICE}) +99.5% at run {LOCKED}, environment: SM clock 1980 -> 990 MHz" in r.stdout
    assert f"-24.9% at run {RESTORED}, environment: SM clock 990 -> 1980 MHz" in r.stdout
    assert (f"REGRESSION reference: nvtx *train_step on {DEVICE} +112.7%, changed at run {V2}: code (workload v1 -> v2)"
            in r.stdout)
    series = {s["metric"]: s for s in json.loads(out.with_suffix(".json").read_text())["playbooks"][0]["changes"]}
    gemm = series["kernel *gemm*"]
    assert [(c["label"], c["run_after"]) for c in gemm["changes"]] == [("environment", LOCKED), ("environment", RESTORED)]
    assert gemm["contaminated"] == [{"run_id": TENANT_RUN, "why": ["tenant: tenant pid 2260"]}]
