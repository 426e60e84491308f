"""Ray as its users run it (the `ray` package from PyPI), with no change to their program: a program
that calls ray.init() and starts two named actors, run by the lines `fleet profile --launcher
ray` puts in its job script. fleet's runtime_env hook gives Ray's own nsys integration its `_nsight` block
(Ray 2.60 calls RAY_RUNTIME_ENV_HOOK from ray.init), and each worker says whose it is, which
gather reads to name the report. Before,
the program had to pass FLEET_RAY_RUNTIME_ENV to ray.init itself, and the reports were
worker-HOST-PID: nobody could tell which actor was which (ray#50711)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from fleet.agent.bundle import script as agent_script
from fleet.slurm.launchers import RAY_HOOK, launch
from fleet.slurm.raygather import ray_worker_name
from fleet.store.manifest import ReportEntry
from tests.conftest import fleet_json, run_fleet
from tests.harness.rayhead import RayHead

ray = pytest.importorskip("ray")
STANDINS = Path(__file__).parent / "standins"

PROGRAM = """
import os, time, ray

ray.init(num_cpus=2, include_dashboard=False)


@ray.remote
class Trainer:
    def pid(self):
        time.sleep(0.5)  # some work
        return os.getpid()


a = Trainer.options(name="trainer-a").remote()
b = Trainer.options(name="trainer-b").remote()
print("actor pids", ray.get([a.pid.remote(), b.pid.remote()]), flush=True)
"""
# The program leaves its actors alive, as Ray programs do: fleet's hook ends each at the program's end,
# before Ray's shutdown would kill its worker, and nsys with it. A program may end them itself, as Ray
# documents a graceful end; that one works as it did.
ENDS_ITS_ACTORS = PROGRAM + """
for actor in (a, b):
    try:
        ray.get(actor.__ray_terminate__.remote())
    except ray.exceptions.RayActorError:  # it ended, as asked
        pass
"""


# The same two actors as a job submitted to a running cluster: ray.init() connects to it (a job's
# driver may not size the cluster), and each actor says whether nsys is its parent, and its name.
JOB = """
import json, os, sys, time, ray

ray.init()


@ray.remote
class Trainer:
    def who(self):
        time.sleep(0.5)  # some work
        parent = open("/proc/%d/cmdline" % os.getppid()).read().split(chr(0))
        return os.getpid(), any(os.path.basename(w) == "nsys" for w in parent[:2])


actors = {name: Trainer.options(name=name).remote() for name in sys.argv[1:]}
print("actors", json.dumps({name: ray.get(a.who.remote()) for name, a in actors.items()}), flush=True)
"""


def test_the_job_script_installs_the_hook_with_the_nsight_block():
    la = launch("ray", ["python3", "train.py"], ["python3", "agent"], "/runs/r1", None)
    text = "\n".join(la.setup)
    assert "export RAY_RUNTIME_ENV_HOOK=fleet_ray_hook.runtime_env_hook" in text
    assert "def runtime_env_hook(runtime_env):" in text and la.line == '"${COMMAND[@]}"'
    block = json.loads(text.split("FLEET_RAY_RUNTIME_ENV='", 1)[1].split("'", 1)[0])
    assert block["_nsight"]["o"] == "/runs/r1/ray/worker-%h-%p"


def job_lines(tmp_path, request, program: str, *args: str, actors=()):
    """The batch script's own Ray lines, run by bash as a job's shell runs them, then the program:
    real Ray (a local instance, no dashboard) starts its workers under the nsys stand-in. The
    run's Ray folder and what bash printed."""
    ray_tmp = tempfile.mkdtemp(prefix="fr", dir="/tmp")  # Ray's sessions, this test's own; short: its sockets' paths
    request.addfinalizer(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    path = tmp_path / "program.py"
    path.write_text(program)
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    (run_dir / "fleet-agent.py").write_text(agent_script())  # as fleet writes it beside every job's script
    command = [sys.executable, str(path), *args]
    la = launch("ray", command, ["unused"], str(run_dir), None, actors=actors)
    script = "\n".join([f"RUN_DIR={shlex.quote(str(run_dir))}", f"FLEET_PYTHON={shlex.quote(sys.executable)}",
                        f"COMMAND=({shlex.join(command)})", *la.setup, la.line, *la.after])
    # Ray's nsight plugin runs `nsys profile ... python`, PATH's python: here /usr/bin's, without Ray, as in a
    # batch job. fleet's hook puts the program's own Python first on the workers' PATH, else they never start.
    env = {**os.environ, "PATH": f"{STANDINS}:/usr/local/bin:/usr/bin:/bin",
           "RAY_AUTH_MODE": "disabled", "RAY_TMPDIR": ray_tmp}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir / "ray", done


def reports_of(ray_dir: Path, pids) -> list[Path]:
    """The report of each worker, once nsys has written it (as its worker exits)."""
    reports = [ray_dir / f"worker-{socket.gethostname()}-{pid}.nsys-rep" for pid in pids]
    for _ in range(100):
        if all(r.exists() for r in reports):
            break
        time.sleep(0.1)
    return reports


def test_two_named_actors_of_an_unchanged_ray_program_give_two_reports_named_by_actor(tmp_path, request):
    ray_dir, done = job_lines(tmp_path, request, PROGRAM)
    pids = json.loads(done.stdout.split("actor pids ", 1)[1].split("\n", 1)[0])
    names = []
    for pid, report in zip(pids, reports_of(ray_dir, pids)):
        # nsys wrapped Ray's worker process itself, started by Ray's raylet, not the program
        assert "default_worker.py" in " ".join(json.loads(report.read_text())["app"])
        whose = report.with_name(report.name.replace(".nsys-rep", ".whose.json"))
        entries = [ReportEntry(remote=str(report), stored=str(report), verified=True, status="complete"),
                   ReportEntry(remote=str(whose), stored=str(whose), size=whose.stat().st_size, verified=True)]
        names.append(ray_worker_name(entries))
    assert names == [f"Trainer trainer-a on {socket.gethostname()}, pid {pids[0]}",
                     f"Trainer trainer-b on {socket.gethostname()}, pid {pids[1]}"]


# Beside the two actors it leaves alive: one detached (it outlives the job by design), one whose handle the
# program drops (Ray ends it then: fleet's hook must not keep it alive), one the program kills; and the
# program ends calling ray.shutdown() itself.
OTHERS = PROGRAM + """
from ray._private import state

keeper = Trainer.options(name="keeper", lifetime="detached").remote()
dropped = Trainer.options(name="dropped").remote()
killed = Trainer.options(name="killed").remote()
print("other pids", ray.get([x.pid.remote() for x in (keeper, dropped, killed)]), flush=True)
killed_id, dropped_id = killed._actor_id.hex(), dropped._actor_id.hex()
ray.kill(killed)  # asynchronous: waited for, as the dropped one is, so that neither counts at the end
del dropped
for _ in range(200):
    if all(state.actors(actor_id=a)["State"] == "DEAD" for a in (dropped_id, killed_id)):
        print("the dropped actor ended while the program ran", flush=True)
        break
    time.sleep(0.1)
ray.shutdown()  # the program's own, at its end: the actors' workers killed, nsys with them, but for fleet's hook
"""


def test_only_the_actors_alive_and_not_detached_are_ended_at_the_programs_end(tmp_path, request):
    ray_dir, done = job_lines(tmp_path, request, OTHERS)
    pids = json.loads(done.stdout.split("actor pids ", 1)[1].split("\n", 1)[0])
    keeper, _, _ = json.loads(done.stdout.split("other pids ", 1)[1].split("\n", 1)[0])
    assert "the dropped actor ended while the program ran" in done.stdout  # no reference of fleet's kept it
    assert "ending the Ray program's 2 actors still alive under nsys before Ray's shutdown" in done.stderr, done.stderr
    for report in reports_of(ray_dir, pids):  # the two it left alive: their whole reports
        assert "exit_status" in json.loads(report.read_text()), report
    # the detached one ran under nsys, and was left to Ray (2 ended, not 3): what its nsys left is Ray's doing
    assert (ray_dir / f"worker-{socket.gethostname()}-{keeper}.whose.json").exists()


# An actor still busy with a task at the program's end ends after it: the wait for it is bounded (here the
# program asks fleet's hook, as its end does, with a bound of 2 s: trainer-a still runs then), and at the
# program's end trainer-a ends, its task done, and its report is written.
BUSY = PROGRAM.replace("class Trainer:", """class Trainer:
    def busy(self, seconds):
        time.sleep(seconds)
""", 1) + """
import sys
a.busy.remote(8)
started = time.monotonic()
still = sys.modules["fleet_ray_hook"].end_actors(bound=2)
print("still alive", json.dumps(still), a._actor_id.hex(), round(time.monotonic() - started), flush=True)
""".replace("import sys", "import json, sys")


def test_an_actor_busy_past_the_bound_is_waited_for_no_longer_and_ends_after_its_task(tmp_path, request):
    ray_dir, done = job_lines(tmp_path, request, BUSY)
    pids = json.loads(done.stdout.split("actor pids ", 1)[1].split("\n", 1)[0])
    still, busy, took = done.stdout.split("still alive ", 1)[1].split("\n", 1)[0].split(" ")
    assert busy in json.loads(still) and 2 <= int(took) < 6, done.stdout
    assert "after 2 s 1 Ray actors still ran" in done.stderr or "after 2 s 2 Ray actors still ran" in done.stderr
    for report in reports_of(ray_dir, pids):
        assert "exit_status" in json.loads(report.read_text()), report


def test_ranks_in_a_job_script_profile_only_the_actors_whose_names_match(tmp_path, request):
    ray_dir, done = job_lines(tmp_path, request, JOB.replace("ray.init()", "ray.init(num_cpus=3, include_dashboard=False)"),
                              "trainer-a", "evaluator", "trainer-b", actors=("trainer-*",))
    said = json.loads(done.stdout.split("actors ", 1)[1].split("\n", 1)[0])
    assert {name: under for name, (_, under) in said.items()} == {"trainer-a": True, "evaluator": False, "trainer-b": True}
    reports = reports_of(ray_dir, [said["trainer-a"][0], said["trainer-b"][0]])
    assert all(r.exists() and r.with_name(r.name.replace(".nsys-rep", ".whose.json")).exists() for r in reports)
    beside = (".whose.json", ".sqlite", "_cuda_gpu_kern_sum.csv", "_cuda_api_sum.csv", "_nvtx_sum.csv")
    assert sorted(p.name for p in ray_dir.glob("worker-*")) == sorted(  # the evaluator's worker left nothing
        n for r in reports for n in (r.name, *(r.name.replace(".nsys-rep", b) for b in beside)))


def run_end(monkeypatch):
    """The agent's end of a Ray run (fleet/agent/rayend.py), in a job's environment without a bound of its own."""
    from fleet.agent import rayend

    monkeypatch.delenv(rayend.WAIT_ENV, raising=False)
    monkeypatch.delenv("FLEET_JOB_END", raising=False)
    return rayend


def nsys_profiling(ray_dir: Path, seconds: int) -> subprocess.Popen:
    """The nsys stand-in profiling a workload of ``seconds``, as Ray starts it (``-o`` the run's)."""
    return subprocess.Popen([str(STANDINS / "nsys"), "profile", "-o", str(ray_dir / "worker-%h-%p"), "-t", "osrt",
                             sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_the_wait_ends_as_soon_as_this_runs_nsys_have_ended_and_marks_none_unfinished(tmp_path, monkeypatch):
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o700)
    end = run_end(monkeypatch)
    other = subprocess.Popen([str(STANDINS / "nsys"), "profile", "-o", str(tmp_path / "other-%p"), "sleep", "30"])
    nsys = nsys_profiling(ray_dir, 1)
    try:
        time.sleep(0.5)  # both started
        assert list(end.nsys_of_this_run(str(ray_dir / "worker-%h-%p"))) == [nsys.pid]  # not another run's
        started = time.monotonic()
        assert end.wait_for_nsys(str(ray_dir / "worker-%h-%p"), bound=30) == []
        assert nsys.poll() == 0 and time.monotonic() - started < 10  # it ended with its workload, not at the bound
        [report] = ray_dir.glob("worker-*.nsys-rep")
        assert "exit_status" in json.loads(report.read_text()) and not list(ray_dir.glob("*.unfinished"))
    finally:
        for proc in (other, nsys):
            kill_nsys(proc.pid)  # and its workload
            proc.wait()


def test_an_nsys_still_running_at_the_bound_is_marked_unfinished_under_its_workers_name(tmp_path, monkeypatch):
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o700)
    end = run_end(monkeypatch)
    monkeypatch.setenv(end.WAIT_ENV, "1")  # the job's environment may shorten or lengthen the bound
    nsys = nsys_profiling(ray_dir, 30)
    try:
        time.sleep(0.5)
        # the worker said whose it is, with its nsys's pid, as the hook writes it in each worker
        whose = ray_dir / f"worker-{socket.gethostname()}-4242.whose.json"
        whose.write_text(json.dumps({"pid": 4242, "nsys_pid": nsys.pid}))
        started = time.monotonic()
        assert end.wait_for_nsys(str(ray_dir / "worker-%h-%p")) == [nsys.pid]
        assert 1 <= time.monotonic() - started < 10
        marked = whose.with_name(whose.name.replace(".whose.json", ".unfinished"))
        assert json.loads(marked.read_text()) == {"nsys_pid": nsys.pid} and nsys.poll() is None
    finally:
        kill_nsys(nsys.pid)
        nsys.wait()


def test_the_runs_end_exports_and_summarizes_each_finished_report_and_leaves_the_others(tmp_path, monkeypatch):
    """The agent's end of a Ray run: a finished worker report gets its export and the three
    summaries beside it; one marked unfinished, and one another account could write, get none."""
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o700)
    end = run_end(monkeypatch)
    nsys = nsys_profiling(ray_dir, 0)
    assert nsys.wait(timeout=60) == 0
    [done] = ray_dir.glob("worker-*.nsys-rep")
    unfinished = shutil.copy(done, ray_dir / "worker-node9-1.nsys-rep")
    (ray_dir / "worker-node9-1.unfinished").write_text("{}")
    open_one = Path(shutil.copy(done, ray_dir / "worker-node9-2.nsys-rep"))
    open_one.chmod(0o666)
    stale = done.with_name(done.name.replace(".nsys-rep", "_nvtx_sum.csv"))
    stale.write_text("an earlier try's, or a partial one")  # made anew, never taken as it was
    assert end.main({"mode": "ray-end", "output": str(ray_dir / "worker-%h-%p"), "nsys": str(STANDINS / "nsys")}) == 0
    stem = done.name[: -len(".nsys-rep")]
    made = {"sqlite", "cuda_gpu_kern_sum.csv", "cuda_api_sum.csv", "nvtx_sum.csv"}
    assert {p.name[len(stem) + 1:] for p in ray_dir.glob(stem + "[._]*") if p != done} == made
    assert not list(ray_dir.glob("worker-node9-*.sqlite")) and not list(ray_dir.glob("worker-node9-*.csv"))
    assert Path(unfinished).exists()  # kept as it was, for fleet to say unfinished
    assert stale.read_text() != "an earlier try's, or a partial one"


def test_a_report_whose_export_fails_keeps_no_export_of_an_earlier_try_and_the_end_says_so(tmp_path, monkeypatch,
                                                                                             capsys):
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o700)
    (ray_dir / "worker-node9-3.nsys-rep").write_text("no report nsys wrote")
    planted = ray_dir / "worker-node9-3.sqlite"
    planted.write_text("an export of an earlier try, or one nsys gave up on")
    end = run_end(monkeypatch)
    assert end.main({"output": str(ray_dir / "worker-%h-%p"), "nsys": str(STANDINS / "nsys")}) == end.NOT_ALL
    assert not planted.exists() and "worker-node9-3.nsys-rep" in capsys.readouterr().err


def test_the_runs_end_in_a_folder_another_account_could_write_touches_nothing(tmp_path, monkeypatch, capsys):
    ray_dir = tmp_path / "ray"
    ray_dir.mkdir(mode=0o777)
    ray_dir.chmod(0o777)
    end = run_end(monkeypatch)
    assert end.main({"output": str(ray_dir / "worker-%h-%p"), "nsys": str(STANDINS / "nsys")}) == end.NOT_ALL
    assert "neither waited for nor summarized" in capsys.readouterr().err and not list(ray_dir.iterdir())


def test_a_node_without_nsys_is_refused_before_the_program_starts(tmp_path):
    # Ray 2.60 itself would start the program and fail it at the first actor: "RuntimeEnvSetupError:
    # ... nsight profile failed to run with the following error message: nsight is not installed"
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    started = tmp_path / "started"
    la = launch("ray", ["touch", str(started)], ["unused"], str(run_dir), None)
    script = "\n".join([f"RUN_DIR={shlex.quote(str(run_dir))}", f"COMMAND=(touch {shlex.quote(str(started))})",
                        *la.setup, la.line])
    bare = tmp_path / "bin"  # a PATH with bash's tools and no nsys
    bare.mkdir()
    for tool in ("mkdir", "cat", "touch", "printf"):
        (bare / tool).symlink_to(shutil.which(tool))
    done = subprocess.run(["/bin/bash", "-c", script], env={"PATH": str(bare)}, capture_output=True, text=True)
    assert done.returncode == 127 and "nsys is not on PATH" in done.stderr and "nothing was started" in done.stderr
    assert not started.exists() and (run_dir / "job.exit").read_text().strip() == "127"
    assert (run_dir / "job.refused").exists()  # the refusal's mark: only with it is 127 the script's refusal


@pytest.fixture(scope="module")
def ray_head():
    """A Ray head on loopback (GCS, raylet, dashboard with its job API), this module's own."""
    head = RayHead([str(Path(sys.executable).parent), str(STANDINS)])
    try:
        head.start()
        yield head
    finally:
        head.stop()


def submitted(ray_head, tmp_path, *fleet_args: str, actors=("trainer-a", "trainer-b")):
    """``fleet ray submit`` of JOB to the head, as a user runs it: the manifest, and what each actor said."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "job.py").write_text(JOB)
    store = tmp_path / "store"
    r = run_fleet("ray", "submit", "--address", ray_head.address, "--store", str(store), "--node-dir",
                  str(tmp_path / "nodes"), "--working-dir", str(app), *fleet_args, "--", "python", "job.py", *actors,
                  env={"PATH": ray_head.env["PATH"], "RAY_AUTH_MODE": "disabled"}, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr + ray_head.said()
    said = json.loads(r.stderr.split("actors ", 1)[1].split("\n", 1)[0])  # the job's log, on stderr
    [path] = store.glob("ray/*/*/manifest.json")
    return json.loads(path.read_text()), said, r


def workers(manifest) -> dict:
    """Each worker's name, and its report as the store has it, by pid."""
    out = {}
    for h in manifest["hosts"]:
        [rep] = [r for r in h["reports"] if r["stored"].endswith(".nsys-rep")]
        assert rep["verified"] and h["status"] == "ok", h
        out[int(Path(rep["stored"]).name.removesuffix(".nsys-rep").rsplit("-", 1)[1])] = (h["worker"], rep["stored"])
    return out


def test_a_ray_job_submitted_to_a_running_cluster_gives_two_reports_named_by_actor(ray_head, tmp_path):
    manifest, said, r = submitted(ray_head, tmp_path)
    host = socket.gethostname()
    assert manifest["status"] == "complete" and "reports: 2 complete" in r.stdout
    assert said["trainer-a"][1] and said["trainer-b"][1]  # each actor's worker ran under nsys
    found = workers(manifest)
    # One report per actor: the job's supervisor and its driver (its child) were not wrapped.
    assert sorted(found) == sorted(pid for pid, _ in said.values())
    for name, (pid, _) in said.items():
        worker, stored = found[pid]
        assert worker == f"Trainer {name} on {host}, pid {pid}"
        assert "default_worker.py" in " ".join(json.loads(Path(stored).read_text())["app"])
    assert manifest["request"]["ray"]["submission_id"] == f"fleet-{manifest['run_id']}"


def test_ranks_with_ray_profiles_only_the_actors_whose_names_match(ray_head, tmp_path):
    manifest, said, _ = submitted(ray_head, tmp_path, "--ranks", "trainer-*",
                                  actors=("trainer-a", "evaluator", "trainer-b"))
    assert {name: under_nsys for name, (_, under_nsys) in said.items()} == {
        "trainer-a": True, "evaluator": False, "trainer-b": True}  # the evaluator started without nsys at all
    found = workers(manifest)
    assert sorted(found) == sorted([said["trainer-a"][0], said["trainer-b"][0]])
    assert sorted(w.split(" on ")[0] for w, _ in found.values()) == ["Trainer trainer-a", "Trainer trainer-b"]
    assert not list((tmp_path / "nodes" / "ray").glob(f"worker-*-{said['evaluator'][0]}.*"))



# Three named actors, two of one class and one of another, each saying its pid; the program then
# exits with the status its first argument gives (a failed driver, after its workers' work).
THREE = """
import json, os, sys, time, ray

ray.init()


@ray.remote
class Trainer:
    def pid(self):
        time.sleep(0.5)  # some work
        return os.getpid()


@ray.remote
class Evaluator:
    def pid(self):
        time.sleep(0.5)
        return os.getpid()


actors = {"trainer-0": Trainer.options(name="trainer-0").remote(),
          "trainer-1": Trainer.options(name="trainer-1").remote(),
          "evaluator-0": Evaluator.options(name="evaluator-0").remote()}
print("actors", json.dumps({name: ray.get(a.pid.remote()) for name, a in actors.items()}), flush=True)
sys.exit(int(sys.argv[1]))
"""


def submitted_three(ray_head, tmp_path, exit_status: int, *fleet_args: str):
    """``fleet ray submit`` of THREE, ending with ``exit_status``: the store, each actor's pid, and fleet's output."""
    app = tmp_path / "app"
    app.mkdir()
    (app / "job.py").write_text(THREE)
    store = tmp_path / "store"
    r = run_fleet("ray", "submit", "--address", ray_head.address, "--store", str(store), "--node-dir",
                  str(tmp_path / "nodes"), "--working-dir", str(app), *fleet_args, "--", "python", "job.py",
                  str(exit_status), env={"PATH": ray_head.env["PATH"], "RAY_AUTH_MODE": "disabled"}, timeout=180)
    assert "actors " in r.stderr, r.stdout + r.stderr + ray_head.said()  # the job ran and said its actors
    pids = json.loads(r.stderr.split("actors ", 1)[1].split("\n", 1)[0])  # the job's log, on stderr
    return store, pids, r


def test_a_failed_ray_driver_makes_ray_submit_exit_non_zero_with_a_driver_line(ray_head, tmp_path):
    """A driver that exits 3 after its actors' work: `ray job submit` exits 1, and so did fleet's
    exit status say success (0); now a `(driver)` line as on Slurm, the workers' reports kept, exit 6."""
    from fleet import exitcodes

    store, pids, r = submitted_three(ray_head, tmp_path, 3)
    assert r.returncode == exitcodes.PARTIAL, r.stdout + r.stderr
    assert "  (driver) the Ray program: workload-failed: the Ray program (the job's driver) failed" in r.stdout, r.stdout
    [path] = store.glob("ray/*/*/manifest.json")
    m = json.loads(path.read_text())
    assert m["status"] == "partial"
    assert sorted(h["status"] for h in m["hosts"]) == ["ok", "ok", "ok", "workload-failed"], m["hosts"]
    assert "reports: 3 complete" in r.stdout and "missing" not in r.stdout, r.stdout  # the driver is no worker

@pytest.fixture(scope="module")
def ray_user(hpc):
    """The login node's user as a Ray user often is: Ray in a virtual environment that is not on the
    job's PATH (a venv of the node's Python, which reaches this checkout's Ray through a .pth file),
    and a ~/.bashrc that puts another Python first, without Ray (as `pyenv init` or `conda activate`
    there do). The login session's HOME and RAY_TMPDIR (Ray's sockets' paths: short) are this test's,
    and every job the session submits inherits them, as sbatch exports the session's environment."""
    user = hpc.scratch("ray-user")
    venv = user / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    [site] = venv.glob("lib/python3*/site-packages")
    (site / "ray-from-pypi.pth").write_text(str(Path(ray.__file__).parents[1]) + "\n")
    other = user / "other-python"
    other.mkdir()
    (other / "python").symlink_to("/usr/bin/python3")
    home = user / "home"
    home.mkdir()
    (home / ".bashrc").write_text(f'export PATH="{other}:$PATH"\n')
    ray_tmp = tempfile.mkdtemp(prefix="fr", dir="/tmp")
    os.chmod(ray_tmp, 0o1777)
    for path in (user, venv, other, home):
        path.chmod(0o755)
    try:
        with login_session(hpc, HOME=str(home), RAY_TMPDIR=ray_tmp, RAY_AUTH_MODE="disabled"):
            yield venv / "bin" / "python"
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)


def ray_program(hpc, name: str, text: str) -> Path:
    """The Ray program ``text``, where the cluster's user reads it."""
    program = hpc.runs / name
    program.write_text(text)
    program.chmod(0o644)
    return program


def ray_job(hpc, tmp_path, python: str, program: Path):
    """``fleet profile --launcher ray -- PYTHON PROGRAM`` in the test cluster. Bounded twice: the
    job's time limit ends it in Slurm, fleet's own wait ends the test."""
    from tests.harness.hpc import fleet as fleet_slurm

    return fleet_slurm(hpc, tmp_path, "--time", "4", "--launcher", "ray", "--", python, str(program), timeout=150)


@contextlib.contextmanager
def login_session(hpc, **changed: str):
    """The login node's sessions (and so the jobs they submit) with these variables changed, then as they were."""
    login = hpc.hosts[0]
    session = login.options["SetEnv"]
    env = dict(word.split("=", 1) for word in session.split())
    hpc.restart_host(login, SetEnv=" ".join(f"{k}={v}" for k, v in {**env, **changed}.items()))
    try:
        yield
    finally:
        hpc.restart_host(login, SetEnv=session)


def test_a_ray_program_in_a_slurm_job_gives_two_reports_named_by_actor(hpc, ray_user, tmp_path):
    from tests.harness.hpc import manifest

    program = ray_program(hpc, "ray_program.py", PROGRAM)
    r = ray_job(hpc, tmp_path, str(ray_user), program)
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest(tmp_path)
    assert m["status"] == "complete" and "reports: 2 complete" in r.stdout, r.stdout
    said = Path(m["slurm"]["log"]["stored"]).read_text()  # the job's log, brought home
    pids = json.loads(said.split("actor pids ", 1)[1].split("\n", 1)[0])
    host = socket.gethostname()  # each worker's node, as the worker named it (the test nodes are this machine)
    names = [f"Trainer trainer-a on {host}, pid {pids[0]}", f"Trainer trainer-b on {host}, pid {pids[1]}"]
    assert sorted(h["worker"] for h in m["hosts"]) == names
    for h in m["hosts"]:
        assert f"  {h['host']} {h['worker']}: ok" in r.stdout  # the run's output names each report by its actor
        assert h["status"] == "ok" and all(rep["verified"] for rep in h["reports"]), h
        [rep] = [rep for rep in h["reports"] if rep["stored"].endswith(".nsys-rep")]
        actor = h["worker"].split(" on ")[0].replace(" ", "-")  # named in the store by its actor, as people know it
        assert Path(rep["stored"]).name == f"{actor}-{h['worker'].rsplit(' ', 1)[1]}.nsys-rep"
        # nsys wrapped Ray's worker process itself, started by the job's raylet, not the program
        assert "default_worker.py" in " ".join(json.loads(Path(rep["stored"]).read_text())["app"])
        # its export and summaries, made in the job once its nsys ended, home beside it under its actor's name
        extras = {r["summary"]: Path(r["stored"]).name for r in h["reports"] if r["status"] in ("summary", "export")}
        stem = Path(rep["stored"]).name[: -len(".nsys-rep")]
        assert extras == {"whose": f"{stem}.whose.json", "sqlite": f"{stem}.sqlite",
                          **{n: f"{stem}_{n}.csv" for n in ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum")}}, extras
    stats = run_fleet("reports", "stats", m["run_id"], "--json", "--store", str(tmp_path))
    assert stats.returncode == 0, stats.stdout + stats.stderr  # before, a Ray run had no summaries: exit 10
    kernels = fleet_json(stats.stdout)["kernels"]
    assert kernels["rows"] and all(sorted(row["by"]) == names for row in kernels["rows"]), kernels


# The same two actors, trainer-b's nsys killed while its worker runs (as when Ray or the job's end kills
# nsys before its worker ends): nsys writes no report, the worker has said whose it is.
KILLED = PROGRAM.replace("class Trainer:", """class Trainer:
    def end_my_nsys(self):
        parent = open("/proc/%d/cmdline" % os.getppid()).read().split(chr(0))
        assert any(os.path.basename(w) == "nsys" for w in parent[:2]), parent  # the stand-in is a Python script
        os.kill(os.getppid(), 9)
""", 1) + """
time.sleep(1)  # each has said whose it is
b.end_my_nsys.remote()
time.sleep(2)
"""


def test_a_ray_worker_whose_nsys_left_no_report_is_missing_never_ok(hpc, ray_user, tmp_path):
    from fleet import exitcodes
    from tests.harness.hpc import manifest

    program = ray_program(hpc, "ray_killed.py", KILLED)
    r = ray_job(hpc, tmp_path, str(ray_user), program)
    m = manifest(tmp_path)
    assert r.returncode == exitcodes.PARTIAL and m["status"] == "partial", r.stdout + r.stderr
    said = Path(m["slurm"]["log"]["stored"]).read_text()
    pids = json.loads(said.split("actor pids ", 1)[1].split("\n", 1)[0])
    host = socket.gethostname()
    by_worker = {h["worker"]: h for h in m["hosts"]}
    assert sorted(by_worker) == [f"Trainer trainer-a on {host}, pid {pids[0]}", f"Trainer trainer-b on {host}, pid {pids[1]}"]
    kept, lost = by_worker[f"Trainer trainer-a on {host}, pid {pids[0]}"], by_worker[f"Trainer trainer-b on {host}, pid {pids[1]}"]
    assert kept["status"] == "ok" and any(rep["stored"].endswith(".nsys-rep") for rep in kept["reports"])
    assert lost["status"] == "missing" and "left no report" in lost["missing_why"]
    assert not any(rep["stored"].endswith(".nsys-rep") for rep in lost["reports"])
    assert f"  {host} Trainer trainer-b on {host}, pid {pids[1]}: missing: " in r.stdout, r.stdout


def test_a_ray_program_that_fails_after_its_actors_is_not_ok_and_its_workers_reports_are_kept(hpc, ray_user, tmp_path):
    """The program is the workload: one that exits 3 (its actors done, their reports written) is a
    workload-failed line of its own beside its workers', the run partial (exit 6), never complete and 0."""
    from fleet import exitcodes
    from tests.harness.hpc import manifest

    program = ray_program(hpc, "ray_fails.py", PROGRAM + "\nimport sys\nsys.exit(3)\n")
    r = ray_job(hpc, tmp_path, str(ray_user), program)
    m = manifest(tmp_path)
    assert r.returncode == exitcodes.PARTIAL and m["status"] == "partial", r.stdout + r.stderr
    assert "(driver) the Ray program: workload-failed: the Ray program (the job's driver) ended with exit status 3" in r.stdout
    assert "reports: 2 complete" in r.stdout and "missing" not in r.stdout, r.stdout  # the driver is not a rank
    [driver] = [h for h in m["hosts"] if h["host"] == "(driver)"]
    assert driver["status"] == "workload-failed" and "exit status 3" in driver["missing_why"]
    workers = [h for h in m["hosts"] if h["host"] != "(driver)"]
    assert len(workers) == 2 and all(any(rep["stored"].endswith(".nsys-rep") and rep["verified"]
                                         for rep in h["reports"]) for h in workers), m["hosts"]


def test_a_ray_program_ending_127_after_a_line_of_its_own_beginning_fleet_is_its_failure_not_a_refusal(
        hpc, ray_user, tmp_path):
    """The program runs in the batch shell, as the script's own checks do: its 127 and its last line
    `fleet: ...` were read as the job script's refusal, and its failure was said as one."""
    from fleet import exitcodes
    from tests.harness.hpc import manifest

    program = ray_program(hpc, "ray_127.py", PROGRAM + "\nimport sys\nprint('fleet: this is the program speaking', flush=True)\nsys.exit(127)\n")
    r = ray_job(hpc, tmp_path, str(ray_user), program)
    m = manifest(tmp_path)
    assert r.returncode == exitcodes.PARTIAL and "refused to start" not in r.stdout, r.stdout + r.stderr
    assert "(driver) the Ray program: workload-failed: the Ray program (the job's driver) ended with exit status 127" \
        in r.stdout, r.stdout
    assert sorted(h["status"] for h in m["hosts"]) == ["ok", "ok", "workload-failed"], m["hosts"]


def test_a_node_without_nsys_is_refused_in_the_job_before_the_ray_program_starts(hpc, tmp_path):
    from fleet import exitcodes

    started = hpc.runs / "ray-program-started"
    program = ray_program(hpc, "ray_never.py", f"open({str(started)!r}, 'w').close()\n")
    with login_session(hpc, PATH="/usr/local/bin:/usr/bin:/bin"):  # the job's PATH, without nsys's folder
        r = ray_job(hpc, tmp_path, "/usr/bin/python3", program)
    assert r.returncode != 0 and not started.exists(), r.stdout + r.stderr
    line = next(line for line in r.stdout.splitlines() if "refused to start" in line)
    assert r.returncode == exitcodes.FAILED
    assert line.endswith(f"rank 0: missing: rank 0 left no result: the job refused to start: nsys is not on PATH on "
                         "node1: Ray's nsight plugin runs nsys from PATH for every worker (else RuntimeEnvSetupError: "
                         "nsight is not installed); nothing was started: put nsys's folder on the job's PATH"), line


def test_a_worker_file_naming_its_node_with_control_characters_never_reaches_a_terminal_raw(tmp_path):
    """The job names its workers' files: a node name that is no safe name is a failed worker under a
    name of fleet's own, the job's words escaped, whether or not a report is beside it."""
    import asyncio

    from fleet.slurm.raygather import workers_home
    hostile = "\x1b]0;owned\x07\x1b[2J"
    sha = "0" * 64
    lines = [f"10 {sha} /run/ray/worker-{hostile}-1.nsys-rep", f"10 {sha} /run/ray/worker-{hostile}-2.whose.json"]
    hosts = asyncio.run(workers_home(None, None, "/run", lines, tmp_path))
    assert [(h.host, h.worker, h.status) for h in hosts] == [("(ray worker)", "(unsafe name)", "failed")] * 2
    assert all("\x1b" not in h.missing_why and "\\x1b" in h.missing_why for h in hosts)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("program, end", [(PROGRAM, "sys.exit(0)"), (PROGRAM, "sys.exit(3)"),
                                          (PROGRAM, "raise RuntimeError('the program fails')"),
                                          (ENDS_ITS_ACTORS, "os.kill(os.getpid(), 9)")],
                         ids=["exit-0", "exit-3", "uncaught-exception", "actors-ended-then-sigkill"])
def test_the_job_waits_for_its_workers_nsys_to_finish_their_reports_however_the_program_ends(hpc, ray_user, tmp_path,
                                                                                             program, end):
    """The Ray program ends with its actors alive (fleet's hook ends them at its end, however it
    ends but by a signal: a program killed by one ends its actors itself, else Ray kills them, nsys
    with them), and Ray leaves each worker's nsys still writing its report (reparented, in a process
    group of its own): here each takes 4 s to generate it, as a large trace does. The job's end waits
    for them; before, it did not, and fleet gathered what was there then."""
    from tests.harness.hpc import manifest

    text = program + f"\nimport os, sys\n{end}\n"
    program = ray_program(hpc, "ray_slow_reports.py", text)
    with login_session(hpc, STANDIN_IMPORT_SECONDS="4"):  # the importer nsys runs once its worker has ended
        r = ray_job(hpc, tmp_path, str(ray_user), program)
    m = manifest(tmp_path)
    workers = [h for h in m["hosts"] if h["host"] != "(driver)"]
    assert sorted(h["worker"].split(" on ")[0] for h in workers) == ["Trainer trainer-a", "Trainer trainer-b"], r.stdout
    for h in workers:
        assert h["status"] == "ok", r.stdout
        [rep] = [rep for rep in h["reports"] if rep["stored"].endswith(".nsys-rep")]
        # the whole report, as the importer wrote it at its end (it is empty until then)
        assert rep["verified"] and "exit_status" in json.loads(Path(rep["stored"]).read_text()), rep
    assert "waiting up to 60 s for the nsys of" in Path(m["slurm"]["log"]["stored"]).read_text()


def test_a_worker_whose_nsys_still_runs_when_the_wait_ends_is_missing_with_why(hpc, ray_user, tmp_path):
    """Each worker's nsys takes 10 s to generate its report, and the job waits 2 s (its bound, shortened
    here from 60): each worker is then missing, saying why, its unfinished report never counted."""
    from tests.harness.hpc import manifest

    program = ray_program(hpc, "ray_unfinished.py", PROGRAM)
    try:
        with login_session(hpc, STANDIN_IMPORT_SECONDS="10", FLEET_RAY_NSYS_WAIT="2"):
            r = ray_job(hpc, tmp_path, str(ray_user), program)
    finally:  # the nsys still generating and their importers, this test's own, by the pids the job marked
        for marked in hpc.runs.rglob("*.unfinished"):
            kill_nsys(json.loads(marked.read_text())["nsys_pid"])
    m = manifest(tmp_path)
    assert r.returncode != 0 and m["status"] == "failed", r.stdout + r.stderr
    assert sorted(h["worker"].split(" on ")[0] for h in m["hosts"]) == ["Trainer trainer-a", "Trainer trainer-b"]
    for h in m["hosts"]:
        assert h["status"] == "missing" and "still ran when the job stopped waiting" in h["missing_why"], h
        assert "report is missing or unfinished" in h["missing_why"], h
        assert not any(rep["stored"].endswith(".nsys-rep") for rep in h["reports"]), h  # the empty one stayed
        assert f"  {h['host']} {h['worker']}: missing: " in r.stdout, r.stdout
    assert "after 2 s the nsys of Ray worker" in Path(m["slurm"]["log"]["stored"]).read_text()


def kill_nsys(pid: int) -> None:
    """An nsys stand-in and what it started (its workload, its importer) by pid, if it still is one."""
    with contextlib.suppress(OSError):
        if b"profile" not in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
            return
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    os.kill(int(stat.parent.name), 9)
        os.kill(pid, 9)


def test_a_worker_marked_unfinished_is_missing_and_its_partial_report_is_neither_brought_home_nor_counted(tmp_path):
    import asyncio

    from fleet.slurm.raygather import workers_home
    sha = "0" * 64
    lines = [f"0 {sha} /run/ray/worker-node1-5.nsys-rep", f"16 {sha} /run/ray/worker-node1-5.unfinished",
             f"16 {sha} /run/ray/worker-node1-nsys77.unfinished"]  # an nsys whose worker the job could not name
    hosts = asyncio.run(workers_home(None, None, "/run", lines, tmp_path))
    assert [(h.host, h.worker, h.status, h.reports) for h in hosts] == [
        ("node1", "worker-node1-5", "missing", []), ("node1", "worker-node1-nsys77", "missing", [])]
    assert hosts[0].missing_why.endswith("its report is missing or unfinished (left on the cluster as "
                                         "worker-node1-5.nsys-rep)")
    assert hosts[1].missing_why.endswith("its report is missing or unfinished")
    assert not list(tmp_path.iterdir())


def test_ray_reports_are_listed_pulled_and_opened_by_actor(ray_head, tmp_path):
    """Three named actors, two of one class and one of another, through `fleet ray submit`: see
    :func:`found_by_actor`."""
    store, pids, r = submitted_three(ray_head, tmp_path, 0)
    assert r.returncode == 0, r.stdout + r.stderr
    [path] = store.glob("ray/*/*/manifest.json")
    found_by_actor(store, json.loads(path.read_text())["run_id"], pids, tmp_path / "out")


def test_three_named_actors_of_a_ray_program_in_a_slurm_job_are_found_by_actor(hpc, ray_user, tmp_path):
    """The same three actors in a Slurm job: see :func:`found_by_actor`."""
    from tests.harness.hpc import manifest

    three = THREE.replace("ray.init()", "ray.init(num_cpus=3, include_dashboard=False)")
    program = ray_program(hpc, "three.py", three.replace("sys.exit(int(sys.argv[1]))", "sys.exit(0)"))
    r = ray_job(hpc, tmp_path / "store", str(ray_user), program)
    assert r.returncode == 0, r.stdout + r.stderr
    m = manifest(tmp_path / "store")
    said = Path(m["slurm"]["log"]["stored"]).read_text()  # the job's log, brought home
    pids = json.loads(said.split("actors ", 1)[1].split("\n", 1)[0])
    found_by_actor(tmp_path / "store", m["run_id"], pids, tmp_path / "out")


def found_by_actor(store: Path, run_id: str, pids: dict, out: Path) -> None:
    """`reports ls` (and --json), the store's file names, `reports pull` and `reports open RUN
    trainer-0` name each actor of THREE; `reports stats` reads its summaries, a column each.
    Before, every row said the host, the files were worker-HOST-PID, `open trainer-0` was refused,
    each .whose.json was listed as a `summary`, and with no summaries `reports stats` exited 10."""
    actors = {"trainer-0": "Trainer", "trainer-1": "Trainer", "evaluator-0": "Evaluator"}
    rows = fleet_json(run_fleet("reports", "ls", "--json", "--store", str(store)).stdout)
    assert not [row for row in rows if row["path"].endswith(".whose.json")], rows
    reports = [row for row in rows if row["path"].endswith(".nsys-rep")]
    assert sorted(Path(row["path"]).name for row in reports) == sorted(
        f"{cls}-{name}-{pids[name]}.nsys-rep" for name, cls in actors.items())
    assert sorted(row["worker"].split(" on ")[0] for row in reports) == sorted(f"{c} {n}" for n, c in actors.items())
    table = run_fleet("reports", "ls", "--store", str(store)).stdout
    assert all(f"{cls} {name}" in table for name, cls in actors.items()) and ".whose.json" not in table, table
    pulled = run_fleet("reports", "pull", run_id, str(out), "--store", str(store))
    assert pulled.returncode == 0, pulled.stderr
    assert sorted(p.name for p in out.rglob("*.nsys-rep")) == sorted(
        f"{cls}-{name}-{pids[name]}.nsys-rep" for name, cls in actors.items())
    for which, want in (("trainer-0", ["trainer-0"]), ("trainer-*", ["trainer-0", "trainer-1"]),
                        ("Evaluator", ["evaluator-0"])):
        opened = fleet_json(run_fleet("reports", "open", run_id, which, "--json", "--store", str(store),
                                      env={"PATH": "/usr/bin:/bin"}).stdout)
        assert sorted(Path(p).name for p in opened["reports"]) == sorted(
            f"{actors[n]}-{n}-{pids[n]}.nsys-rep" for n in want), (which, opened)
    # each worker's export and summaries, made where its report is once its nsys ended
    stats = run_fleet("reports", "stats", run_id, "--json", "--store", str(store))
    assert stats.returncode == 0, stats.stdout + stats.stderr
    data = fleet_json(stats.stdout)
    assert sorted(c["worker"].split(" on ")[0] for c in data["columns"]) == sorted(f"{c} {n}" for n, c in actors.items())
    assert data["kernels"]["rows"] and all(len(row["by"]) == 3 for row in data["kernels"]["rows"]), data["kernels"]


def test_a_run_folder_another_account_made_first_is_refused_by_ray_submit_and_no_job_is_submitted(ray_head, tmp_path):
    """The Ray folder attack through the command line: another account of the head (the tenant)
    made the run's folder first, open to every account, to swap its reports for planted ones.
    `fleet ray submit` refuses it, naming the folder and its owner, before any job: the run failed,
    nothing made in the folder, no job of the run on the head."""
    import pwd

    from tests.harness.procs import TENANT_USER
    from tests.harness.sshd import ensure_user

    ensure_user(TENANT_USER)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    tenant = pwd.getpwnam(TENANT_USER)
    os.chown(theirs, tenant.pw_uid, tenant.pw_gid)
    theirs.chmod(0o777)
    app = tmp_path / "app"
    app.mkdir()
    (app / "job.py").write_text(JOB)
    store = tmp_path / "store"
    r = run_fleet("ray", "submit", "--address", ray_head.address, "--store", str(store), "--node-dir", str(theirs),
                  "--working-dir", str(app), "--", "python", "job.py", "trainer-a",
                  env={"PATH": ray_head.env["PATH"], "RAY_AUTH_MODE": "disabled"}, timeout=180)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert f"{theirs} belongs to uid {tenant.pw_uid}" in r.stdout + r.stderr, r.stdout + r.stderr
    [path] = store.glob("ray/*/*/manifest.json")
    manifest = json.loads(path.read_text())
    assert manifest["status"] == "failed" and "the job was not submitted" in manifest["hosts"][0]["missing_why"]
    assert list(theirs.iterdir()) == []  # refused before anything was made in it
    jobs = subprocess.run([str(Path(sys.executable).parent / "ray"), "job", "list", "--address", ray_head.address],
                          env={**os.environ, "RAY_AUTH_MODE": "disabled"}, capture_output=True, text=True, timeout=60)
    assert jobs.returncode == 0 and f"fleet-{manifest['run_id']}" not in jobs.stdout, jobs.stdout + jobs.stderr


def test_the_ray_ends_arguments_read_as_absent_when_not_strings():
    """The Ray run's end reads its arguments once: an output or an nsys that is not a string reads
    as absent (no report folder; the nsys on PATH), never as its str() (a list's "['x']" is no
    folder, and a number is no program to run)."""
    from fleet.agent.rayend import RayEndArgs

    odd = RayEndArgs.read({"output": ["~/x"], "nsys": 7})
    assert (odd.output, odd.nsys) == ("", None)
    asked = RayEndArgs.read({"output": "~/fleet/run/ray-%p", "nsys": "/opt/nsys"})
    assert (asked.output, asked.nsys) == ("~/fleet/run/ray-%p", "/opt/nsys")
    assert RayEndArgs.read({"output": "~/r", "nsys": ""}).nsys is None
