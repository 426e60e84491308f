"""The benchmarks keep running: a change of the wire or the command line that breaks one fails here,
not months later when somebody measures again (bench/scale.py's simulated hosts once answered in a
format the client had come to refuse, and every host said "no probe answer from the agent")."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO


def test_the_scale_benchmark_gets_every_simulated_hosts_probe(tmp_path):
    out = tmp_path / "scale.json"
    r = subprocess.run([sys.executable, "bench/scale.py", "--hosts", "6", "--runs", "1", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = json.loads(out.read_text())["counts"][0]["runs"]
    assert [(run["rc"], run["ok"], run["errors"]) for run in runs] == [(0, 6, [])]


def test_the_change_points_benchmark_scores_fleet_on_every_kind_of_history(tmp_path):
    out = tmp_path / "changepoints.json"
    r = subprocess.run([sys.executable, "bench/changepoints.py", "--histories", "4", "--out", str(out)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    scenarios = json.loads(out.read_text())["scenarios"]
    assert len(scenarios) == 7 and scenarios["code step +5%"]["fleet"]["placed"] == 4
