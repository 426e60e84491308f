"""Nightly profiling: verdicts on synthetic histories, playbook checks, a schedule that fires
unattended on a real Slurm cluster (this machine as its login node), and the HTML report
opened in headless Chromium."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import yaml

from fleet.nightly import playbook, trends
from fleet import store
from fleet.store.manifest import RunManifest
from tests.harness.browser import CHROMIUM, screenshot
from tests.conftest import REPO, announce, run_fleet
from tests.harness.slurm import SlurmCluster

T = dict(playbook.DEFAULT_THRESHOLDS)


def history(values, flagged=()):
    return [{"value": v, "flags": ["tenant: GPU 0: pid 7 (bob)"] if i in flagged else []}
            for i, v in enumerate(values)]


def test_a_planted_20_percent_slowdown_is_a_regression_and_noise_is_not():
    base = [100.0, 103.0, 98.0, 101.0, 99.0, 102.0, 100.0]
    step = trends.judge("t", "d", history(base + [120.0, 121.0]), T)
    assert step.verdict == trends.REGRESSION and 0.19 < step.rel < 0.22
    noise = trends.judge("t", "d", history(base + [103.0, 97.0, 104.0]), T)
    assert noise.verdict == trends.NO_CHANGE
    once = trends.judge("t", "d", history(base + [120.0]), T)  # not yet twice in a row
    assert once.verdict == trends.SUSPICIOUS
    assert trends.judge("t", "d", history(base + [120.0]), dict(T, consecutive=1)).verdict == trends.REGRESSION
    assert trends.judge("t", "d", history([100.0, 120.0, 121.0]), T).verdict == trends.INSUFFICIENT


def test_runs_with_tenants_are_shown_but_neither_baseline_nor_judged():
    values = [100.0, 101.0, 99.0, 100.0, 150.0, 160.0]  # the slow ones had a tenant on the GPU
    v = trends.judge("t", "d", history(values, flagged={4, 5}), T)
    assert v.verdict == trends.NO_CHANGE and v.value == 100.0 and "tenants" in v.note


def test_playbook_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ntarget:\n  partition: gpu\ncommand: python3 train.py\n")
    with pytest.raises(playbook.PlaybookError, match=r"bad.yaml:4: command must be a list"):
        playbook.load(bad)
    bad.write_text("name: x\ntarget:\n  partition: gpu\n  nodez: 2\ncommand: [a]\n")
    with pytest.raises(playbook.PlaybookError, match=r"bad.yaml:4: target: unknown key 'nodez' \(did you mean"):
        playbook.load(bad)
    bad.write_text("target: {hosts: h01}\ncommand: [a]\nmetrics:\n  - kind: kernel\n")
    with pytest.raises(playbook.PlaybookError, match=r"bad.yaml:4: metrics\[0\]: a kernel metric needs name"):
        playbook.load(bad)
    for shipped in sorted((REPO / "playbooks").glob("*.yaml")):
        assert playbook.load(shipped).metrics  # the examples load


# Playbooks with a type wrong: each was a traceback, or (a name) went into a schedule unchecked.
TYPE_ERRORS = [
    ("metrics:\n  - {kind: top_kernels, count: abc}\n", 4, "metrics[0].count: must be a whole number"),
    ("metrics:\n  - {kind: top_kernels, count: 0}\n", 4, "metrics[0].count: must be a whole number"),
    ("metrics:\n  - {kind: ncu, name: m, kernel: [a]}\n", 4, "metrics[0].kernel: must be a glob"),
    ("metrics:\n  - {kind: kernel, nmae: '*gemm*'}\n", 4, "unknown key 'nmae' (did you mean 'name'?)"),
    ("metrics: {kind: kernel}\n", 3, "metrics must be a list"),
    ("thresholds: [1, 2]\n", 3, "thresholds must be a mapping"),
    ("thresholds:\n  regresion: 0.2\n", 4, "unknown key 'regresion' (did you mean 'regression'?)"),
    ("thresholds:\n  regression: high\n", 4, "thresholds.regression: must be a number"),
    ("metric:\n  - {kind: gpu_kernel_total}\n", 3, "unknown key 'metric' (did you mean 'metrics'?)"),
    ("profiler_args: --trace=cuda\n", 3, "profiler_args must be a list of words"),
    ("name: 'nightly; touch x #'\n", 3, "must be 1 to 64 letters, digits"),
    ("name: ../../etc\n", 3, "must be 1 to 64 letters, digits"),
]


@pytest.mark.parametrize("extra,line,message", TYPE_ERRORS, ids=[t[2][:40] for t in TYPE_ERRORS])
def test_playbook_type_errors_are_one_line_with_file_and_line(tmp_path, extra, line, message):
    bad = tmp_path / "bad.yaml"
    bad.write_text("target: {hosts: h01}\ncommand: [a]\n" + extra)
    with pytest.raises(playbook.PlaybookError) as e:
        playbook.load(bad)
    assert str(e.value).startswith(f"{bad}:{line}: ") and message in str(e.value)
    out = run_fleet("run", str(bad), "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr


def test_ncu_metrics_are_read_from_ncus_own_csv():
    """The CSV layout and values as ncu 2025.3 printed them on an H200 test machine."""
    raw = REPO / "tests" / "fixtures" / "ncu-raw-h200.csv"
    assert playbook.ncu_value(playbook.Metric("ncu", "gpu__time_duration.sum"), raw) == {
        "ncu gpu__time_duration.sum (us)": pytest.approx(21.76)}
    assert playbook.ncu_value(playbook.Metric("ncu", "gpu__time_duration.sum", kernel="*gemm*"), raw) == {
        "ncu gpu__time_duration.sum of *gemm* (us)": pytest.approx(14.336)}
    assert playbook.ncu_value(playbook.Metric("ncu", "dram__bytes.sum"), raw) == {}
    from fleet.nightly.report_html import scale
    assert scale("ncu gpu__time_duration.sum (us)") == (1.0, "us") and scale("total GPU kernel time") == (1e6, "ms")


def plant_history(root: Path, name: str, values: list[float], drivers: list[str] | None = None) -> list[str]:
    """Runs of a playbook as the catalog holds them (a manifest each, as fleet run writes it).
    With ``drivers`` (one a run), each run also has a host with that driver and a verified
    kernel summary whose kernels add up to the run's value (the gemm carries what moved)."""
    ids = []
    for i, v in enumerate(values):
        run_id = f"202611{i + 1:02d}-020000-{i:04x}"
        hosts = []
        if drivers:
            csv = store.run_dir(root, "hpc", run_id) / "node1" / "train.cuda_gpu_kern_sum.csv"
            csv.parent.mkdir(parents=True, exist_ok=True)
            kernels = {"ampere_sgemm_128x64_nn": (v - 40) * 1e6, "vectorized_elementwise_kernel": 25e6,
                       "reduce_kernel<512>": 15e6}
            csv.write_text("Time (%),Total Time (ns),Instances,Name\n" + "".join(
                f'{t / v / 1e4:.1f},{int(t)},100,"{k}"\n' for k, t in kernels.items()))
            hosts = [{"host": "node1", "status": "ok", "gpu": "NVIDIA H200", "driver": drivers[i],
                      "tool_version": "2025.3.1", "reports": [
                          {"remote": "/tmp/x", "stored": str(csv), "status": "summary", "verified": True,
                           "summary": "cuda_gpu_kern_sum"}]}]
        m = {"run_id": run_id, "site": "hpc", "day": f"2026-11-{i + 1:02d}", "started": f"2026-11-{i + 1:02d}T02:00",
             "user": "ana", "request": {"tool": "nsys", "command": ["python3", "train.py"]}, "status": "complete",
             "hosts": hosts, "playbook": {"name": name, "metrics": [
                 {"metric": "total GPU kernel time", "device": "NVIDIA H200 on node1 rank 0", "value": v * 1e6,
                  "flags": []}]}}
        store.save(root, RunManifest.from_json(m))
        ids.append(run_id)
    return ids



def test_the_report_calls_the_regression_exits_7_and_notifies(tmp_path):
    pb = tmp_path / "train.yaml"
    pb.write_text(yaml.safe_dump({"name": "train-step", "target": {"partition": "gpu"}, "command": ["true"]}))
    ids = plant_history(tmp_path / "store", "train-step", [100, 102, 99, 101, 100, 98, 101, 121, 122])
    out, notified = tmp_path / "site" / "nightly.html", tmp_path / "notified.txt"
    r = run_fleet("nightly", "report", str(pb), "--out", str(out), "--notify", f"cat > {notified}",
                  env={"FLEET_STORE": str(tmp_path / "store")})
    assert r.returncode == 7, r.stdout + r.stderr
    assert "REGRESSION train-step: total GPU kernel time on NVIDIA H200 on node1 rank 0 +2" in notified.read_text()
    page = out.read_text()
    assert all(run_id in page for run_id in ids) and "Regression" in page
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["playbooks"][0]["verdicts"][0]["verdict"] == "Regression"
    assert CHROMIUM, "chromium is not installed: scripts/test installs it (Debian's chromium package)"
    png = tmp_path / "nightly.png"
    dom = screenshot(out, png)
    assert dom.count('class="point"') == len(ids) and 'class="trend"' in dom and 'class="baseline"' in dom
    assert png.stat().st_size > 10_000  # a rendered page, not a blank one


def test_the_report_has_dated_axes_band_driver_change_moved_kernels_and_run_links(tmp_path):
    """The page as a person sees it in Chromium: dates under the plot, the thresholds' band, the
    driver upgrade mid-history marked, the kernel that slowed named, and every run linked."""
    pb = tmp_path / "train.yaml"
    pb.write_text(yaml.safe_dump({"name": "train-step", "target": {"partition": "gpu"}, "command": ["true"]}))
    drivers = ["550.54.15"] * 5 + ["560.35.03"] * 5
    ids = plant_history(tmp_path / "store", "train-step", [100, 102, 99, 101, 100, 98, 101, 100, 121, 122],
                        drivers)
    out = tmp_path / "site" / "nightly.html"
    r = run_fleet("nightly", "report", str(pb), "--out", str(out), env={"FLEET_STORE": str(tmp_path / "store")})
    assert r.returncode == 7, r.stdout + r.stderr
    assert CHROMIUM, "chromium is not installed: scripts/test installs it (Debian's chromium package)"
    png = tmp_path / "nightly-full.png"
    dom = screenshot(out, png)
    import re
    dates = re.findall(r'<text class="xtick"[^>]*>([^<]*)</text>', dom)
    assert "2026-11-01" in dates and "2026-11-10" in dates and all(re.fullmatch(r"\d{4}-\d\d-\d\d", d) for d in dates)
    yticks = re.findall(r'<text class="ytick"[^>]*>([^<]*)</text>', dom)
    assert len(yticks) >= 3 and re.search(r'class="yunit"[^>]*>ms<', dom)
    assert 'class="band suspicious"' in dom and 'class="band regression"' in dom and 'class="baseline"' in dom
    marker = re.findall(r'<g class="change">.*?</g>', dom)
    assert len(marker) == 1 and "driver 550.54.15 → 560.35.03" in marker[0]
    moved = re.search(r'<table class="moved">.*?</table>', dom, re.S).group(0)
    assert ids[-1] in moved and moved.count('class="moved-kernel') == 3
    first = re.search(r'<tr class="moved-kernel slower"><td class="kernel" title="ampere_sgemm_128x64_nn">([^<]*)<',
                      moved).group(1)
    assert first == "ampere_sgemm_128x64_nn" and "+22.000" in moved  # 122 ms against a 100 ms baseline run
    links = dict(re.findall(r'<a class="run-link" href="([^"]*)/">([^<]*)</a>', dom)[::-1])
    for run_id in ids:
        href = next(h for h, text in links.items() if text == run_id)
        assert not os.path.isabs(href) and (out.parent / href / "manifest.json").exists()
    reports = re.findall(r'<a class="report" href="([^"]*)"', dom)
    assert len(reports) == len(ids) and all((out.parent / h).exists() for h in reports)
    assert "http://" not in dom and "https://" not in dom and "<script" not in dom  # offline, no script
    assert png.stat().st_size > 10_000


@pytest.fixture(scope="module")
def local_slurm(pytestconfig):
    """A one-node Slurm cluster whose login node is this machine (fleet runs here, as root)."""
    with SlurmCluster(1) as s:
        announce(pytestconfig, f"started Slurm (munged, slurmctld, slurmd node1) under {s.dir} for schedules")
        yield s


def test_a_scheduled_playbook_runs_twice_unattended_and_both_runs_are_reported(local_slurm, tmp_path):
    runs_dir = tmp_path / "runs"
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": {"login": {
        "ansible_connection": "local", "slurm_login": "login", "report_dir": str(runs_dir),
        "nsys_path": str(REPO / "tests" / "standins" / "nsys")}}}}))
    pb = tmp_path / "nightly.yaml"
    pb.write_text(yaml.safe_dump({"name": "nightly-ci", "target": {"partition": "gpu", "ntasks": 1},
                                  "command": ["sleep", "0.2"], "metrics": [{"kind": "gpu_kernel_total"}]}))
    env = {**local_slurm.env, "FLEET_STORE": str(tmp_path / "store"), "FLEET_INVENTORY": str(inventory),
           "PATH": os.environ["PATH"]}
    r = run_fleet("schedule", "install", str(pb), "--every", "2s", env=env)
    assert r.returncode == 0 and "with resubmit: job" in r.stdout, r.stdout + r.stderr
    try:
        deadline = time.monotonic() + 120
        while len(store.metric_history(tmp_path / "store", "nightly-ci")) < 2:
            assert time.monotonic() < deadline, list((tmp_path / "store" / "schedules").glob("*.out"))
            time.sleep(0.5)
    finally:
        rm = run_fleet("schedule", "rm", "nightly-ci", env=env)
    assert rm.returncode == 0, rm.stderr
    rows = store.metric_history(tmp_path / "store", "nightly-ci")
    run_ids = sorted({row["run_id"] for row in rows})
    assert len(run_ids) >= 2 and all(row["value"] > 0 for row in rows)
    for run_id in run_ids:  # normal runs: reports gathered and verified
        m = json.loads(store.manifest_of(tmp_path / "store", run_id).read_text())
        assert m["status"] == "complete" and m["hosts"][0]["reports"][0]["verified"]
    out = tmp_path / "nightly.html"
    rep = run_fleet("nightly", "report", str(pb), "--out", str(out), env=env)
    assert rep.returncode == 0, rep.stdout + rep.stderr
    assert all(run_id in out.read_text() for run_id in run_ids)
    # Nothing is left pending once the schedule is removed.
    time.sleep(1)
    assert "fleet-schedule" not in local_slurm.run("squeue", "-h", "-o", "%j").stdout


def test_the_other_backends_lines():
    from fleet.nightly import schedule

    assert schedule.every_seconds("6h") == 21600 and schedule.every_seconds("45") == 45
    record = schedule.ScheduleRecord.read({
        "name": "n", "cron": "0 2 * * *", "every": None, "python": "/opt/fleet/bin/python",
        "env": {"FLEET_STORE": "/srv/store"}, "dir": "/srv/store/schedules", "playbook": "/p.yaml",
        "backend": "crontab"})
    line = schedule.crontab_line(record)
    assert line.startswith("0 2 * * * FLEET_STORE=/srv/store /opt/fleet/bin/python -m fleet schedule fire n")
    assert line.rstrip().endswith("# fleet-schedule:n")
    assert schedule.scrontab_lines(record).startswith("#SCRON --job-name=fleet-schedule-n ")
    assert "exec /opt/fleet/bin/python -m fleet schedule fire n" in schedule.batch_script(record)
