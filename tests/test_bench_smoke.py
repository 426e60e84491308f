"""The benchmarks keep running: a change of the wire or the command line that breaks one fails here,
not months later when somebody measures again (bench/scale.py's simulated hosts once answered in a
format the client had come to refuse, and every host said "no probe answer from the agent")."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.harness.agent_node import Node

# Each benchmark starts sshd hosts, a Slurm cluster or the team store's servers in a process of its own, as root.
pytestmark = [pytest.mark.services, pytest.mark.root]


def test_the_scale_benchmark_gets_every_simulated_hosts_probe_and_profiles_one_more_run(tmp_path):
    out = tmp_path / "scale.json"
    r = subprocess.run([sys.executable, "bench/scale.py", "--hosts", "6", "--runs", "1", "--out", str(out),
                        "--profile", "cpu"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = json.loads(out.read_text())["counts"][0]["runs"]
    assert [(run["rc"], run["ok"], run["errors"]) for run in runs] == [(0, 6, [])]
    report = Path(re.search(r"6 hosts: cpu profile in (\S+)", r.stdout).group(1))  # bench/scale_profile.py's
    assert "cumulative" in report.read_text()
    shutil.rmtree(report.parent)


def test_the_change_points_benchmark_scores_fleet_on_every_kind_of_history(tmp_path):
    out = tmp_path / "changepoints.json"
    r = subprocess.run([sys.executable, "bench/changepoints.py", "--histories", "4", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    scenarios = json.loads(out.read_text())["scenarios"]
    assert len(scenarios) == 7 and scenarios["code step +5%"]["fleet"]["placed"] == 4


def bench(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, *argv], cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def test_the_probe_benchmark_probes_every_host_and_counts_its_sessions(tmp_path):
    r = bench("bench/probe.py", "--hosts", "2", "--runs", "1", "--node-runs", "1", "--out", str(tmp_path))
    doc = json.loads((tmp_path / "probe-2.json").read_text())
    assert len(doc["runs"]["probe"]) == 1 and len(doc["runs"]["exec true"]) == 1
    assert doc["sessions_per_host"] and min(doc["sessions_per_host"]) >= 1
    assert "probe / exec true (paired wall):" in r.stdout


def test_the_top_benchmark_streams_from_every_host_beside_gpustat_over_ssh(tmp_path):
    out = tmp_path / "top.json"
    bench("bench/top.py", "--hosts", "2", "--seconds", "3", "--out", str(out))
    [count] = json.loads(out.read_text())["results"]
    assert count["hosts"] == 2 and set(count["first_screen"]) == {"fleet", "gpustat_over_ssh"}
    assert set(count["stream"]) == {"fleet", "gpustat_over_ssh"}


def test_the_fanout_benchmark_gets_one_line_per_host_from_fleet_and_its_peers(tmp_path):
    bench("bench/fanout.py", "--hosts", "2", "--runs", "1", "--warmup", "0", "--wait-quiet", "0",
          "--out", str(tmp_path))
    [raw] = tmp_path.glob("fanout-2*.json")
    runs = json.loads(raw.read_text())["runs_raw"]
    assert set(runs) == {"fleet", "pdsh", "clush", "xargs", "pdsh-c25519", "clush-c25519", "xargs-c25519",
                         "bare-asyncssh"}
    assert all([(r["rc"], r["ok"]) for r in rs] == [(0, 2)] for rs in runs.values()), runs  # one line from each host


def test_the_startup_benchmark_times_fleet_beside_ssh(tmp_path):
    out = tmp_path / "startup.json"
    bench("bench/startup.py", "--runs", "1", "--before", "HEAD", "--after", "HEAD", "--out", str(out))
    doc = json.loads(out.read_text())
    assert all(len(rounds) == 1 for rounds in doc["rounds"].values()) and "ssh host true" in doc["rounds"]
    assert doc["paired_ratios"]["fleet exec one host (after) / ssh host true"] > 0


def test_the_transfer_benchmark_brings_the_file_home_beside_scp_sftp_and_rsync(tmp_path):
    bench("bench/transfer.py", "--size-mib", "2", "--runs", "1", "--out", str(tmp_path))
    [raw] = tmp_path.glob("transfer-2-*.json")
    doc = json.loads(raw.read_text())
    assert set(doc["paired"]) == {"fleet/scp", "fleet/sftp", "fleet/rsync", "fleet/scp-aes", "asyncssh/scp"}
    assert all(len(sides[name]) == 1 for sides in doc["mb_per_s"].values() for name in sides)


def test_the_transfer_benchmark_brings_a_runs_report_and_export_home_beside_the_peers_that_compress(tmp_path):
    bench("bench/transfer.py", "--content", "export", "--size-mib", "2", "--report-mib", "1", "--runs", "1",
          "--label", "export", "--out", str(tmp_path))
    [raw] = tmp_path.glob("transfer-2-*-export.json")
    doc = json.loads(raw.read_text())
    assert set(doc["paired"]) == {"fleet/fleet-raw", "fleet/scp", "fleet/scp-C", "fleet/rsync-z"}
    # fleet is in every pair: two files each time, in a warm-up and a round
    assert doc["bytes"] >= (3 << 20) and len(doc["fleet_routes"]["fleet"]) == len(doc["pairs"]) * 2 * 2


def test_the_transfer_studies_run_their_variants_thresholds_modes_and_profile(tmp_path):
    r = bench("bench/transfer_variants.py", "--size-mib", "2", "--runs", "1")
    assert "| scp |" in r.stdout and "| fleet |" in r.stdout, r.stdout[-2000:]
    bench("bench/transfer_threshold.py", "--sizes-mib", "8", "--runs", "1", "--out", str(tmp_path))  # STREAM_MIN
    [threshold] = tmp_path.glob("transfer-threshold-*.json")
    assert set(json.loads(threshold.read_text())["seconds"]["8"]) == {"asyncssh", "openssh"}
    bench("bench/transfer_modes.py", "--size-mib", "2", "--runs", "1", "--label", "smoke", "--out", str(tmp_path))
    assert list(tmp_path.glob("transfer-modes-*-smoke.json"))
    r = bench("bench/transfer_profile.py", "--size-mib", "2", "--top", "5")
    assert " MB/s, client CPU " in r.stdout and "function calls" in r.stdout


def test_the_slurm_benchmark_times_fleet_beside_raw_sbatch_and_counts_slurmctlds_rpcs(tmp_path):
    r = bench("bench/slurm.py", "--runs", "1", "--out", str(tmp_path), timeout=600)
    doc = json.loads((tmp_path / "slurm.json").read_text())
    assert set(doc["wall_s"]) == {"fleet", "sbatch"} and all(len(w) == 1 for w in doc["wall_s"].values())
    assert "fleet overhead over raw sbatch --wait:" in r.stdout


def test_the_page_reuse_benchmark_writes_after_each_pause(tmp_path):
    bench("bench/page_reuse.py", "--size-mib", "8", "--pauses", "0,0.1", "--out", str(tmp_path))
    rows = json.loads((tmp_path / "page-reuse.json").read_text())["rows"]
    assert [r["pause_s"] for r in rows] == [0, 0.1] and all(r["wall_s"] > 0 for r in rows)


def test_the_team_store_benchmark_sends_beside_boto3_and_lists_the_catalog(tmp_path):
    r = bench("bench/team_store.py", "--mib", "8", "--rounds", "1", "--memory-mib", "8",
              "--catalogued", "100", "--pushed", "3", timeout=600)
    doc = json.loads(r.stdout)
    assert len(doc["fleet reports push (3 runs): first, again"]) == 2
    assert [set(row) for row in doc["upload_8mib"]] == [{"fleet", "boto3"}] and list(doc["memory"]) == ["8 MiB"]
    assert len(doc["fleet reports ls (100 runs)"]) == 1


def test_the_agent_profile_times_the_shipped_agent_and_names_where_its_time_goes(tmp_path):
    env = Node(tmp_path).env  # a simulated H200, the stand-in nsys and ncu on PATH (asked --version)
    argv = ["bench/agent_profile.py", "--python", sys.executable, "--runs", "1", "--top", "40"]
    r = subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert re.search(r"medians of 1: agent [0-9.]+ ms, its probe's sections [0-9.]+ ms", r.stdout), r.stdout
    # the probe, and its tools' section: their --version asked, then answered
    assert "fleet_agent_node.py" in r.stdout and "(answers)" in r.stdout, r.stdout


def test_the_least_workloads_benchmark_profiles_true_with_fleet_at_both_refs(tmp_path):
    out = tmp_path / "true.json"
    r = bench("bench/profile_true.py", "--before", "HEAD", "--after", "HEAD", "--pairs", "1", "--out", str(out))
    doc = json.loads(out.read_text())
    assert [sorted(p) for p in doc["pairs"]] == [["after", "before"]] and doc["before_median_ms"] > 0
    assert "before" in r.stdout and "after" in r.stdout
