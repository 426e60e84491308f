"""Runs filed in a store as fleet files them (a nightly run; a run's nsys summaries, as the real nsys
2025.3 wrote them on an H200), and what the store's catalog holds of a run."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from fleet import store
from fleet.store.collect import sha256_of
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
