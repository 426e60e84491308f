"""``fleet reports open``: the run's reports in nsys-ui/ncu-ui when one is on PATH (a stand-in
here, which records how it was started), else the command and the paths."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

from fleet.store.manifest import HostEntry, ReportEntry
from tests.conftest import fleet_json, run_fleet
from tests.harness.store_runs import RUN, file_run, nsys_summaries, run_dir


def report(directory: Path, host: str, name: str, status: str = "complete") -> ReportEntry:
    target = directory / host / name
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"report")
    return ReportEntry(remote=f"/node/{name}", stored=str(target), size=6, status=status, verified=True)


def viewer(bin_dir: Path, name: str) -> Path:
    """A stand-in viewer: writes its argv and its session id, then stays up as a viewer does."""
    log = bin_dir / f"{name}.log"
    script = bin_dir / name
    bin_dir.mkdir(exist_ok=True)
    script.write_text(f'#!/bin/sh\nps -o sid= -p $$ > {log}.tmp\nfor a; do echo "$a"; done >> {log}.tmp\n'
                      f'mv {log}.tmp {log}\nexec sleep 30\n')
    script.chmod(0o755)
    return log


def slurm_run(store_root: Path) -> list[Path]:
    d = run_dir(store_root, "fleetci")
    reports = [report(d, "node1", "rank0.nsys-rep"), report(d, "node2", "rank1.nsys-rep", "finished-from-qdstrm")]
    file_run(store_root, [HostEntry("node1", "ok", rank=0, reports=[reports[0], *nsys_summaries(d, "node1", "rank0")]),
                          HostEntry("node2", "ok", rank=1, reports=[reports[1]]),
                          HostEntry("(no result)", "missing", rank=2)], site="fleetci")
    return [Path(r.stored) for r in reports]


def wait_for(path: Path, timeout: float = 10) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


def test_nsys_ui_on_path_is_started_detached_on_the_runs_reports(tmp_path):
    reports = slurm_run(tmp_path / "store")
    log = viewer(tmp_path / "bin", "nsys-ui")
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "FLEET_STORE": str(tmp_path / "store")}
    started = time.monotonic()
    out = run_fleet("reports", "open", RUN, "--json", env=env)
    assert out.returncode == 0, out.stderr
    assert time.monotonic() - started < 20  # it did not wait for the viewer (which stays up 30 s)
    doc = fleet_json(out.stdout, "reports open")
    assert doc["opened"] and doc["viewer"] == "nsys-ui" and doc["reports"] == [str(p) for p in reports]
    sid, *argv = wait_for(log).splitlines()
    assert argv == [str(p) for p in reports]  # the summaries and the missing rank are not opened
    assert int(sid) == doc["pid"]  # its own session: closing fleet's terminal does not close it
    os.kill(doc["pid"], 15)

    log.unlink()
    out = run_fleet("reports", "open", RUN, "1", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("opened 1 report(s) in nsys-ui (pid ") and f"  {reports[1]}\n" in out.stdout
    sid, *argv = wait_for(log).splitlines()
    assert argv == [str(reports[1])]
    os.kill(int(sid), 15)


def test_without_a_viewer_the_command_and_the_paths_are_printed(tmp_path):
    reports = slurm_run(tmp_path / "store")
    (tmp_path / "empty").mkdir()
    env = {"PATH": str(tmp_path / "empty"), "FLEET_STORE": str(tmp_path / "store")}
    out = run_fleet("reports", "open", RUN, "node1", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout == (f"nsys-ui is not on PATH; open the report(s) with:\n  nsys-ui {shlex.quote(str(reports[0]))}\n"
                          f"  {reports[0]}\n")
    doc = fleet_json(run_fleet("reports", "open", RUN, "--json", env=env).stdout)
    assert doc == {"run_id": RUN, "viewer": "nsys-ui", "opened": False, "pid": None,
                   "command": ["nsys-ui", *map(str, reports)], "reports": [str(p) for p in reports]}


def test_an_ncu_run_opens_in_ncu_ui_and_a_run_without_reports_says_so(tmp_path):
    store_root = tmp_path / "store"
    d = run_dir(store_root)
    file_run(store_root, [HostEntry("h02", "ok", reports=[report(d, "h02", "h02-451.ncu-rep")])], tool="ncu")
    env = {"PATH": str(tmp_path), "FLEET_STORE": str(store_root)}
    doc = fleet_json(run_fleet("reports", "open", RUN, "--json", env=env).stdout)
    assert doc["viewer"] == "ncu-ui" and doc["command"] == ["ncu-ui", str(d / "h02" / "h02-451.ncu-rep")]

    other = RUN[:-1] + "7"
    file_run(store_root, [HostEntry("h02", "refused"), HostEntry("h03", "ok", reports=[
        ReportEntry(stored=str(d / "h03" / "gone.nsys-rep"), status="missing")])], run_id=other)
    for args, said in (((other,), f"fleet: run {other} has no report in the store to open\n"),
                       ((RUN, "h03"), f"fleet: run {RUN} has no host or rank 'h03' with reports; it has: h02\n"),
                       (("../x",), None)):
        out = run_fleet("reports", "open", *args, env=env)
        assert out.returncode == 2 and out.stdout == "" and len(out.stderr.splitlines()) == 1, out
        assert said is None or out.stderr == said
