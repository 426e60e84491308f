"""Nightly with several ranks: each run's straggler share (the rank last at the collectives, in
what share of them, the rank-seconds lost) from the exports of its ranks; a run in which a tenant
shared a GPU is marked and kept out of the baseline. On the page, looked at in headless Chromium."""

from __future__ import annotations

import json
import re

import yaml

from fleet import store
from fleet.nightly import playbook, stragglers
from tests.conftest import run_fleet
from tests.harness import nsys_export as nx
from tests.harness.browser import CHROMIUM, screenshot
from tests.harness.rank_plants import UUIDS, eight

NAME = "train-8"


def nightly_run(root, day: int, scenario: nx.Scenario, tenant: bool = False) -> str:
    """One nightly run of 8 ranks filed as fleet run files it: exports, metrics, stragglers."""
    from fleet.collection.fetch import sha256_of
    from fleet.store.manifest import HostEntry, ReportEntry, RunManifest

    run_id = f"202611{day:02d}-020000-{day:04x}"
    m = RunManifest(run_id=run_id, site="hpc", day=f"2026-11-{day:02d}", started=f"2026-11-{day:02d}T02:00",
                    user="ana", request={"tool": "nsys", "command": ["python3", "train.py"]}, status="complete")
    directory = store.save(root, m)
    for r in range(8):
        (directory / "node1").mkdir(exist_ok=True)
        path = nx.write(directory / "node1" / f"rank{r}.sqlite", scenario, r, nx.recorded_schema(), nx.recorded_names(),
                        UUIDS)
        m.hosts.append(HostEntry("node1", "ok", rank=r, gpu="NVIDIA H200", reports=[ReportEntry(
            stored=str(path), size=path.stat().st_size, sha256=sha256_of(path), status="export", verified=True,
            summary="sqlite")], tenants_seen=["GPU 2: pid 7771 (bob) is another user's"] if tenant and r == 2 else []))
    flags = ["tenant: GPU 2: pid 7771 (bob)"] if tenant else []
    m.playbook = {"name": NAME, "metrics": [{"metric": "total GPU kernel time", "device": "NVIDIA H200 on node1",
                                             "value": 1e9, "flags": flags}]}
    found = stragglers.of_run(root, m, {"sync_range": "sync"})
    m.playbook["stragglers"] = found
    store.save(root, m)
    return run_id


def test_each_run_reports_its_straggler_share_and_a_tenant_run_stays_out_of_the_baseline(tmp_path):
    root = tmp_path / "store"
    even = eight(late=0)
    even[0] = nx.Plant(kernels=20, gpu=0)  # nobody late: the last to arrive varies with the jitter
    ids = [nightly_run(root, 1, nx.Scenario(eight(late=5))), nightly_run(root, 2, nx.Scenario(eight(late=5))),
           nightly_run(root, 3, nx.Scenario(even, jitter=[0, 300_000, 100_000, 200_000]), tenant=True),
           nightly_run(root, 4, nx.Scenario(eight(late=5)))]
    pb = tmp_path / "train.yaml"
    pb.write_text(yaml.safe_dump({"name": NAME, "target": {"partition": "gpu"}, "command": ["true"],
                                  "ranks": {"sync_range": "sync"}}))
    assert playbook.load(pb).ranks == {"sync_range": "sync"}
    out = tmp_path / "site" / "nightly.html"
    r = run_fleet("nightly", "report", str(pb), "--out", str(out), env={"FLEET_STORE": str(root)})
    assert r.returncode == 0, r.stdout + r.stderr
    [summary] = json.loads(out.with_suffix(".json").read_text())["playbooks"]
    shares = {s["run_id"]: s for s in summary["stragglers"]}
    assert [shares[i]["straggler"] for i in ids[:2] + ids[3:]] == ["rank 5"] * 3
    assert all(shares[i]["share"] == 1.0 and shares[i]["causes"] == ["more work"] for i in ids[:2] + ids[3:])
    assert shares[ids[3]]["lost_s"] > 7.0  # 7 ranks x 12 collectives x about 106 ms each
    flagged = shares[ids[2]]
    assert flagged["flags"] and flagged["share"] < 1.0  # marked; and its share would pull a baseline down
    assert shares[ids[3]]["baseline"] == 1.0  # the median of runs 1 and 2 alone
    assert CHROMIUM, "chromium is not installed: scripts/test installs it (Debian's chromium package)"
    dom = screenshot(out, tmp_path / "nightly-ranks.png")
    rows = re.findall(r"<tr class=\"straggler-run( flagged)?\">(.*?)</tr>", dom)
    assert len(rows) == 4 and [bool(f) for f, _ in rows] == [False, False, True, False]
    assert "kept out of the baseline" in rows[2][1] and "rank 5" in rows[3][1] and "100%" in rows[3][1]


def test_a_playbooks_ranks_settings_are_checked(tmp_path):
    pb = tmp_path / "bad.yaml"
    pb.write_text("name: x\ntarget: {partition: gpu}\ncommand: [a]\nranks:\n  sync_rnage: allreduce\n")
    try:
        playbook.load(pb)
    except playbook.PlaybookError as e:
        assert re.match(r".*bad.yaml:5: ranks: unknown key 'sync_rnage' \(did you mean 'sync_range'\?\)", str(e))
    else:
        raise AssertionError("an unknown ranks key was taken")
