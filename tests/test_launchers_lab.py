"""The real launchers on lab servers: `fleet profile --hosts H --launcher mpirun -- mpirun ...` over a
real OpenSSH server (tests/harness/lab.py), with Debian's openmpi-bin mpirun starting the ranks and
nsys (the stand-in, which expands %q{VAR} in -o as nsys documents) in front of each rank. One agent
on the host holds the checks (the plan's neighbours, the last look, the watch) for all of its ranks;
each rank's report is named by the rank Open MPI gave it (OMPI_COMM_WORLD_RANK), gathered home and
verified, and the run's output names each."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from fleet.rundir import RunDir
from fleet.exitcodes import PARTIAL
from fleet.wrapping.launchers import LauncherError, rank_count
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness.lab import fleet, scenario, wait_for
from tests.harness.procs import TENANT_USER

MPIRUN = shutil.which("mpirun")
needs_mpirun = pytest.mark.skipif(MPIRUN is None, reason="needs Open MPI's mpirun (Debian: openmpi-bin)")
pytestmark = pytest.mark.usefixtures("clean_gpus")
# mpirun as the lab's root login (h02) needs --allow-run-as-root; TCP between the ranks, as in a container.
MPI_OPTIONS = ("-np", "4", "--allow-run-as-root", "--oversubscribe", "--timeout", "120", "--mca", "btl", "self,tcp")
# Each rank says who it is in a file of its own (four processes' lines on one pipe interleave),
# and its pid and GPUs in another; rank ARGV[2] exits 3 once the others have had time to finish;
# with ARGV[3] "hold", every rank waits (at most 30 s) for the test's "go" file; with "slow-stop" too,
# and a SIGTERM then takes it 2 s to act on, as a program that saves its state first; with "slow-death"
# too, rank 0 dies of a SIGTERM at once (no handler, as most programs) and the others 2 s later, of it still;
# with "kill-nsys" too, rank ARGV[2] SIGKILLs its own nsys (its parent) at the SIGTERM, which then writes no report.
WORKER = """import os, signal, sys, time
d, r = sys.argv[1], os.environ['OMPI_COMM_WORLD_RANK']
def die_of_it(s, f):
    time.sleep(2)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
def kill_nsys(s, f):
    os.kill(os.getppid(), signal.SIGKILL)
    sys.exit(0)
if sys.argv[3] == 'kill-nsys' and r == sys.argv[2]:
    signal.signal(signal.SIGTERM, kill_nsys)
if sys.argv[3] == 'slow-stop':
    signal.signal(signal.SIGTERM, lambda s, f: (time.sleep(2), sys.exit(0)))
if sys.argv[3] == 'slow-death' and r != '0':
    signal.signal(signal.SIGTERM, die_of_it)
open(os.path.join(d, 'said-' + r + '.txt'), 'w').write('rank %s of %s' % (r, os.environ['OMPI_COMM_WORLD_SIZE']))
open(os.path.join(d, 'pid-' + r + '.txt'), 'w').write('%d %s' % (os.getpid(), os.environ.get('CUDA_VISIBLE_DEVICES')))
deadline = time.time() + 30
while sys.argv[3] in ('hold', 'slow-stop', 'slow-death', 'kill-nsys') and not os.path.exists(os.path.join(d, 'go')) and time.time() < deadline:
    time.sleep(0.05)
if r == sys.argv[2]:
    time.sleep(2)
    sys.exit(3)
"""


def worker_in(lab, name):
    d = lab["c"].scratch(name)
    worker = d / "worker.py"
    worker.write_text(WORKER)
    worker.chmod(0o644)
    return d, worker


def fleet_argv(worker, d, fail_rank="none", hold="run", *extra, json_out=True):
    return ["--hosts", "h02", "--launcher", "mpirun", *extra, *(["--json"] if json_out else []), "--",
            MPIRUN, *MPI_OPTIONS, "python3", str(worker), str(d), fail_rank, hold]


def mpi_run(lab, name, *extra, fail_rank="none", json_out=True):
    d, worker = worker_in(lab, name)
    out = fleet(lab, *fleet_argv(worker, d, fail_rank, "run", *extra, json_out=json_out), timeout=240)
    return out, d, worker


def store_manifest(lab, run_id) -> dict:
    [path] = lab["out"].glob(f"lab/*/{run_id}/manifest.json")
    return json.loads(path.read_text())


@needs_mpirun
def test_four_ranks_of_the_real_mpirun_on_a_lab_server_each_under_nsys_named_by_rank(lab):
    out, d, worker = mpi_run(lab, "mpi-lab", json_out=False)
    assert out.returncode == 0, out.stderr + out.stdout
    assert [(d / f"said-{i}.txt").read_text() for i in range(4)] == [f"rank {i} of 4" for i in range(4)]
    run_id = out.stdout.strip().splitlines()[-1].split()[1]
    m = store_manifest(lab, run_id)
    [h] = m["hosts"]
    assert m["status"] == "complete" and h["status"] == "ok", h
    assert m["request"]["launcher"] == "mpirun"
    argv = h["plan"]["argv"]  # mpirun and its options, then nsys in front of the program: one nsys per rank
    assert argv[:len(MPI_OPTIONS) + 1] == [MPIRUN, *MPI_OPTIONS] and argv[len(MPI_OPTIONS) + 2] == "profile"
    reports = sorted((r for r in h["reports"] if r["status"] == "complete"), key=lambda r: r["stored"])
    assert [Path(r["stored"]).name for r in reports] == [RunDir.label(i) + RunDir.NSYS_REPORT for i in range(4)]
    for r in reports:
        assert r["verified"] and Path(r["stored"]).parent.name == "h02"
        # nsys wrapped the rank itself (python3 on the worker), never mpirun
        assert json.loads(Path(r["stored"]).read_text())["app"] == ["python3", str(worker), str(d), "none", "run"]
        assert f"report:   {r['stored']} (" in out.stdout  # the run's output names each rank's report
    assert "reports: 4 complete" in out.stdout.splitlines()  # each rank's report counted, not the host once
    # the agent's checks held for the ranks: the run's GPUs watched through it, the ranks its own
    conditions = h["result"]["conditions"]
    assert conditions["samples"] and h["result"]["whose"]["host"] == "h02"
    assert h["result"]["whose"]["launcher"] == "mpirun"


def test_a_launcher_that_sets_no_rank_variable_is_never_ok_as_its_ranks_overwrite_one_report(lab):
    """MPICH's mpirun sets no OMPI_COMM_WORLD_RANK: nsys then names every rank's report alike, each
    written over the last. An mpirun of that kind (named mpirun, -np copies of the program, no rank
    variable given) leaves one report for two ranks: the host is a profiler-error, never ok."""
    d = lab["c"].scratch("mpi-lab-unnamed")
    mpich = d / "mpirun"
    mpich.write_text('#!/bin/sh\n[ "$1" = -np ] || exit 64\nn=$2; shift 2\ni=0\n'
                     'while [ $i -lt "$n" ]; do "$@" & i=$((i+1)); done\nwait\n')
    mpich.chmod(0o755)
    out = fleet(lab, "--hosts", "h02", "--launcher", "mpirun", "--json", "--", str(mpich), "-np", "2",
                "python3", "-c", "pass", timeout=240)
    [h] = fleet_json(out.stdout)["hosts"]
    assert out.returncode != 0 and h["status"] == "profiler-error", (out.stderr, h)
    assert "did not set in its ranks" in " ".join(h["result"]["reasons"]), h["result"]["reasons"]


@pytest.mark.parametrize("command,said", [
    (("python3", "train.py"), "starts with mpirun itself"),
    (("torchrun", "--nproc-per-node", "2", "train.py"), "starts with mpirun itself"),
    (("mpirun", "-np", "2", "--host", "a,b", "./app"), "--host would start ranks on hosts"),
    (("mpirun", "-np", "2", "--hostfile=hosts.txt", "./app"), "--hostfile=hosts.txt would start ranks"),
    # MCA parameters that name hosts or host files reach other hosts as --host does
    (("mpirun", "-np", "2", "--mca", "orte_default_hostfile", "hosts.txt", "./app"),
     "--mca orte_default_hostfile would start ranks"),
    (("mpirun", "-np", "2", "-mca", "orte_default_hostfile", "hosts.txt", "./app"),
     "-mca orte_default_hostfile would start ranks"),
    (("mpirun", "-np", "2", "--mca", "prte_default_hostfile", "hosts.txt", "./app"),
     "--mca prte_default_hostfile would start ranks"),
    (("mpirun", "-np", "2", "--gmca", "rmaps_rank_file_path", "ranks.txt", "./app"),
     "--gmca rmaps_rank_file_path would start ranks"),
    (("mpirun", "-np", "2", "--mca", "orte_default_dash_host", "a,b", "./app"),
     "--mca orte_default_dash_host would start ranks"),
    # files of options or MCA parameters, read by mpirun on the node, may name hosts too
    (("mpirun", "-np", "2", "--tune", "params.conf", "./app"), "--tune, a file of options that may name hosts,"),
    (("mpirun", "-np", "2", "-am", "params.conf", "./app"), "-am, a file of options that may name hosts, would"),
    (("mpirun", "-np", "2", "--app", "appfile", "./app"), "--app, a file of options that may name hosts, would"),
    (("mpirun", "-np", "2", "--mca", "mca_base_param_files", "p.conf", "./app"),
     "--mca mca_base_param_files would start ranks"),
])
def test_an_mpirun_command_fleet_cannot_keep_to_the_host_is_refused_before_any_host(tmp_path, command, said):
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "nosuchhost.invalid",
                    "--launcher", "mpirun", "--", *command)
    assert out.returncode == 2 and said in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "store").exists()


def test_torchrun_with_a_double_dash_before_its_script_keeps_its_options_and_no_python_before_the_profiler():
    from fleet.wrapping.launchers import lab_launch
    starts, program = lab_launch("torchrun", ["torchrun", "--nproc-per-node", "2", "--", "train.py", "--lr", "1"])
    assert starts[-4:] == ("torchrun", "--nproc-per-node", "2", "--no-python") and "--" not in starts[5:]
    assert program == ("PYTHON", "train.py", "--lr", "1")


@needs_mpirun
def test_the_watch_tells_every_rank_as_the_run_s_own_and_notes_a_newcomer_beside_them(lab):
    """The host's one agent watches the GPU through the run: the four ranks (mpirun's children's
    children) are the workload's own, another user's process that arrives is a newcomer."""
    d, worker = worker_in(lab, "mpi-lab-watch")
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(lab["out"]), "--gpu", "0",
                             *fleet_argv(worker, d, "none", "hold")], env={**os.environ, **lab["c"].env()},
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: all((d / f"pid-{i}.txt").exists() and (d / f"pid-{i}.txt").read_text() for i in range(4)),
                 timeout=60)
        ranks = {int((d / f"pid-{i}.txt").read_text().split()[0]): i for i in range(4)}
        assert {(d / f"pid-{i}.txt").read_text().split()[1] for i in range(4)} == {"GPU-h02-0"}  # --gpu reached each
        on_gpu = [{"kind": "compute", "pid": pid, "mem": 200 << 20} for pid in ranks]
        scenario(lab, "h02", on_gpu)
        time.sleep(1.5)  # the watch has seen the ranks alone on the GPU
        scenario(lab, "h02", [*on_gpu, {"kind": "compute", "pid": lab["tenant"], "mem": 1 << 30}])
        time.sleep(1.5)
        (d / "go").write_text("")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    [h] = fleet_json(out)["hosts"]
    seen = {p["pid"]: p for s in h["result"]["conditions"]["samples"] for p in s["processes"]}
    assert all(seen[pid]["own"] is True for pid in ranks), seen
    assert seen[lab["tenant"]]["own"] is False
    [note] = [n for n in h["result"]["notes"] if "newcomer" in n]
    assert f"pid {lab['tenant']} ({TENANT_USER}" in note


@needs_mpirun
def test_fleet_gather_brings_every_rank_s_report_home_after_fleet_was_killed(lab, tmp_path):
    """fleet dies mid-run; the host's agent finishes the ranks and leaves its result beside their
    reports, in the host's folder, where `fleet gather` reads it and brings all four home."""
    store_root = tmp_path / "store"
    d, worker = worker_in(lab, "mpi-lab-gather")
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(store_root),
                             *fleet_argv(worker, d, "none", "hold", json_out=False)],
                            env={**os.environ, **lab["c"].env()}, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: all((d / f"pid-{i}.txt").exists() for i in range(4)), timeout=60)
    finally:
        proc.kill()  # fleet dies before any report comes home
        proc.wait()
    [manifest_path] = store_root.glob("lab/*/*/manifest.json")
    manifest = json.loads(manifest_path.read_text())
    assert manifest["status"] == "running" and not manifest["hosts"][0]["reports"]
    (d / "go").write_text("")
    output = manifest["hosts"][0]["plan"]["output"]
    result_file = Path(RunDir(os.path.dirname(output)).result("h02"))
    wait_for(lambda: result_file.exists(), timeout=60)  # the node's agent finished on its own
    out = run_fleet("gather", manifest["run_id"], "--store", str(store_root), env=lab["c"].env())
    assert out.returncode == 0, out.stdout + out.stderr
    manifest = json.loads(manifest_path.read_text())
    [h] = manifest["hosts"]
    names = sorted(Path(r["stored"]).name for r in h["reports"] if r["status"] == "complete" and r["verified"])
    assert manifest["status"] == "complete" and names == [RunDir.label(i) + RunDir.NSYS_REPORT for i in range(4)]


@needs_mpirun
def test_ranks_stopped_at_the_timeout_keep_their_reports_though_they_take_time_to_stop(lab):
    """fleet's signal at --timeout goes to each rank's nsys itself, not to mpirun: Open MPI would pass
    it on and SIGKILL the ranks a second later, before a rank slow to stop has let nsys write its report."""
    d, worker = worker_in(lab, "mpi-lab-stop")
    # -X --delay: nsys's --duration would not count from the start, so the agent signals at the timeout
    out = fleet(lab, *fleet_argv(worker, d, "none", "slow-stop", "--timeout", "3", "-X", "--delay=0"), timeout=240)
    [h] = fleet_json(out.stdout)["hosts"]
    names = sorted(Path(r["stored"]).name for r in h["reports"] if r["status"] == "complete" and r["verified"])
    assert names == [RunDir.label(i) + RunDir.NSYS_REPORT for i in range(4)], (out.stderr, h)
    assert any("stopped at its time limit" in n for n in h["result"]["notes"]), h["result"]["notes"]


@needs_mpirun
@pytest.mark.parametrize("stopped_by", [("-X", "--delay=0"), ()], ids=["agent-signal", "nsys-duration"])
def test_ranks_that_die_of_the_stop_keep_their_reports_though_one_dies_first(lab, stopped_by):
    """Each rank's nsys exits 143 as its rank dies of the SIGTERM (nsys passes the application's
    status on); Open MPI takes a rank's non-zero exit for a failed job and SIGKILLs the others about a
    second later. Rank 0 dies at once, the others take 2 s: stopped by fleet (at --timeout, by the
    agent's signal, or by nsys's own --duration), no rank's exit may cut the others' reports short."""
    d, worker = worker_in(lab, "mpi-lab-die-" + (stopped_by and "signal" or "duration"))
    out = fleet(lab, *fleet_argv(worker, d, "none", "slow-death", "--timeout", "3", *stopped_by), timeout=240)
    [h] = fleet_json(out.stdout)["hosts"]
    names = sorted(Path(r["stored"]).name for r in h["reports"] if r["status"] == "complete" and r["verified"])
    assert names == [RunDir.label(i) + RunDir.NSYS_REPORT for i in range(4)], (out.stderr, h)
    assert any("stopped at its time limit" in n for n in h["result"]["notes"]), h["result"]["notes"]
    assert h["status"] == "ok" and out.returncode == 0, (h["status"], out.returncode)


@needs_mpirun
def test_a_rank_that_left_no_report_is_missing_by_its_rank_and_the_run_partial(lab):
    """mpirun's -np 4 says four ranks. Rank 2's program SIGKILLs its own nsys as the run is stopped at
    --timeout, so it writes no report, while the launcher still exits 0 (each rank's exit is 0 once
    fleet stops the run): the three reports come home, and rank 2 is `missing`, the run partial."""
    d, worker = worker_in(lab, "mpi-lab-kill-nsys")
    out = fleet(lab, *fleet_argv(worker, d, "2", "kill-nsys", "--timeout", "3", "-X", "--delay=0", json_out=False),
                timeout=240)
    assert out.returncode == PARTIAL, out.stderr + out.stdout
    assert "h02 rank 2: missing: rank 2 left no report" in out.stderr, out.stderr
    assert "reports: 3 complete, 1 missing" in out.stdout.splitlines(), out.stdout
    m = store_manifest(lab, out.stdout.strip().splitlines()[-1].split()[1])
    h, gone = m["hosts"]
    assert m["status"] == "partial" and h["status"] == "ok" and h["plan"]["ranks"] == 4, h
    names = sorted(Path(r["stored"]).name for r in h["reports"] if r["status"] == "complete" and r["verified"])
    assert names == [RunDir.label(i) + RunDir.NSYS_REPORT for i in (0, 1, 3)]
    assert (gone["host"], gone["rank"], gone["status"], gone["missing_why"]) == (
        "h02", 2, "missing", "rank 2 left no report"), gone
    assert h["result"]["missing_ranks"] == [2]


def test_a_report_of_a_rank_past_the_count_is_a_profiler_error_and_names_no_rank_missing(tmp_path):
    """The plan says two ranks; a report of rank 3 means the launcher started others than fleet
    counted: which ranks left no report cannot be told, and the run is never ok."""
    from fleet.agent import run
    from fleet.plan import Command, Plan

    output = RunDir(str(tmp_path)).node("h02").file(RunDir.rank_report("mpirun"))
    plan = Plan("h02", "ok", command=Command(launcher=("mpirun", "-np", "2")), output=output, ranks=2)
    reports = [{"path": RunDir.output_as(output, str(k)) + RunDir.NSYS_REPORT} for k in (0, 3)]
    result = {"reports": reports}
    assert "a report of rank 3" in run.rank_reports(plan, result) and "missing_ranks" not in result
    result = {"reports": reports[:1]}
    assert run.rank_reports(plan, result) is None and result["missing_ranks"] == [1]
    assert run.rank_reports(replace(plan, ranks=None), result) is None  # not counted: nothing said
    assert "not a whole number" in run.ranks_problem(replace(plan, ranks="2"))
    assert "from 1 to 4096" in run.ranks_problem(replace(plan, ranks=4097))


def test_a_missing_rank_is_listed_once_however_often_the_run_s_entries_are_made_again():
    """`fleet gather` makes the entries again from the results it read: a rank stays one entry."""
    from fleet.lab.ranks import with_missing_ranks
    from fleet.store.manifest import HostEntry

    hosts = [HostEntry("h02", "ok", plan={"ranks": 4}, result={"status": "ok", "missing_ranks": [1, 3]}),
             HostEntry("h03", "refused")]
    once = with_missing_ranks(hosts)
    assert [(h.host, h.rank, h.status) for h in once] == [("h02", None, "ok"), ("h02", 1, "missing"),
                                                          ("h02", 3, "missing"), ("h03", None, "refused")]
    assert with_missing_ranks(once) == once and once[1].missing_why == "rank 1 left no report"


@needs_mpirun
def test_a_rank_that_fails_fails_the_run_and_the_other_ranks_reports_are_kept(lab):
    out, d, _ = mpi_run(lab, "mpi-lab-fail", fail_rank="1")
    assert out.returncode == 9, out.stderr  # WORKLOAD_FAILED
    [h] = fleet_json(out.stdout)["hosts"]
    assert h["status"] == "workload-failed" and "exited" in h["error"], h
    names = sorted(Path(r["stored"]).name for r in h["reports"] if r["status"] == "complete" and r["verified"])
    assert names == [RunDir.label(i) + RunDir.NSYS_REPORT for i in range(4)]


@pytest.mark.parametrize("args,said", [
    (("--", "mpirun", "-np", "4", "--allow-run-as-root"), "no program found after the mpirun options"),
    (("--", "mpirun", "-np"), "no program found after the mpirun options"),
    (("--tool", "ncu", "--", "mpirun", "-np", "2", "prog"), "one profiler per rank"),
    (("--gpu-metrics", "--", "mpirun", "-np", "2", "prog"), "one profiler per rank"),
    (("--docker", "img", "--", "mpirun", "-np", "2", "prog"), "--docker do not go together"),
])
def test_a_launch_fleet_cannot_wrap_is_refused_in_one_line_before_any_host_is_contacted(args, said, tmp_path):
    # No inventory, no host that exists: anything contacted would fail otherwise, and differently.
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "nosuchhost.invalid",
                    "--launcher", "mpirun", *args)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and said in out.stderr, out.stderr
    assert out.stderr.startswith("fleet: ") and not (tmp_path / "store").exists()


@pytest.mark.parametrize("launcher", ["srun", "ray"])
def test_a_launcher_of_slurm_s_on_a_lab_server_is_refused(launcher, tmp_path):
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "nosuchhost.invalid",
                    "--launcher", launcher, "--", "prog")
    assert out.returncode == 2 and "on lab servers one of mpirun, torchrun" in out.stderr, out.stderr


TORCH_WORKER = """import os, sys
open(os.path.join(sys.argv[1], 'rank-' + os.environ['RANK'] + '.txt'), 'w').write(
    '%s %s %s' % (os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'], sys.executable))
"""


def test_torchrun_on_a_lab_server_runs_each_worker_under_nsys_named_by_rank(lab):
    """torchrun (the stand-in, with the real one's options and workers' environment) with
    --no-python in front of nsys, which runs the Python torchrun would have run: python3 here,
    from the stand-in's #! line, found on the node by the batch script's own rule."""
    d = lab["c"].scratch("torchrun-lab")
    worker = d / "train.py"
    worker.write_text(TORCH_WORKER)
    worker.chmod(0o644)
    out = fleet(lab, "--hosts", "h02", "--launcher", "torchrun", "--json", "--",
                "torchrun", "--standalone", "--nproc-per-node", "2", str(worker), str(d), timeout=240)
    assert out.returncode == 0, out.stderr
    [h] = fleet_json(out.stdout)["hosts"]
    assert h["status"] == "ok", h
    said = sorted((d / f"rank-{i}.txt").read_text().split()[:2] for i in range(2))
    assert said == [["0", "2"], ["1", "2"]]
    reports = sorted((r for r in h["reports"] if r["status"] == "complete"), key=lambda r: r["stored"])
    assert [Path(r["stored"]).name for r in reports] == [RunDir.label(i) + RunDir.NSYS_REPORT for i in range(2)]
    for r in reports:
        assert r["verified"]
        assert json.loads(Path(r["stored"]).read_text())["app"] == ["python3", str(worker), str(d)]
    argv = h["plan"]["argv"]
    assert argv[argv.index("--no-python") - 4:argv.index("--no-python")] == ["torchrun", "--standalone",
                                                                              "--nproc-per-node", "2"]


def test_torchrun_without_a_script_or_with_run_path_is_refused_before_any_host(tmp_path):
    for args, said in ((("torchrun", "--nproc-per-node", "2"), "no program found after the torchrun options"),
                       (("torchrun", "--run-path", "x.py"), "leave --run-path out")):
        out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "nosuchhost.invalid",
                        "--launcher", "torchrun", "--", *args)
        assert out.returncode == 2 and said in out.stderr and out.stderr.count("\n") == 1, out.stderr


@pytest.mark.parametrize("interpreter, python_exec, want", [
    ("venv/bin/python", None, "{tmp}/venv/bin/python"),      # torchrun's #! line names its python
    ("env python3.99", None, "python3.99"),                  # #!/usr/bin/env pythonX: that name, from PATH
    ("venv/bin/python", "/opt/other/bin/python", "/opt/other/bin/python"),  # PYTHON_EXEC wins, as in torchrun
])
def test_the_lab_torchrun_line_puts_the_python_torchrun_would_run_before_the_script(tmp_path, interpreter,
                                                                                    python_exec, want):
    """The words fleet plans for a lab server's torchrun, run by bash as the node's agent runs them:
    bash finds the worker's Python by the batch script's own rule, then execs torchrun."""
    from fleet.wrapping.launchers import PYTHON_WORD, lab_launch

    (tmp_path / "venv" / "bin").mkdir(parents=True)
    said = tmp_path / "argv"
    recorder = f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {said}\n"  # what torchrun would have been started with
    for name in ("venv/bin/python", "python3.99"):
        (tmp_path / name).write_text(recorder)
        (tmp_path / name).chmod(0o755)
    shebang = f"#!{tmp_path}/{interpreter}" if "/" in interpreter else f"#!/usr/bin/env {interpreter.split()[1]}"
    (tmp_path / "torchrun").write_text(shebang + "\n")
    (tmp_path / "torchrun").chmod(0o755)
    starts, program = lab_launch("torchrun", ["torchrun", "--nproc-per-node", "2", "-m", "pkg.train", "--lr", "1"])
    assert program == (PYTHON_WORD, "-m", "pkg.train", "--lr", "1")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    env.update(PATH=f"{tmp_path}:{os.environ['PATH']}", **({"PYTHON_EXEC": python_exec} if python_exec else {}))
    subprocess.run([*starts, "NSYS", "profile", "--", *program], env=env, check=True, timeout=30)
    assert said.read_text().splitlines() == [
        str(tmp_path / "torchrun"), "--nproc-per-node", "2", "--no-python", "NSYS", "profile", "--",
        want.format(tmp=tmp_path), "-m", "pkg.train", "--lr", "1"]


NP_SPELLINGS = json.loads((REPO / "tests" / "fixtures" / "openmpi-4.1" / "np-spellings.json").read_text())


@pytest.mark.parametrize("case", NP_SPELLINGS["cases"], ids=lambda c: " ".join(c["options"]))
def test_the_rank_count_read_from_mpirun_s_options_is_the_real_mpirun_s_or_none(case):
    """Held to what Open MPI 4.1's mpirun started for each spelling (np-spellings.json): the count
    fleet reads is the number of ranks that mpirun ran, or not known, never another; a value it
    refused fleet refuses too, or does not count by."""
    command = ["mpirun", *case["options"], "sh", "-c", "true"]
    try:
        count, said = rank_count("mpirun", command)
    except LauncherError as e:
        assert case["exit_status"] != 0 and "whole number from 1 to 4096" in str(e), (case, e)
        return
    if case["exit_status"] != 0:
        assert count is None, (case, said)
    else:
        assert count in (None, len(case["ranks"])), (case, count, said)
    # The man page's ".B -c, -n, --n, -np <#>: Run this many copies", and --help's --np, each given once with a
    # count (0 is one rank per slot, which the command line does not say): counted.
    if len(case["options"]) == 2 and case["options"][0] in ("-c", "-n", "--n", "-np", "--np") and \
            case["options"][1] != "0" and case["ranks"]:
        assert count == len(case["ranks"]), (case, said)


@pytest.mark.parametrize("command,count,said", [
    (("mpirun", "-np", "4", "--allow-run-as-root", "python3", "app.py"), 4, "mpirun's -np 4"),
    (("mpirun", "--mca", "btl", "self,tcp", "-n", "3", "./app", "-np", "9"), 3, "mpirun's -n 3"),  # the program's own
    (("mpirun", "./app"), None, "gives no -np"),
    (("mpirun", "--app", "ctx.txt", "./app"), None, "--app"),
    (("torchrun", "--nproc-per-node", "4", "train.py"), 4, "torchrun's --nproc-per-node 4"),
    (("torchrun", "--standalone", "--nnodes=1", "--nproc_per_node=2", "train.py"), 2, "--nproc_per_node 2"),
    (("python3", "-m", "torch.distributed.run", "--nnodes", "1:1", "--nproc-per-node", "8", "t.py"), 8, "8"),
    (("torchrun", "--nproc-per-node", "gpu", "train.py"), None, "--nproc-per-node gpu"),
    (("torchrun", "--nproc-per-node", "auto", "train.py"), None, "--nproc-per-node auto"),
    (("torchrun", "train.py"), None, "gives no --nproc-per-node"),
    (("torchrun", "--nnodes", "2", "--nproc-per-node", "4", "train.py"), None, "--nnodes 2"),
    (("torchrun", "--nnodes", "1:2", "--nproc-per-node", "4", "train.py"), None, "--nnodes 1:2"),
    (("torchrun", "--nproc", "4", "train.py"), None, "--nproc may stand for"),
    (("mpirun", "--oversubscribe", "-np", "5000", "./app"), None, "more than the 4096 ranks fleet counts"),
])
def test_the_rank_count_is_read_where_the_launcher_s_command_line_states_it(command, count, said):
    got, why = rank_count("torchrun" if "torch" in " ".join(command[:3]) else "mpirun", list(command))
    assert got == count and said in why, (got, why)


@pytest.mark.parametrize("command", [("mpirun", "-np", "four", "./app"), ("torchrun", "--nproc-per-node", "0", "train.py")])
def test_a_rank_count_that_is_no_whole_number_up_to_4096_is_refused_before_any_host(tmp_path, command):
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "nosuchhost.invalid",
                    "--launcher", command[0], "--", *command)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "it must be a whole number from 1 to 4096" in out.stderr and not (tmp_path / "store").exists()


def test_torchrun_counting_its_workers_by_gpu_says_the_rank_count_is_not_known(lab):
    """--nproc-per-node gpu: torchrun counts the GPUs on the node, so fleet does not count the
    ranks, the plan carries none, and the run's lines say so."""
    d = lab["c"].scratch("torchrun-gpu")
    out = fleet(lab, "--hosts", "h02", "--launcher", "torchrun", "--dry-run", "--",
                "torchrun", "--nproc-per-node", "gpu", str(d / "train.py"), timeout=240)
    assert out.returncode == 0, out.stderr
    assert ("ranks:   not counted (torchrun's --nproc-per-node gpu: torchrun counts them on the node): a rank "
            "that left no report is not named") in out.stdout.splitlines(), out.stdout


@pytest.mark.parametrize("args", [("--capture-range=cudaProfilerApi",), ("-c", "nvtx"), ("--capture-range", "nvtx")])
def test_under_nsys_s_capture_range_the_ranks_are_not_counted_since_one_may_rightly_leave_no_report(args):
    """A rank that never opens the capture range leaves no report by design: never called missing."""
    count, why = rank_count("mpirun", ["mpirun", "-np", "4", "./app"], args)
    assert count is None and "--capture-range" in why


def test_the_controller_names_only_missing_ranks_the_plan_counted_and_whose_reports_did_not_come_home():
    """The node's missing_ranks is data: a rank past the plan's count, one named twice, a bool, and one
    whose report came home verified are none of them a missing entry; a plan that counted nothing names none."""
    from fleet.lab.ranks import missing_ranks, with_missing_ranks
    from fleet.store.manifest import HostEntry, ReportEntry
    home = ReportEntry(remote="RUN/h1/rank1.nsys-rep", stored="/s/h1/rank1.nsys-rep", verified=True)
    said = {"status": "ok", "missing_ranks": [2 ** 61, 2 ** 61, 0, 0, 1, True, -1, 3]}
    entry = HostEntry("h1", "ok", plan={"ranks": 4}, result=said, reports=[home])
    assert missing_ranks(entry) == [0, 3]
    assert [(e.host, e.rank, e.status) for e in with_missing_ranks([entry])] == \
        [("h1", None, "ok"), ("h1", 0, "missing"), ("h1", 3, "missing")]
    assert missing_ranks(HostEntry("h1", "ok", plan={"ranks": None}, result=said)) == []
