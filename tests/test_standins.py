"""The stand-in profilers replay what the real ones did on an H200 test machine
(tests/fixtures/nsys-2025.3-h200/): the same files, empty where nsys left them empty."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

from fleet.agent.reports import GENERATING
from fleet.store import kernel_rows

STANDINS = Path(__file__).parent / "standins"
REAL = Path(__file__).parent / "fixtures" / "nsys-2025.3-h200"
SUMMARIES = ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum")


def nsys(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(STANDINS / "nsys"), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(cwd), **(env or {})})


def stats(report: Path) -> dict[str, str]:
    base = str(report)[: -len(".nsys-rep")]
    done = nsys("stats", "-q", "--report", ",".join(SUMMARIES), "--format", "csv", "--output", base, str(report),
                cwd=report.parent)
    assert done.returncode == 0, done.stderr
    return {name: Path(f"{base}_{name}.csv").read_text() for name in SUMMARIES}


def test_stats_write_the_real_headers_and_rows_shaped_as_nsys_writes_them(tmp_path):
    app = 'echo fleet-check >> "$STANDIN_NVTX_LOG"; sleep 0.1'
    assert nsys("profile", "--trace=cuda,nvtx", "-o", "r", "--", "sh", "-c", app, cwd=tmp_path).returncode == 0
    ours = stats(tmp_path / "r.nsys-rep")
    for name in SUMMARIES:
        real = list(csv.reader(open(REAL / f"with-nvtx_{name}.csv", newline="")))
        mine = list(csv.reader(io.StringIO(ours[name])))
        assert mine[0] == real[0] and len(mine) > 1, name  # the header, and rows
        assert all(len(r) == len(real[0]) for r in mine[1:]), name
    real_range = (REAL / "with-nvtx_nvtx_sum.csv").read_text().splitlines()[1].split(",")[-2:]
    assert ours["nvtx_sum"].splitlines()[1].split(",")[-2:] == real_range == ["PushPop", ":fleet-check"]
    real_kernels = [(name, n) for name, _, n in kernel_rows(REAL / "with-nvtx_cuda_gpu_kern_sum.csv")]
    assert [(name, n) for name, _, n in kernel_rows(tmp_path / "r_cuda_gpu_kern_sum.csv")] == real_kernels
    real_api = [r[-1] for r in csv.reader(open(REAL / "with-nvtx_cuda_api_sum.csv", newline=""))]
    assert [r[-1] for r in csv.reader(io.StringIO(ours["cuda_api_sum"]))] == real_api


def test_a_workload_without_nvtx_ranges_gets_an_empty_nvtx_summary(tmp_path):
    assert (REAL / "without-nvtx_nvtx_sum.csv").read_bytes() == b""  # what nsys 2025.3 wrote
    assert nsys("profile", "--trace=cuda", "-o", "a", "--", "true", cwd=tmp_path).returncode == 0
    assert nsys("profile", "-o", "b", "--", "true", cwd=tmp_path).returncode == 0  # nvtx traced, no range opened
    for report in ("a", "b"):
        ours = stats(tmp_path / f"{report}.nsys-rep")
        assert ours["nvtx_sum"] == "" and ours["cuda_gpu_kern_sum"], report


def test_a_workload_without_kernels_gets_an_empty_kernel_summary_the_catalog_reads_as_none(tmp_path):
    assert nsys("profile", "--trace=nvtx", "-o", "r", "--", "true", cwd=tmp_path).returncode == 0
    assert stats(tmp_path / "r.nsys-rep")["cuda_gpu_kern_sum"] == ""
    assert kernel_rows(tmp_path / "r_cuda_gpu_kern_sum.csv") == []


def test_stats_of_an_empty_report_are_empty_files_and_exit_0(tmp_path):
    (tmp_path / "cut.nsys-rep").write_bytes(b"")  # an importer killed while it wrote the report
    assert stats(tmp_path / "cut.nsys-rep") == {name: "" for name in SUMMARIES}


def test_the_real_kernel_summary_is_catalogued(tmp_path):
    rows = kernel_rows(REAL / "with-nvtx_cuda_gpu_kern_sum.csv")
    assert [(n[:22], t, i) for n, t, i in rows] == [("void cutlass::Kernel2<", 1752856203, 5151),
                                                    ("void at::native::<unna", 12576, 1)]


def test_nsys_whose_importer_cannot_start_leaves_the_qdstrm_at_the_output_name_and_exits_0(tmp_path):
    done = nsys("profile", "-o", "r", "--", "true", cwd=tmp_path, env={"STANDIN_MISSING_LIBRARY": "libdw.so.1"})
    assert done.returncode == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["r.qdstrm"]
    real = (REAL / "nsys-profile-importer-missing.txt").read_text().splitlines()
    ours = (done.stderr + done.stdout).splitlines()
    shared = [line for line in ours if not line.startswith(("Generating '", "\t"))]
    assert shared and all(line in real for line in shared), (shared, real)
    assert ours[-2:] == ["Generated:", "\tr.qdstrm"] and real[-2] == "Generated:" and real[-1].endswith(".qdstrm")


def test_nsys_and_its_importer_killed_while_generating_leave_an_empty_report_and_the_data(tmp_path):
    proc = subprocess.Popen([str(STANDINS / "nsys"), "profile", "-o", "r", "--", "true"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path), "STANDIN_IMPORT_SECONDS": "60"})
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "r.nsys-rep").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        importer = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    finally:
        proc.kill()  # nsys, then the importer it started, as on the H200 test machine
        for pid in importer:
            os.kill(int(pid), signal.SIGKILL)
    output = proc.communicate()[0]
    assert (tmp_path / "r.nsys-rep").read_bytes() == b"" and len(list(tmp_path.glob("nsys-report-*.qdstrm"))) == 1
    real = (REAL / "nsys-profile-killed-generating.txt").read_text()
    assert GENERATING.findall(output.encode()) and GENERATING.findall(real.encode())  # the same shape
    last = [text.splitlines()[-1] for text in (output, real)]  # the progress line nsys was killed in
    assert all(line.startswith("[1/1] [0%") and line.endswith(".nsys-rep") for line in last), last


def test_the_importer_refuses_data_whose_collection_never_ended_as_the_real_one_did(tmp_path):
    said = "Qdstrm file is incomplete or invalid. Please ensure that the CLI ran to completion and provide a valid " \
           "qdstrm file."
    real = Path(__file__).parent.parent / "docs/examples/h200-acceptance/profile-check/6-nsys-killed-collecting.txt"
    assert f"(exit 2): {said}" in real.read_text()  # what QdstrmImporter said of nsys killed while collecting
    (tmp_path / "empty.qdstrm").write_bytes(b"")
    (tmp_path / "cut.qdstrm").write_text('{"tool": "nsys", "app": ["sle')
    (tmp_path / "collecting.qdstrm").write_text(json.dumps({"tool": "nsys", "app": ["sleep", "9"]}))
    for name in ("empty", "cut", "collecting"):
        done = subprocess.run([str(STANDINS / "QdstrmImporter"), "-i", str(tmp_path / f"{name}.qdstrm")],
                              capture_output=True, text=True)
        assert (done.returncode, done.stderr.strip()) == (2, said), name
        assert not (tmp_path / f"{name}.nsys-rep").exists() and (tmp_path / f"{name}.qdstrm").exists()


def test_ncu_runs_without_clock_control_locking_to_base_as_the_real_one_does(tmp_path):
    # ncu 2025.3.1 --help: "--clock-control arg (=base)"; fleet always passes it, ncu does not insist.
    done = subprocess.run([str(STANDINS / "ncu"), "-o", "r", "--", "true"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "r.ncu-rep").read_text())["clock_control"] == "base"


def test_ncu_import_replays_what_ncu_printed_on_an_h200(tmp_path):
    assert subprocess.run([str(STANDINS / "ncu"), "-o", "r", "--", "true"], cwd=tmp_path).returncode == 0
    done = subprocess.run([str(STANDINS / "ncu"), "--import", "r.ncu-rep", "--page", "raw", "--csv"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == (Path(__file__).parent / "fixtures/ncu-raw-h200.csv").read_text()
