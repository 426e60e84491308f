"""The names of a run's files (fleet/rundir.py): spelled in one place, and read back as written.

Every module of fleet names a run's files through ``RunDir``; the walk below fails on a module that
spells one itself, so a copy cannot come back. The round trips hold the forward names to their
inverses, and the writers to the readers: the agent's result file, the batch script's marks and a
Ray worker's whose file are each written where the login node's listing (``results.READ``,
``jobs.JOB_FILES``, run in a real shell) finds them and the controller's parsing reads them back.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import socket
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet import rundir
from fleet.agent import rayend, task
from fleet.agent.messages import ProfileResult
from fleet.rundir import RunDir
from fleet.plan import ProfileRequest
from fleet.slurm import jobs, launchers, options, ray_hook, results
from fleet.slurm import run as slurm_run
from fleet.slurm.script import JobFiles, JobSpec, render
from tests.conftest import REPO

FLEET = REPO / "fleet"
# fleet/slurm/ray_hook.py runs in the Ray program's own Python, written into the job verbatim (the
# golden ray.sbatch holds its text): it cannot import RunDir, so it spells two names itself, and
# test_the_ray_hook_writes_and_reads_the_names_rundir_gives holds them to RunDir's.
SPELLS_ITS_OWN = {FLEET / "rundir.py", FLEET / "slurm" / "ray_hook.py"}

NAMES = [RunDir.AGENT, RunDir.SCRIPT, RunDir.REQUEST, RunDir.JOB_EXIT, RunDir.JOB_STOPPED, RunDir.JOB_REFUSED,
         RunDir.BATCH_LOG, RunDir.RESULT, RunDir.TMP, RunDir.RANK, RunDir.PID, RunDir.RAY, RunDir.RAY_HOOK,
         RunDir.RAY_HOOK_BLOCK, RunDir.RAY_WORKER, RunDir.RAY_REPORTS, RunDir.WHOSE, RunDir.UNFINISHED, RunDir.NSYS_REPORT]
# What a module would write to spell one of them, once its placeholders (%s, %d, {...}) read as *:
# the names as they are, and a label (rank%d, pid%d) where it is a file's name or a path's part.
OWNED = {**{name: re.escape(name) for name in (
    RunDir.AGENT, RunDir.SCRIPT, RunDir.REQUEST, RunDir.JOB_EXIT, RunDir.JOB_STOPPED, RunDir.JOB_REFUSED,
    RunDir.BATCH_LOG, RunDir.BATCH_LOG.replace("%j", "*"), RunDir.RESULT, RunDir.TMP, "/" + RunDir.RAY, RunDir.RAY + "/",
    RunDir.RAY_HOOK, RunDir.RAY_HOOK_BLOCK, RunDir.RAY_REPORTS, RunDir.WHOSE, RunDir.UNFINISHED)},
         RunDir.RAY_WORKER: rf"(^|/){RunDir.RAY_WORKER}",
         **{label + "*": rf"(^|/){label}\*($|[./])" for label in (RunDir.RANK, RunDir.PID)}}


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def strings_of(source: str) -> list[tuple[int, str]]:
    """(line, text) of every string the code spells, f-strings with each expression as *, and
    %-placeholders as *; docstrings left out (they explain the names; comments are not strings)."""
    tree = ast.parse(source)
    docs, inside = _docstrings(tree), set()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside |= {id(v) for v in ast.walk(node) if v is not node}
            text = "".join(v.value if isinstance(v, ast.Constant) else "*" for v in node.values)
            out.append((node.lineno, text))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs | inside:
            out.append((node.lineno, node.value))
    return [(line, re.sub(r"%[sdi]", "*", text)) for line, text in out]


def spellings(path: Path) -> list[str]:
    return [f"{path.relative_to(REPO)}:{line}: {text!r} spells {name!r}"
            for line, text in strings_of(path.read_text()) for name, pattern in OWNED.items()
            if re.search(pattern, text)]


def test_no_module_but_rundir_spells_the_name_of_a_run_file():
    wrong = []
    for path in sorted(FLEET.rglob("*.py")):
        if path not in SPELLS_ITS_OWN:
            wrong += spellings(path)
    assert wrong == [], "name the file through fleet.rundir.RunDir:\n" + "\n".join(wrong)


def test_the_walk_sees_spellings_in_strings_and_f_strings_but_not_in_docstrings_or_comments():
    source = ('"""A module on NODE/rankN.result.json."""\n'
              'import os\n'
              'def f(d, h, j, r):\n'
              '    """Reads job.exit."""\n'
              '    a = os.path.join(d, "%s.result.json" % h)  # job.stopped\n'
              '    b = f"{d}/slurm-{j}.out"\n'
              '    c = "rank%d" % r\n'
              '    return f"{d}/ray/x", "fine", len("worker-")\n')
    found = [(line, name) for line, text in strings_of(source) for name, pattern in OWNED.items()
             if re.search(pattern, text)]
    assert sorted(found) == [(5, RunDir.RESULT), (6, "slurm-*.out"), (7, "rank*"), (8, "/ray"), (8, "ray/"), (8, "worker-")]
    assert spellings(FLEET / "rundir.py")  # and it would see RunDir's own, were they elsewhere


@pytest.mark.parametrize("name", NAMES)
def test_every_name_is_a_plain_word_a_script_may_spell_unquoted(name):
    assert shlex.quote(name) == name and "/" not in name and not re.search(r"[*?\[\]{}$`\\\s'\"]", name)


def test_a_host_and_a_rank_are_named_alike_in_their_folder():
    run = RunDir("/r/20261129-120000-abcd")
    assert run.result("h01") == "/r/20261129-120000-abcd/h01.result.json"
    assert run.tmp("h01") == "/r/20261129-120000-abcd/.tmp-h01"
    node = run.node("node1")
    assert node == RunDir("/r/20261129-120000-abcd/node1")
    assert node.result(RunDir.label(3)) == "/r/20261129-120000-abcd/node1/rank3.result.json"
    assert node.tmp(RunDir.label(None, 4242)) == "/r/20261129-120000-abcd/node1/.tmp-pid4242"
    assert RunDir("").node("*").result("*") == "*/*.result.json"  # relative, for a shell in the run folder
    assert RunDir("/").file("x") == "/x" and RunDir("/r/").file("x") == "/r/x"
    # A name a job wrote is joined as written: one starting with / does not leave the folder.
    assert RunDir("/r").file("/etc/passwd") == "/r//etc/passwd"


@pytest.mark.parametrize("node,rank", [("node1", 0), ("gpu-a.b", 7), ("n", 123456789)])
def test_a_result_file_s_place_reads_back_as_its_node_and_rank(node, rank):
    path = RunDir("").node(node).result(RunDir.label(rank))
    assert RunDir.result_place(path) == (node, RunDir.label(rank))
    assert RunDir.rank_of(RunDir.label(rank)) == rank
    assert results.where(path) == (node, rank)
    assert results.where(RunDir("/abs/run").node(node).result(RunDir.label(rank)))[1] == rank


@pytest.mark.parametrize("label", [RunDir.label(None, 42), RunDir.RANK, "rankx", "rank-1", "rank" + "1" * 10,
                                   "Rank3", "3"])
def test_a_label_that_is_no_rank_s_reads_as_none(label):
    assert RunDir.rank_of(label) is None


def test_a_name_that_is_no_result_file_s_has_no_host():
    assert RunDir.result_place("node1/rank3.nsys-rep") == ("node1", "")
    assert results.where("../rank3.result.json") == (None, 3)


def test_the_job_s_files_and_sbatch_s_log():
    run = RunDir("/r/run")
    assert (run.agent, run.script, run.request) == ("/r/run/fleet-agent.py", "/r/run/job.sbatch",
                                                    "/r/run/fleet-request.json")
    assert (run.job_exit, run.job_stopped) == ("/r/run/job.exit", "/r/run/job.stopped")
    assert run.batch_log == "/r/run/slurm-%j.out"
    assert run.batch_log_of(4242) == run.batch_log.replace("%j", "4242") == "/r/run/slurm-4242.out"


@pytest.mark.parametrize("host", ["node1", "gpu-node-7", "a.b-c"])
def test_a_ray_worker_s_report_and_whose_file_read_back_as_its_host(host):
    run = RunDir("/r/run")
    assert run.ray_reports == "/r/run/ray/worker-%h-%p"
    report = run.ray_file(RunDir.ray_worker(host, 123) + RunDir.NSYS_REPORT)
    assert report == run.ray_reports.replace("%h", host).replace("%p", "123") + ".nsys-rep"
    whose = RunDir.whose_beside(report)
    assert whose == f"/r/run/ray/worker-{host}-123.whose.json" and RunDir.is_whose(whose)
    assert not RunDir.is_whose(report)
    assert RunDir.ray_worker_host(report) == RunDir.ray_worker_host(whose) == host
    assert (run.ray_hook, run.ray_hook_block) == ("/r/run/ray/fleet_ray_hook.py", "/r/run/ray/fleet_ray_hook.json")


def test_the_ray_hook_writes_and_reads_the_names_rundir_gives(tmp_path, monkeypatch):
    run = RunDir(tmp_path)
    os.mkdir(run.ray, 0o700)  # the hook writes only into the user's own private folder
    monkeypatch.setattr(ray_hook, "HERE", run.ray)
    monkeypatch.delenv(ray_hook.BLOCK_ENV, raising=False)
    Path(run.ray_hook_block).write_text(json.dumps({"_nsight": {"o": run.ray_reports}}))
    assert ray_hook._block() == {"o": run.ray_reports}
    ray_hook._write({"pid": os.getpid()})
    report = run.ray_file(RunDir.ray_worker(socket.gethostname(), os.getpid()) + RunDir.NSYS_REPORT)
    assert sorted(os.listdir(run.ray)) == sorted([RunDir.RAY_HOOK_BLOCK, os.path.basename(RunDir.whose_beside(report))])


def test_the_rendered_script_writes_the_run_s_names():
    files = JobFiles("/scratch/ana/fleet-reports/run1", "/scratch/ana/fleet-reports", nonce="0" * 32)
    req = ProfileRequest(tool="nsys", command=("true",), run_id="run1")
    text = render(req, options.checked(JobSpec(partition="gpu"), req), files)
    assert f"#SBATCH --output={RunDir(files.run_dir).batch_log}\n" in text
    assert f'echo "$status" > "{launchers.IN_SCRIPT.job_exit}"\n' in text
    assert f'date +%s > "{launchers.IN_SCRIPT.job_stopped}"\n' in text
    assert launchers.IN_SCRIPT.job_exit == "$RUN_DIR/" + RunDir.JOB_EXIT


def _listing(run_dir: Path, nonce: str = "n" * 32) -> tuple[list, list, list]:
    """What the login node's one call lists in a run folder, cut at its marks, as gather reads it."""
    out = subprocess.run(["sh", "-c", 'cd -- "$1" || exit 1; m="@@$2"; ' + results.READ + jobs.JOB_FILES, "sh",
                          str(run_dir), nonce, str(results.RESULT_MAX)], capture_output=True, text=True, check=True)
    return results.split(out.stdout, f"@@{nonce} ")


def test_what_the_agent_and_the_script_write_the_login_node_s_listing_finds_and_gather_reads(tmp_path):
    root = tmp_path / "reports"
    root.mkdir(mode=0o700)
    run = RunDir(root / "run1")
    node = run.node("node1")
    plan = SimpleNamespace(host=RunDir.label(2), reasons=("a tenant",), remedy=None, tenants=())
    assert task.refuse(plan, {"slurm_node": "node1", "directory": node.path}, str(root)) != 0
    # The batch script's own lines for the marks, run as the script runs them.
    req = ProfileRequest(tool="nsys", command=("true",), run_id="run1")
    for line in render(req, options.checked(JobSpec(partition="gpu"), req), JobFiles(run.path, str(root))).splitlines():
        if launchers.IN_SCRIPT.job_exit in line and "$status" in line or launchers.IN_SCRIPT.job_stopped in line \
                or launchers.IN_SCRIPT.job_refused in line:
            subprocess.run(["bash", "-c", f"RUN_DIR={shlex.quote(run.path)}; status=3; {line.strip()}"], check=True)
    Path(run.batch_log_of(77)).write_text("log\n")
    Path(node.file(RunDir.label(5) + ".nsys-rep")).write_text("killed before its result\n")
    Path(node.file(RunDir.label(2) + ".nsys-rep")).write_text("beside its result\n")
    found, refused, other = _listing(Path(run.path))
    assert refused == []
    [(path, text)] = found
    result, why = results.from_file(path, text)
    body = result.body
    assert why is None and (body["host"], body["slurm_node"], body["status"]) == (RunDir.label(2), "node1", "refused")
    assert result.answer == ProfileResult.read(body)  # read into its types once, where it is found
    assert results.where(path) == ("node1", 2)
    marks = dict((k, v) for k, v in other if k not in ("orphan", "slurm"))
    assert marks[RunDir.JOB_EXIT] == "3" and marks[RunDir.JOB_STOPPED].isdigit() and RunDir.JOB_REFUSED in marks
    orphans = slurm_run._orphans([v for k, v in other if k == "orphan"])
    assert list(orphans) == [5] and orphans[5][0] == "node1"
    [log] = [v for k, v in other if k == "slurm"]
    assert jobs.file_mark(log)["path"].endswith("/" + os.path.basename(run.batch_log_of(77)))


def test_a_ray_worker_s_files_are_listed_as_ray_s_and_read_back(tmp_path, monkeypatch):
    run = RunDir(tmp_path / "run1")
    os.makedirs(run.ray, 0o700)  # the hook writes only into the user's own private folder
    monkeypatch.setattr(ray_hook, "HERE", run.ray)
    monkeypatch.delenv(ray_hook.BLOCK_ENV, raising=False)
    ray_hook._write({"pid": os.getpid(), "nsys_pid": 4242})
    report = run.ray_file(RunDir.ray_worker(socket.gethostname(), os.getpid()) + RunDir.NSYS_REPORT)
    Path(report).write_text("report\n")
    # the job's wait marks the worker whose nsys (by the pid its whose file names) still ran, as its report
    assert rayend._unfinished(run.ray, 4242) == RunDir.ray_base(report)  # the agent's end of the Ray run
    _, _, other = _listing(Path(run.path))
    listed = sorted(jobs.file_mark(v)["path"] for k, v in other if k == RunDir.RAY)
    assert listed == sorted([os.path.realpath(report), os.path.realpath(RunDir.whose_beside(report)),
                             os.path.realpath(RunDir.ray_base(report) + RunDir.UNFINISHED)])
    assert {RunDir.ray_worker_host(p) for p in listed} == {socket.gethostname()}
    assert {RunDir.ray_base(p) for p in listed} == {os.path.realpath(RunDir.ray_base(report))}
    assert [RunDir.is_unfinished(p) for p in listed] == [False, True, False]  # .nsys-rep, .unfinished, .whose.json


def test_rundir_is_shipped_with_the_agent():
    """Shipped, so the node and the controller name the same files (tests/test_bundle.py holds it to 3.8)."""
    from fleet.agent import bundle
    assert bundle.shipped()["fleet_rundir"] == rundir.__name__
