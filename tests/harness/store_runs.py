"""Runs filed in a store as fleet files them (a nightly run; a run's nsys summaries, as the real nsys
2025.3 wrote them on an H200), and what the store's catalog holds of a run."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from fleet import store
from fleet.collection.fetch import sha256_of
from fleet.store.manifest import HostEntry, ReportEntry, RunManifest

REPO = Path(__file__).resolve().parents[2]
NSYS = REPO / "tests" / "fixtures" / "nsys-2025.3-h200"
RUN = "20261130-173936-5586"


def nightly_run(root: Path, run_id: str, kernel_ns: int) -> str:
    """A nightly run on h02 as the store keeps it: its manifest, its kernel summary, its metric."""
    day = f"{run_id[0:4]}-{run_id[4:6]}-{run_id[6:8]}"
    directory = root / "lab" / day / run_id
    (directory / "h02").mkdir(parents=True)
    csv = directory / "h02" / "h02-1_cuda_gpu_kern_sum.csv"
    csv.write_text(f"Time (%),Total Time (ns),Instances,Name\n100.0,{kernel_ns},3,gemm_kernel\n")
    report = {"remote": f"/var/tmp/fleet/{run_id}/{csv.name}", "stored": str(csv), "size": csv.stat().st_size,
              "sha256": "ab" * 32, "status": "summary", "verified": True, "summary": "cuda_gpu_kern_sum"}
    metric = {"metric": "total GPU kernel time", "device": "NVIDIA H200 on h02", "value": float(kernel_ns),
              "flags": []}
    doc = {"run_id": run_id, "site": "lab", "day": day, "started": f"{day}T02:00:00+0000", "user": "ana",
           "request": {"tool": "nsys", "command": ["python3", "bench.py"]}, "status": "complete",
           "hosts": [{"host": "h02", "status": "ok", "missing_why": None, "gpu": "NVIDIA H200", "driver": "580",
                      "tool_version": "2025.3", "tenants_seen": [], "given_up": [], "reports": [report]}],
           "playbook": {"name": "bench", "metrics": [metric]}}
    (directory / "manifest.json").write_text(json.dumps(doc))
    return run_id


def rows_of(root: Path, run_id: str) -> dict[str, int]:
    with closing(sqlite3.connect(root / "catalog.sqlite")) as db:
        return {t: db.execute(f"SELECT COUNT(*) FROM {t} WHERE run_id = ?", (run_id,)).fetchone()[0]
                for t in ("runs", "reports", "kernels", "metrics")}


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
             run_id: str = RUN, status: str | None = None) -> RunManifest:
    from fleet.outcome import run_status

    m = RunManifest(run_id, site=site, day="2026-11-30", started="2026-11-30T17:39:36+0000", user="ana",
                    request={"tool": tool, "command": ["python3", "app.py"]},
                    status=status or run_status(h.status for h in hosts), hosts=hosts)
    store.save(store_root, m)
    return m


def run_dir(store_root: Path, site: str = "lab", run_id: str = RUN) -> Path:
    return store.run_dir(store_root, site, run_id)


def plant(root, name: str, values: list[float], versions: list[str], drivers: list[str], tenants=()) -> list[str]:
    """Runs of a playbook as `fleet run` leaves them: a host with its GPU, driver and the run watch's
    samples, the metric row, and the workload's version the playbook's version command said."""
    ids = []
    for i, v in enumerate(values):
        run_id = f"202610{1 + i // 2:02d}-0{i % 2}0000-{i:04x}"
        samples = [{"t": t, "gpu": 0, "sm_clock_mhz": 1980, "throttle": []} for t in range(3)]
        host = {"host": "gx-01", "node": "gx-01", "status": "ok", "gpu": "NVIDIA H200", "driver": drivers[i],
                "tool_version": "2025.3.1.0", "tenants_seen": [f"GPU 0: pid 4{i} (bob)"] if i in tenants else [],
                "result": {"status": "ok", "conditions": {"gpus": [{"index": 0, "uuid": "GPU-5a1e"}],
                                                          "samples": samples}}}
        m = {"run_id": run_id, "site": "lab", "day": run_id[:4] + "-" + run_id[4:6] + "-" + run_id[6:8],
             "started": f"2026-10-{1 + i // 2:02d}T0{i % 2}:00:00+0000", "user": "ana", "status": "complete",
             "fleet": "0.1.0", "request": {"tool": "nsys", "command": ["python3", "train.py"]}, "hosts": [host],
             "playbook": {"name": name, "version": versions[i], "metrics": [
                 {"metric": "total GPU kernel time", "device": "NVIDIA H200 on gx-01", "value": v,
                  "flags": [f"tenant: GPU 0: pid 4{i} (bob)"] if i in tenants else []}]}}
        store.save(root, RunManifest.from_json(m))
        ids.append(run_id)
    return ids


def noisy(n: int, seed: int, level: float = 1e9) -> list[float]:
    rng = random.Random(seed)
    return [level * (1 + rng.gauss(0, 0.005)) for _ in range(n)]


def judged_copy(fixture: Path, at: Path, runs: int):
    """A recorded store's lab runs (``fixture``/lab) copied to ``at``, catalogued again there (which must
    find ``runs`` runs), and judged by ``fleet nightly report`` of the reference playbook: the command's
    result and the page's path (its JSON beside it)."""
    from tests.conftest import REPO, run_fleet
    shutil.copytree(fixture / "lab", at / "lab")
    env = {"FLEET_STORE": str(at)}
    assert run_fleet("reports", "reindex", env=env).stdout.strip() == f"catalogued {runs} runs"
    out = at.parent / "site" / "nightly.html"
    return run_fleet("nightly", "report", str(REPO / "playbooks" / "reference.yaml"), "--out", str(out), env=env), out
