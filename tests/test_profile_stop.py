"""Stopping a workload early without losing what it did. On an H200 test machine, SIGTERM or
SIGINT to nsys, or SIGTERM to the workload, finished the report with no kernel in it; nsys's own
--duration kept them (tests/fixtures/tools-2025.3-h200/). So a --timeout on nsys is --duration,
with the agent's signal only as a late backstop; the user's own --duration wins. Over the lab
servers of tests/harness/lab.py, with the stand-in nsys replaying those recordings."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.conftest import REPO, fleet_json
from tests.harness.lab import fleet

pytestmark = pytest.mark.usefixtures("clean_gpus")  # the lab servers (tests/harness/lab.py), started for this module
RECORDED = REPO / "tests" / "fixtures" / "tools-2025.3-h200"


def kernels_of(run: dict) -> list[str]:
    [kern] = [r for r in run["reports"] if r["stored"].endswith("_cuda_gpu_kern_sum.csv")]
    return [row["Name"] for row in csv.DictReader(open(kern["stored"], newline=""))]


def test_the_recordings_say_only_nsys_own_stop_keeps_the_kernels():
    for case in ("nsys-sigterm", "nsys-sigint", "nsys-app-sigterm"):
        assert (RECORDED / f"{case}-stats" / "s_cuda_gpu_kern_sum.csv").read_bytes() == b"", case
        assert (RECORDED / f"{case}-stats" / "s_nvtx_sum.csv").read_text().count(":fleet-check") == 1, case
    assert "--duration=5" in (RECORDED / "nsys-duration" / "cmd.txt").read_text()
    assert len((RECORDED / "nsys-duration-stats" / "s_cuda_gpu_kern_sum.csv").read_text().splitlines()) > 1
    assert (RECORDED / "nsys-duration" / "status.txt").read_text().strip() == "143"


def test_a_timeout_is_nsys_own_duration_the_kernels_are_kept_and_the_stop_is_said(lab):
    out = fleet(lab, "--hosts", "h03", "--timeout", "1.5", "--json", "--", "sleep", "60")
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    assert "--duration=2" in run["plan"]["command"]["fleet_flags"]
    assert run["result"]["stopped"] is True and run["result"]["exit_status"] == 143
    assert run["reports"][0]["verified"] and kernels_of(run)  # a signal would have left none
    assert any("by nsys (--duration), its kernels until then kept" in n for n in run["result"]["notes"])
    text = fleet(lab, "--hosts", "h03", "--timeout", "1", "--", "sleep", "60")
    assert text.returncode == 0, text.stderr
    assert "note:     the workload was stopped at its time limit of 1s, by nsys (--duration)" in text.stdout


def test_the_users_own_duration_wins_and_a_signal_then_stops_at_the_timeout(lab):
    out = fleet(lab, "--hosts", "h03", "--timeout", "1.5", "-X", "-d", "-X", "30", "--json", "--", "sleep", "60")
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    command = run["plan"]["command"]
    assert not [f for f in command["fleet_flags"] if f.startswith("--duration")] and command["user_flags"] == ["-d", "30"]
    # nsys was signalled at the timeout: finished, stopped, and, as the real one did, no kernels.
    assert run["result"]["stopped"] is True and run["reports"][0]["verified"] and kernels_of(run) == []
    assert any("at its time limit of 1.5s, with a signal" in n for n in run["result"]["notes"])


def test_a_workload_that_ends_before_its_timeout_is_not_called_stopped(lab):
    out = fleet(lab, "--hosts", "h03", "--timeout", "30", "--json", "--", "true")
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    assert run["result"]["stopped"] is False and not any("stopped" in n for n in run["result"]["notes"])
    assert Path(run["reports"][0]["stored"]).exists()


def test_a_workload_that_ends_just_before_its_timeout_is_not_called_stopped(lab):
    """The agent's clock passes the limit before the workload's end is seen; only nsys's 143 is its
    stop. nsys's --duration counts from its own start and the sleep from later still, so on a loaded
    machine nsys may really end it first: then that is said, never an "ok" beside a SIGTERM."""
    out = fleet(lab, "--hosts", "h03", "--timeout", "3", "--json", "--", "sleep", "2.8")
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    result = run["result"]
    if result["exit_status"] == 0:
        assert result["stopped"] is False and not any("stopped" in n for n in result["notes"]), result
    else:
        assert result["exit_status"] == 143 and result["stopped"] is True, result
        assert any("by nsys (--duration)" in n for n in result["notes"]), result["notes"]
    assert run["status"] == "ok", run


def test_with_a_delay_nsys_duration_would_not_be_the_timeout_so_the_agent_stops_it(lab):
    out = fleet(lab, "--hosts", "h03", "--timeout", "1.5", "-X", "--delay=1", "--json", "--", "sleep", "60")
    assert out.returncode == 0, out.stderr
    [run] = fleet_json(out.stdout)["hosts"]
    assert not [f for f in run["plan"]["command"]["fleet_flags"] if f.startswith("--duration")]
    assert any("at its time limit of 1.5s, with a signal" in n for n in run["result"]["notes"])


def test_a_timeout_that_is_no_number_of_seconds_is_a_usage_error(lab):
    for bad in ("0", "-5", "inf", "nan", "1e300"):
        out = fleet(lab, "--hosts", "h03", "--timeout", bad, "--", "true")
        assert out.returncode == 2 and "--timeout" in out.stderr and "Traceback" not in out.stderr, (bad, out.stderr)
