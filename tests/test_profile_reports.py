"""What nsys leaves on a node, brought home as it should be: empty summaries, unfinished
and empty reports. Over the lab servers of tests/harness/lab.py, with the stand-in
profilers replaying what nsys 2025.3 did on an H200 test machine."""

from __future__ import annotations

import csv
import json
import os
import pwd
import shlex
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from fleet.agent import reports
from fleet.analysis import export
from fleet.store import kernel_rows
from tests.conftest import REPO, fleet_json, recorded_kernels, run_fleet
from tests.harness.lab import held_entries, kill_fleet_mid_run, wait_for

pytestmark = pytest.mark.usefixtures("clean_gpus")  # the lab servers (tests/harness/lab.py), started for this module

SUMMARIES = {"cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum"}


def only_run(store_root: Path) -> dict:
    [manifest] = store_root.glob("lab/*/*/manifest.json")
    return json.loads(manifest.read_text())


def summaries_of(host: dict) -> dict:
    return {r["summary"]: r for r in host["reports"] if r["status"] == "summary"}


def report_of(host: dict) -> dict:
    [rep] = [r for r in host["reports"] if r["status"] not in ("summary", "export")]
    return rep


def with_nsys(lab, tmp_path: Path, **env: str) -> dict:
    """fleet's environment, with an inventory whose nsys is the stand-in started with ``env`` (which
    its importer, its child, inherits), through a wrapper script as module systems install them."""
    c = lab["c"]
    wrapper = c.scratch(f"nsys-{tmp_path.name}") / "nsys"
    exports = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    pid_file = wrapper.with_name("profile.pid")  # `nsys profile` keeps the wrapper's pid (exec)
    wrapper.write_text(f'#!/bin/sh\n{exports}[ "$1" = profile ] && echo $$ > {pid_file}\n'
                       f'exec {c.standins() / "nsys"} "$@"\n')
    wrapper.chmod(0o755)
    doc = yaml.safe_load(c.inventory.read_text())
    doc["all"]["children"]["cluster"]["vars"]["nsys_path"] = str(wrapper)
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump(doc))
    return {**c.env(), "FLEET_INVENTORY": str(inv)}


def test_a_workload_without_nvtx_ranges_comes_home_with_its_empty_nvtx_summary(lab, tmp_path):
    store_root = tmp_path / "store"
    out = run_fleet("profile", "--store", str(store_root), "--hosts", "h02", "--", "true", env=lab["c"].env())
    assert out.returncode == 0, out.stdout + out.stderr
    assert "h02: ok" in out.stdout and "empty: nothing of its kind was recorded" in out.stdout, out.stdout
    run = only_run(store_root)
    [host] = run["hosts"]
    assert run["status"] == "complete" and host["status"] == "ok"
    # The last line says which run it was and where its reports are.
    assert out.stdout.splitlines()[-1] == (f"run {run['run_id']} complete: reports in "
                                           f"{store_root / 'lab' / run['day'] / run['run_id']} "
                                           f"(fleet reports show {run['run_id']})")
    summaries = summaries_of(host)
    assert set(summaries) == SUMMARIES and all(r["verified"] for r in summaries.values())
    nvtx = summaries["nvtx_sum"]
    assert nvtx["size"] == 0 and Path(nvtx["stored"]).read_bytes() == b""
    assert [k for k, _, _ in kernel_rows(Path(summaries["cuda_gpu_kern_sum"]["stored"]))] == recorded_kernels()
    # The report's SQLite export came home too, verified, and said with its size in the host's lines.
    [exported] = [r for r in host["reports"] if r["status"] == "export"]
    assert exported["verified"] and exported["summary"] == "sqlite" and exported["stored"].endswith(".sqlite")
    assert f"  export:   {exported['stored']} ({exported['size']} bytes, sha256 {exported['sha256'][:12]}…, verified)" \
        in out.stdout.splitlines()
    [traced] = [p for p in export.read(exported["stored"]) if p.kernels]
    assert sorted({name for _, _, name in traced.kernels}) == sorted(recorded_kernels())

    pulled = run_fleet("reports", "pull", run["run_id"], str(tmp_path / "out"), "--store", str(store_root))
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert (tmp_path / "out" / "h02" / Path(nvtx["stored"]).name).read_bytes() == b""
    listed = fleet_json(run_fleet("reports", "ls", "--store", str(store_root), "--json").stdout)
    assert sorted(r["status"] for r in listed) == ["complete", "export", "summary", "summary", "summary"]


def test_a_trace_without_cuda_has_an_empty_kernel_summary_and_no_kernels_catalogued(lab, tmp_path):
    store_root = tmp_path / "store"
    runs = []
    for args in (("-X", "--trace=nvtx"), ()):
        out = run_fleet("profile", "--store", str(store_root), "--hosts", "h02", "--json", *args, "--",
                        "sh", "-c", 'echo step >> "$STANDIN_NVTX_LOG"', env=lab["c"].env())
        assert out.returncode == 0, out.stderr
        doc = fleet_json(out.stdout)
        runs.append(doc["run_id"])
        summaries = summaries_of(doc["hosts"][0])
        assert all(r["verified"] for r in summaries.values())
        assert ",PushPop,:step" in Path(summaries["nvtx_sum"]["stored"]).read_text()
    compared = fleet_json(run_fleet("reports", "compare", *runs, "--store", str(store_root), "--json").stdout)
    assert sorted(k["kernel"] for k in compared) == sorted(recorded_kernels())  # only the second run had kernels
    assert all(k["a_ns"] == 0 and k["b_ns"] > 0 for k in compared)


def test_a_summary_that_does_not_come_home_fails_nothing_and_is_recorded(lab, tmp_path):
    store_root = tmp_path / "store"
    kill_fleet_mid_run(lab, store_root)  # fleet dies before anything comes home
    run = only_run(store_root)
    report_dir = Path(run["hosts"][0]["plan"]["output"]).parent
    wait_for(lambda: (report_dir / "h01.result.json").exists() and held_entries(lab) == {})
    [nvtx_csv] = report_dir.glob("*_nvtx_sum.csv")
    nvtx_csv.unlink()  # gone from the node before it came home

    out = run_fleet("gather", run["run_id"], "--store", str(store_root), env=lab["c"].env())
    assert out.returncode == 0, out.stdout + out.stderr
    run = only_run(store_root)
    [host] = run["hosts"]
    assert run["status"] == "complete" and host["status"] == "ok" and not host["missing_why"]
    summaries = summaries_of(host)
    assert not summaries["nvtx_sum"]["verified"] and "No such file" in summaries["nvtx_sum"]["error"]
    assert summaries["cuda_gpu_kern_sum"]["verified"] and summaries["cuda_api_sum"]["verified"]

    pulled = run_fleet("reports", "pull", run["run_id"], str(tmp_path / "out"), "--store", str(store_root))
    assert pulled.returncode == 0, pulled.stdout + pulled.stderr
    assert f"{nvtx_csv.name} is not in the store" in pulled.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "h01").iterdir()) == sorted(
        Path(r["stored"]).name for r in host["reports"] if r["verified"])


def test_a_qdstrm_left_at_the_output_name_by_nsys_exiting_0_is_finished(lab, tmp_path):
    # nsys 2025.3 whose importer cannot start (libdw.so.1 missing) says so, leaves NAME.qdstrm, exits 0.
    env = with_nsys(lab, tmp_path, STANDIN_MISSING_LIBRARY="libdw.so.1")
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "h02", "--json", "--", "true", env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    run = fleet_json(out.stdout)
    [host] = run["hosts"]
    assert host["status"] == "ok" and host["result"]["exit_status"] == 0
    assert 0 < run["phases"]["probed"] < run["phases"]["home"], run["phases"]  # the controller's moments
    rep = report_of(host)
    assert rep["status"] == "finished-from-qdstrm" and rep["verified"]
    assert summaries_of(host)["cuda_gpu_kern_sum"]["size"] > 0  # fleet's kernel summary of it: all nsys collected
    notes = host["result"]["notes"]
    assert any(n.startswith("nsys left its data unfinished at ") and "Unable to retrieve the importer version" in n
               for n in notes), notes
    assert any(n.startswith("finished ") for n in notes), notes
    assert host["result"]["unfinished"] == []  # finished: nothing of it is left unfinished
    summaries = summaries_of(host)
    assert set(summaries) == SUMMARIES and all(r["verified"] for r in summaries.values())


def children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_nsys_killed_while_generating_leaves_an_empty_report_its_data_is_finished_instead(lab, tmp_path):
    # As on an H200 test machine: nsys and the importer generating its report SIGKILLed mid-way
    # leave a 0-byte NAME.nsys-rep and the data in $TMPDIR/nsys-report-XXXX.qdstrm.
    env = with_nsys(lab, tmp_path, STANDIN_IMPORT_SECONDS="120")
    wrapper_dir = lab["c"].scratch(f"nsys-{tmp_path.name}")
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(tmp_path / "store"), "--hosts",
                             "h02", "--json", "--", "true"], env={**os.environ, **env}, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    importer = None
    try:
        def importing():
            nonlocal importer
            pid_path = wrapper_dir / "profile.pid"
            nsys = int(pid_path.read_text()) if pid_path.exists() and pid_path.read_text().strip() else None
            for child in children(nsys) if nsys else []:
                try:
                    argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
                except OSError:  # a child that has just exited
                    continue
                if any(a.endswith(b"QdstrmImporter") for a in argv) and b"--output-file" in argv:
                    report = Path(argv[argv.index(b"--output-file") + 1].decode())
                    if report.exists():
                        importer = (nsys, child, report)
            return importer is not None
        wait_for(importing)
        nsys, child, report = importer
        assert report.stat().st_size == 0
        os.kill(nsys, signal.SIGKILL)
        os.kill(child, signal.SIGKILL)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, stdout + stderr
    [host] = fleet_json(stdout)["hosts"]
    assert host["status"] == "ok" and host["result"]["exit_status"] == -9
    rep = report_of(host)  # one report, under the name nsys was writing, finished from its data
    assert rep["remote"] == str(report) and rep["status"] == "finished-from-qdstrm" and rep["verified"]
    assert rep["size"] > 0
    notes = host["result"]["notes"]
    assert f"{report.with_suffix('.qdstrm')}" in " ".join(notes)
    assert any(n.startswith(f"{report} is empty, not a report") for n in notes), notes
    summaries = summaries_of(host)
    assert set(summaries) == SUMMARIES and all(r["verified"] and r["size"] > 0 for r in summaries.values()
                                               if r["summary"] != "nvtx_sum")


def taken_name_run(tmp_path, made) -> tuple[list, list, Path]:
    """collect() after nsys exited 0 having said it wrote /tmp/nsys-report-XXXX.nsys-rep, as nsys 2025.3
    does when the output name is taken; ``made(path)`` puts there what the test wants."""
    elsewhere = Path(f"/tmp/nsys-report-{os.getpid():x}{os.urandom(2).hex()}.nsys-rep")
    plan = SimpleNamespace(tool="nsys", output=str(tmp_path / "h01-%p"), nsys=None)
    tail = (f"Failed to create '{tmp_path}/h01-7.qdstrm': File exists.\nUse `--force-overwrite true` to overwrite "
            f"existing files.\nCollecting data...\nGenerated:\n\t{elsewhere}\n").encode()
    try:
        made(elsewhere)
        notes: list = []
        return reports.collect(plan, tail, notes, killed=False), notes, elsewhere
    finally:
        if elsewhere.is_symlink() or elsewhere.exists():
            elsewhere.unlink()


def test_a_report_nsys_wrote_to_tmp_because_the_name_was_taken_is_moved_home_on_exit_0(tmp_path):
    [rep], notes, elsewhere = taken_name_run(tmp_path, lambda p: p.write_text('{"tool": "nsys"}'))
    assert rep["path"] == str(tmp_path / "h01-moved0.nsys-rep") and rep["size"] == len('{"tool": "nsys"}')
    assert not elsewhere.exists() and f"nsys wrote {elsewhere} because the name was taken" in " ".join(notes)


def test_a_link_or_another_users_file_at_that_tmp_name_is_left_alone(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("not a report")
    found, notes, _ = taken_name_run(tmp_path, lambda p: p.symlink_to(victim))
    assert found == [] and victim.read_text() == "not a report" and not list(tmp_path.glob("*.nsys-rep"))
    assert any("not a regular file of ours: left there" in n for n in notes), notes

    nobody = pwd.getpwnam("nobody").pw_uid

    def planted(p: Path) -> None:
        p.write_text('{"tool": "nsys"}')
        os.chown(p, nobody, nobody)
    found, notes, _ = taken_name_run(tmp_path, planted)
    assert found == [] and any("not a regular file of ours" in n for n in notes), notes


def test_reports_stats_reads_what_the_run_brought_home(lab, tmp_path):
    store_root = tmp_path / "store"
    out = run_fleet("profile", "--store", str(store_root), "--hosts", "h02", "--", "sh", "-c",
                    'echo step >> "$STANDIN_NVTX_LOG"', env=lab["c"].env())
    assert out.returncode == 0, out.stdout + out.stderr
    run = only_run(store_root)
    [host] = run["hosts"]
    doc = fleet_json(run_fleet("reports", "stats", run["run_id"], "h02", "--top", "1000", "--json", "--store",
                               str(store_root)).stdout, "reports stats")  # every row, not the top 10
    assert [c["label"] for c in doc["columns"]] == ["h02"]
    # Each table holds the rows of the CSV file in the store, whatever the profiler named them.
    for name, key, column in (("cuda_gpu_kern_sum", "kernels", "Name"), ("cuda_api_sum", "api_calls", "Name"),
                              ("nvtx_sum", "nvtx_ranges", "Range")):
        with open(summaries_of(host)[name]["stored"], newline="") as f:
            rows = {r[column]: float(r["Total Time (ns)"]) for r in csv.DictReader(f)}
        assert rows and {r["name"]: r["total_ns"] for r in doc[key]["rows"]} == rows, key
