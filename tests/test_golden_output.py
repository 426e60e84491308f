"""Golden files for what fleet writes and prints: the files `fleet slurm install` writes and what
it prints; the human output of a lab run (`fleet profile --hosts`, over the test sshd lab servers
with the stand-in nsys) and of a Slurm run (`fleet profile --partition`, on the test Slurm
cluster). What varies between runs is taken out by tests/harness/golden.py's ``normalized``
before the comparison; everything else is compared byte for byte, so a changed word fails.

Regenerate on purpose (then review the diff):

    FLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -p no:cacheprovider -q tests/test_golden_output.py
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
from pathlib import Path

import pytest

from fleet.agent import bundle
from tests.conftest import perf_event_paranoid, run_fleet
from tests.harness.golden import compare, normalized
from tests.harness.lab import scenario

# The install's inputs, fixed: what a site's admin would give.
INSTALL = ("--python", "/usr/bin/python3", "--owned-sysctl", "kernel.perf_event_paranoid=2",
           "--baseline-sysctl", "kernel.perf_event_paranoid=2", "--jobs-dir", "/run/fleet/jobs",
           "--state-dir", "/var/lib/fleet", "--log-file", "/var/log/fleet/slurm.log", "--fail-closed",
           "--qdstrm-importer", "/opt/nvidia/nsight-systems/2025.3.1/host-linux-x64/QdstrmImporter",
           "--finish-timeout", "90")
WRAPPERS = ("slurm-prolog", "slurm-epilog", "slurm-task-prolog")


@pytest.mark.root
@pytest.mark.skipif(os.geteuid() != 0, reason="--apply writes files slurmd runs as root: root's")
def test_the_files_slurm_install_writes_match_their_golden_files(tmp_path):
    prefix = tmp_path / "etc-fleet"
    out = run_fleet("slurm", "install", "--apply", "--no-node-check", "--prefix", str(prefix), *INSTALL)
    assert out.returncode == 0, out.stderr
    paths = {str(prefix): "<prefix>"}
    compare("install/apply-output.txt", normalized(out.stdout + out.stderr, paths))
    written = sorted(p.name for p in prefix.iterdir())
    modes = "".join(f"{name} {stat.S_IMODE((prefix / name).stat().st_mode):o}\n" for name in written)
    compare("install/files.txt", modes)
    for name in (*WRAPPERS, "node.json"):
        compare(f"install/{name}", normalized((prefix / name).read_text(), paths))
    # The agent is the bundle itself, byte for byte (its own tests hold its content).
    assert (prefix / "fleet-agent.py").read_text() == bundle.script()
    assert json.loads((prefix / "node.json").read_text())["finish_timeout"] == 90


def test_what_slurm_install_prints_matches_its_golden_file():
    out = run_fleet("slurm", "install", *INSTALL)
    assert out.returncode == 0, out.stderr
    assert f"fleet's node agent, {len(bundle.script().encode())} bytes" in out.stdout  # the bundle's size
    compare("install/printed.txt", normalized(out.stdout))


def transcript(runs: list[tuple[tuple[str, ...], object]], paths: dict[str, str]) -> str:
    """Each command as a user typed it, its exit status, its standard output and error, normalized."""
    parts = []
    for argv, out in runs:
        parts.append(f"$ fleet {shlex.join(argv)}\n# exit {out.returncode}\n# stdout\n{out.stdout}# stderr\n{out.stderr}")
    return normalized("\n".join(parts), paths)


def in_lab(lab, store: Path, *args: str):
    return tuple(args), run_fleet("profile", "--store", str(store), *args, env=lab["c"].env())


@pytest.mark.usefixtures("clean_gpus")
def test_a_lab_runs_human_output_matches_its_golden_file(lab, tmp_path):
    """The plan of three lab servers (one beside a tenant), then a run on one of them: each host's
    line and details, the reports line, the run line, as a user reads them."""
    scenario(lab, "h03", [{"kind": "compute", "pid": lab["tenant"], "mem": 1_700_000_000}])
    store = tmp_path / "store"
    workload = ("python3", "-c", "print('the workload says hello')")
    runs = [in_lab(lab, store, "--hosts", "h01,h02,h03", "--tool", "ncu", "--dry-run", "--", *workload),
            in_lab(lab, store, "--hosts", "h02,h03", "--tool", "ncu", "--", *workload),
            in_lab(lab, store, "--hosts", "h01", "--", *workload)]
    assert [out.returncode for _, out in runs] == [6, 6, 0], [out.stderr for _, out in runs]
    compare("output/lab-run.txt", transcript(runs, {str(store): "<store>", str(lab["c"].dir): "<lab>"}))


def test_a_slurm_runs_human_output_matches_its_golden_file(hpc, tmp_path):
    """A job of two ranks on two nodes, brought home: the job's states as they were seen, the
    agent's Python, each rank's line and the run's."""
    store = tmp_path / "store"
    # The workload runs for 3 s, so that the polls each second see the job RUNNING.
    argv = ("--partition", "gpu", "--poll", "1", "--nodes", "2", "--ntasks-per-node", "1", "--",
            "python3", "-c", "import time; print('the workload says hello'); time.sleep(3)")
    # The ranks read the machine's kernel.perf_event_paranoid (no namespace holds a copy): held at 3 for the
    # run, as on a Debian node, so that what they give up is the same whichever other tests run beside.
    with perf_event_paranoid("3"):
        out = run_fleet("profile", *argv, env={**hpc.env(), "FLEET_STORE": str(store)}, timeout=240)
    assert out.returncode == 0, out.stderr + out.stdout
    # The job's states are polled each second: which transient ones a poll sees is timing, so those
    # lines are kept once each, in order, and the states no poll is sure to see are left out.
    seen, lines = set(), []
    for line in out.stderr.splitlines(keepends=True):
        state = re.match(r"fleet: job \d+ (\w+)", line)
        if state and (state[1] in ("PENDING", "CONFIGURING", "COMPLETING") or state[1] in seen):
            continue
        if state:
            seen.add(state[1])
        lines.append(line)
    out.stderr = "".join(lines)
    compare("output/slurm-run.txt", transcript([(argv, out)], {str(store): "<store>", str(hpc.dir): "<cluster>",
                                                             str(hpc.slurm.dir): "<slurm>"}))


def test_the_normalization_hides_what_varies_and_keeps_the_words():
    line = ("run 20261201-120000-ab01 partial: reports in /tmp/fleet-sshd-x1/store/lab/2026-12-01/20261201-120000-ab01 "
            "h02-26109.ncu-rep (262 bytes, sha256 2d6fb465060e…, verified) on GPU-h02-0; pid 4242 (bob, 1.7 GB); "
            "job 17 RUNNING; slurm-17.out; 127.4.5.6:2222; took 1.25 s; ==PROF== Connected to process 99 "
            "(/usr/bin/python3.11)")
    assert normalized(line, {"/tmp/fleet-sshd-x1": "<lab>"}) == (
        "run <run-id> partial: reports in <lab>/store/lab/<day>/<run-id> "
        "h02-<pid>.ncu-rep (<size> bytes, sha256 <sha256>…, verified) on GPU-h02-0; pid <pid> (bob, 1.7 GB); "
        "job <job-id> RUNNING; slurm-<job-id>.out; <address>; took <duration>; ==PROF== Connected to process <pid> "
        "(<python>)")
