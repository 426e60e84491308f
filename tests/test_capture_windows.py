"""Windows the workload opens, through the real command line: `--nvtx-window RANGE[@DOMAIN]` and
`--cuda-profiler-window` have nsys collect within the workload's NVTX range, or from its
cudaProfilerStart() to its cudaProfilerStop(), and `--repeat N` takes N of them, each its own report;
the workload goes on after them to its end.

fleet runs the agent on this machine (``ansible_connection=local``) with the simulated NVML and the
stand-in nsys, which replays what nsys 2025.3 did on an H100 test machine with such capture ranges
(tests/fixtures/nsys-sessions-h100, nvtx-repeat: reports NAME.1 and NAME.2 of one `step` range each;
cuda-api: one report, the workload running on to its end and nsys exiting with it). The workloads
say a range they opened, or their cudaProfilerStart/Stop, as tests/standins/nsys_capture.py reads them.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from fleet import completeness, exitcodes, store
from tests.conftest import fleet_json, run_fleet
from tests.harness.agent_node import local_inventory_node

# A training loop of sorts: three `step` ranges 0.3 s apart, then a last line of its own after them.
STEPS = 'for i in 1 2 3; do sleep 0.3; echo step >> "$STANDIN_NVTX_LOG"; done; sleep 0.5; echo after the steps'
# cudaProfilerStart() after a while, cudaProfilerStop() 0.5 s later, and a second pair the window ignores.
PROFILER_API = ('sleep 0.3; echo start >> "$STANDIN_CUDA_PROFILER_LOG"; sleep 0.5; echo stop >> "$STANDIN_CUDA_PROFILER_LOG";'
                ' echo start >> "$STANDIN_CUDA_PROFILER_LOG"; echo stop >> "$STANDIN_CUDA_PROFILER_LOG"; sleep 0.5;'
                ' echo after the window')


@pytest.fixture
def node(tmp_path):
    return local_inventory_node(tmp_path)


def profile(node, *args: str):
    return run_fleet("profile", "--hosts", "gpu01", "--store", str(node["store"]), *args, env=node["env"])


def reports(host: dict) -> dict[str, dict]:
    """The host's reports brought home, by file name: what the stand-in nsys wrote in each."""
    found = {}
    for report in host["reports"]:
        if report["stored"].endswith(".nsys-rep"):
            assert report["verified"], report
            found[Path(report["stored"]).name] = json.loads(Path(report["stored"]).read_text())
    return found


def test_repeat_takes_that_many_nvtx_windows_each_its_own_report_and_the_workload_runs_on(node):
    out = profile(node, "--nvtx-window", "step", "--repeat", "2", "--json", "--", "sh", "-c", STEPS)
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    assert host["status"] == "ok", host
    written = reports(host)
    assert sorted(name.split(".", 1)[1] for name in written) == ["1.nsys-rep", "2.nsys-rep"], written
    assert all(r["nvtx"] == [{"name": "step", "time_ns": r["nvtx"][0]["time_ns"]}] for r in written.values())
    assert "after the steps" in out.stderr  # the workload's own line after its windows, relayed
    assert host["result"]["workload"] == {"exit_status": 0, "signal": None}
    assert ("nsys collected 2 windows (NVTX range 'step'), and the workload went on to its end"
            in host["result"]["notes"])
    argv = host["plan"]["argv"]
    for flag in ("--capture-range=nvtx", "--nvtx-capture=step", "--capture-range-end=repeat:2"):
        assert flag in argv, argv
    assert host["plan"]["env"]["NSYS_NVTX_PROFILER_REGISTER_ONLY"] == "0"  # nsys's, which the workload inherits
    assert not [f for f in argv if f.startswith("--duration")]


def test_one_nvtx_window_is_one_report_named_as_any_other(node):
    out = profile(node, "--nvtx-window", "step@*", "--json", "--", "sh", "-c", STEPS)
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    [(name, written)] = reports(host).items()
    assert name.count(".") == 1 and written["nvtx"][0]["name"] == "step", name
    assert "--capture-range-end=stop" in host["plan"]["argv"]
    assert "nsys collected 1 window (NVTX range 'step@*'), and the workload went on to its end" in \
        host["result"]["notes"]


def test_fewer_windows_than_asked_are_kept_and_said(node):
    out = profile(node, "--nvtx-window", "step", "--repeat", "5", "--json", "--", "sh", "-c", STEPS)
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    assert len(reports(host)) == 3
    [note] = [n for n in host["result"]["notes"] if n.startswith("nsys collected")]
    assert note.endswith("; 3 of the 5 asked (--repeat 5): the workload opened it 3 times"), note
    # the run's count is of reports, each window's its own, not of hosts
    manifest = store.read_manifest(store.manifest_of(node["store"], fleet_json(out.stdout)["run_id"]))
    assert completeness.run_lines(manifest.hosts) == ["reports: 3 complete"]


def test_a_window_the_workload_never_opens_is_said_and_fails_the_run(node):
    out = profile(node, "--nvtx-window", "epoch", "--json", "--", "sh", "-c", STEPS)
    assert out.returncode != 0, out.stdout
    [host] = fleet_json(out.stdout)["hosts"]
    assert host["result"]["status"] == "no-report" and not reports(host), host
    assert ("no window was taken: the workload never opened one (NVTX range 'epoch') while nsys ran, and nsys "
            "collects nothing outside it") in host["result"]["reasons"]


def test_the_cuda_profiler_window_is_the_first_start_to_its_stop(node):
    out = profile(node, "--cuda-profiler-window", "--json", "--", "sh", "-c", PROFILER_API)
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    assert len(reports(host)) == 1 and host["status"] == "ok", host
    assert "after the window" in out.stderr
    argv = host["plan"]["argv"]
    assert "--capture-range=cudaProfilerApi" in argv and "--capture-range-end=stop" in argv, argv
    assert "nsys collected 1 window (cudaProfilerStart() to cudaProfilerStop()), and the workload went on to its end" in \
        host["result"]["notes"]


def test_a_workload_that_fails_after_its_windows_fails_the_run(node):
    out = profile(node, "--nvtx-window", "step", "--", "sh", "-c", STEPS + "; exit 3")
    assert out.returncode == exitcodes.WORKLOAD_FAILED, out.stdout + out.stderr
    assert "gpu01: workload-failed: the workload exited 3" in out.stderr


@pytest.mark.parametrize("args, said", [
    (("--repeat", "2"), "--repeat N takes windows the workload opens: give --nvtx-window or --cuda-profiler-window"),
    (("--detach",), "--detach leaves a workload running after a window: give --window START:DURATION, --nvtx-window"),
    (("--window", "1:2", "--repeat", "2"), "--repeat N takes windows the workload opens"),
    (("--nvtx-window", "step", "--cuda-profiler-window"), "--nvtx-window and --cuda-profiler-window each set"),
    (("--window", "1:2", "--nvtx-window", "step"), "--window and --nvtx-window each set nsys's window: give one"),
    (("--nvtx-window", "step", "--tool", "ncu"), "--nvtx-window is nsys's (--capture-range=nvtx"),
    (("--cuda-profiler-window", "--timeout", "9"), "--timeout ends it: give one"),
    (("--nvtx-window", "step", "-X", "--capture-range-end=repeat"), "-X --capture-range-end sets nsys's window"),
    (("--nvtx-window", "step", "-X", "--trace=cuda,osrt"), "--nvtx-window needs NVTX traced"),
    (("--nvtx-window", "a@b@c"), "RANGE or RANGE@DOMAIN, each part not empty"),
    (("--nvtx-window", "step@"), "RANGE or RANGE@DOMAIN, each part not empty"),
    (("--nvtx-window", "st\nep"), "one line of printable text"),
    (("--nvtx-window", "-x"), "not starting with '-'"),
    (("--nvtx-window", "s" * 201), "1 to 200 characters"),
    (("--cuda-profiler-window", "--repeat", "0"), "--repeat"),
])
def test_a_window_fleet_cannot_plan_is_refused_in_one_line_before_any_host(node, args, said):
    out = profile(node, *args, "--", "touch", str(node["dir"] / "ran"))
    assert out.returncode == 2 and said in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert not (node["dir"] / "ran").exists() and not node["store"].exists()


def test_an_escaped_at_is_part_of_the_range_s_name(node):
    out = profile(node, "--nvtx-window", "a\\@b", "--dry-run", "--", "true")
    assert out.returncode == 0, out.stderr
    assert "--nvtx-capture='a\\@b'" in out.stdout or "--nvtx-capture=a\\@b" in out.stdout, out.stdout


def test_detach_leaves_once_every_window_asked_has_its_report(node):
    """--detach with --repeat 2: fleet answers once both windows' reports are written (nsys writes each
    as its window ends), the reports home, and the workload runs on, its output in the run's file."""
    steps = 'echo first; for i in 1 2; do sleep 0.3; echo step >> "$STANDIN_NVTX_LOG"; done; sleep 20; echo last'
    out = profile(node, "--nvtx-window", "step", "--repeat", "2", "--detach", "--json", "--", "sh", "-c", steps)
    assert out.returncode == 0, out.stderr
    [host] = fleet_json(out.stdout)["hosts"]
    running = host["result"]["workload"]["running"]
    try:
        assert host["status"] == "ok" and len(reports(host)) == 2, host
        assert all(Path(f"/proc/{pid}").exists() for pid in running["pids"])  # fleet answered; it runs on
        assert Path(running["output"]).read_text().splitlines()[0] == "first"  # its own file, from its start
        assert "nsys collected 2 windows (NVTX range 'step'), and the workload runs on (--detach)" in \
            host["result"]["notes"]
        [note] = [n for n in host["result"]["notes"] if n.startswith("--detach:")]
        assert note.startswith("--detach: nsys wrote the report of every window asked, and the workload runs on: "
                               f"pid {running['pids'][0]} (nsys, the workload below it), its output in "), note
    finally:
        for pid in running["pids"]:
            try:
                os.kill(pid, signal.SIGTERM)  # the test's own nsys, by its pid: it passes SIGTERM to the workload
            except ProcessLookupError:
                pass
