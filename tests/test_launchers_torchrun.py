"""torchrun as it is: every option the real torchrun's --help lists (recorded on an H200 test
machine: tests/fixtures/launchers-h200/torchrun-help.txt) is skipped with its value before the
script, the stand-in takes exactly those, and its workers get what the real torchrun's workers got
there, variable by variable, for three invocations (tests/fixtures/launchers-h200/torchrun-workers/):
`torchrun --standalone`, `torchrun --no-python`, `python -m torch.distributed.run`."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.agent import task
from fleet.slurm.launchers import TORCHRUN_FLAGS, command_problem, launch, script_index

FIXTURES = Path(__file__).parent / "fixtures"
STANDIN = Path(__file__).parent / "standins" / "torchrun"
WORKERS = FIXTURES / "launchers-h200" / "torchrun-workers"
CASES = ("standalone", "nopython", "module")
SHELLS_OWN = {"_"}  # bash sets `_` to the command it starts; the workers inherit it from torchrun
FRESH = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE"}  # new every run (README.md there)

RECORD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
"""
# The H200's recorder (tests/fixtures/launchers-h200/launchers-check.sh, part 1), word for word.
REC_PY = """
import json, os, sys
base = dict(l.split("=", 1) for l in open(sys.argv[1]).read().split("\\0") if "=" in l)
given = {k: v for k, v in sorted(os.environ.items()) if base.get(k) != v and k != "PYTHONPATH"}
with open(os.path.join(sys.argv[2], "rank%s.json" % os.environ.get("RANK")), "w") as f:
    json.dump({"argv": sys.argv, "executable": sys.executable, "pid": os.getpid(), "ppid": os.getppid(),
               "added_or_changed": given}, f, indent=1, sort_keys=True)
"""


def recorded(case: str) -> list[dict]:
    return [json.loads((WORKERS / case / f"rank{r}.json").read_text()) for r in (0, 1)]


def recorded_command(case: str) -> list[str]:
    return (WORKERS / case / "cmd.txt").read_text().split()


def entry_points(tmp_path: Path) -> tuple[Path, Path]:
    """The stand-in installed as torch installs torchrun: a `torchrun` entry point whose #! line is
    the interpreter it runs under, and a `torch.distributed.run` module for `python -m`."""
    body = f"import runpy\nrunpy.run_path({str(STANDIN)!r}, run_name='__main__')\n"
    bin_dir, site = tmp_path / "bin", tmp_path / "site"
    bin_dir.mkdir()
    (bin_dir / "torchrun").write_text(f"#!{sys.executable}\n{body}")
    (bin_dir / "torchrun").chmod(0o755)
    (site / "torch" / "distributed").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("")
    (site / "torch" / "distributed" / "__init__.py").write_text("")
    (site / "torch" / "distributed" / "run.py").write_text(body)
    return bin_dir / "torchrun", site


def standin():
    loader = importlib.machinery.SourceFileLoader("torchrun_standin", str(STANDIN))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def real_options() -> dict[str, bool]:
    return standin().documented_options(FIXTURES / "launchers-h200" / "torchrun-help.txt")


def test_the_help_is_read_as_the_real_torchrun_lists_its_options():
    options = real_options()
    assert options["--nproc-per-node"] and options["--nproc_per_node"] and options["--start-method"]
    assert options["-t"] and options["--tee"] and not options["-m"] and not options["--standalone"]
    assert len(options) > 50


def test_every_option_the_real_torchrun_lists_is_skipped_with_its_value():
    options = real_options()
    flags = {name for name, takes in options.items() if not takes} - {"-h", "--help"}
    assert flags == TORCHRUN_FLAGS  # fleet's table is the real torchrun's, no more, no less
    for name, takes in options.items():
        if name in ("-h", "--help"):
            continue
        cmd = ["torchrun", name, *(["v"] if takes else []), "train.py", "--lr", "1"]
        assert script_index(cmd, "torchrun") == (3 if takes else 2), name
        if takes:
            assert script_index(["torchrun", f"{name}=v", "train.py"], "torchrun") == 2, name


def test_run_path_is_refused_before_anything_starts():
    # torchrun's --run-path "takes precedence over --no-python": the agent would be run by runpy
    said = command_problem("torchrun", ["torchrun", "--run-path", "--nproc-per-node", "2", "/abs/train.py"])
    assert said and "--run-path" in said and "leave --run-path out" in said
    assert command_problem("torchrun", ["torchrun", "--nproc-per-node", "2", "train.py"]) is None


def test_the_stand_in_refuses_an_option_the_real_one_does_not_list(tmp_path):
    done = subprocess.run([sys.executable, str(STANDIN), "--nprocs", "2", "x.py"], capture_output=True, text=True)
    assert done.returncode == 2 and "unrecognized arguments: --nprocs" in done.stderr


def test_the_recording_is_of_workers_torchrun_started_itself():
    """What the stand-in and fleet are held to, checked on the recording itself."""
    for case in CASES:
        cmd, output = recorded_command(case), (WORKERS / case / "output.txt").read_text()
        workers = recorded(case)
        assert [w["added_or_changed"]["RANK"] for w in workers] == ["0", "1"], case
        assert all(w["argv"][0].endswith("/rec.py") and w["argv"][2].endswith(case) for w in workers), case
        assert "(exit status 0 " in output, case
        if case != "module":  # torchrun's own pid is in its log lines; its workers are its children
            assert {f" {w['ppid']} torch/distributed/run.py" in output for w in workers} == {True}, case
    nopython, module = recorded_command("nopython"), recorded_command("module")
    assert recorded("nopython")[0]["executable"] == nopython[nopython.index("--no-python") + 1]
    assert recorded("module")[0]["executable"] == module[0]  # python -m torch.distributed.run's python
    # plain torchrun: its own interpreter (its #! line, beside it), not PATH's python3
    standalone = recorded("standalone")[0]["executable"]
    assert os.path.dirname(standalone) == os.path.dirname(recorded_command("standalone")[0])


def _run_as_recorded(case: str, tmp_path: Path) -> tuple[list[dict], int, str]:
    """The recorded command, the stand-in in place of the real torchrun, the H200's recorder."""
    torchrun, site = entry_points(tmp_path)
    (tmp_path / "rec.py").write_text(REC_PY)
    out = tmp_path / "out" / case
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHON_EXEC", "_")}
    env["PYTHONPATH"] = str(site)
    (tmp_path / "base.env").write_text("".join(f"{k}={v}\0" for k, v in env.items()))
    words = {"rec.py": str(tmp_path / "rec.py"), "base.env": str(tmp_path / "base.env"), f"torchrun-{case}": str(out),
             "torchrun": str(torchrun), "python3": sys.executable}
    cmd = [words.get(os.path.basename(w), w) for w in recorded_command(case)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, said
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)], proc.pid, cmd


@pytest.mark.parametrize("case", CASES)
def test_the_stand_ins_workers_get_what_the_real_torchruns_got(case, tmp_path):
    workers, launcher_pid, cmd = _run_as_recorded(case, tmp_path)
    for rank, (real, double) in enumerate(zip(recorded(case), workers)):
        want, got = real["added_or_changed"], double["added_or_changed"]
        assert set(got) - SHELLS_OWN == set(want) - SHELLS_OWN, (case, rank)
        for name in sorted(set(want) - SHELLS_OWN - FRESH):
            assert got[name] == want[name], (case, rank, name)
        assert got["MASTER_PORT"].isdigit() and got["MASTER_PORT"] == workers[0]["added_or_changed"]["MASTER_PORT"]
        shape = r"none" if want["TORCHELASTIC_RUN_ID"] == "none" else r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
        assert re.fullmatch(shape, got["TORCHELASTIC_RUN_ID"]), (case, got["TORCHELASTIC_RUN_ID"])
        assert got["TORCHELASTIC_ERROR_FILE"].endswith(f"/attempt_0/{rank}/error.json")
        assert double["ppid"] == launcher_pid  # the launcher's own children, as the real workers were
        assert double["argv"][0] == cmd[cmd.index(next(w for w in cmd if w.endswith("rec.py")))]
    # the worker's python: the program after --no-python, else the launcher's own interpreter
    assert workers[0]["executable"] == sys.executable


@pytest.mark.parametrize("case", CASES)
def test_fleet_names_each_recorded_worker_by_the_rank_torchrun_gave_it(case):
    """Only what the real torchrun put in each worker's environment: no Slurm, no fleet variable."""
    for real in recorded(case):
        given = real["added_or_changed"]
        rank = task.rank_of(given, "torchrun")
        assert rank is not None and str(rank) == given["RANK"] and rank < int(given["WORLD_SIZE"])
        whose = task.whose(given, "torchrun", rank, "h200", [])
        assert whose["local_rank"] == int(given["LOCAL_RANK"]) and whose["launcher"] == "torchrun"
    assert sorted(task.rank_of(r["added_or_changed"], "torchrun") for r in recorded(case)) == [0, 1]


def _run_fleets_line(command: list[str], tmp_path: Path, path: str) -> list[dict]:
    """fleet's own injection run by bash as the batch script runs it (less srun); the 'agent' here
    records what each worker was given."""
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    out = tmp_path / "out"
    out.mkdir()
    la = launch("torchrun", command, [sys.executable, str(recorder), str(out)], "/r", None)
    script = "\n".join(["set -u", "COMMAND=(" + " ".join(shlex.quote(w) for w in command) + ")", *la.setup,
                        '"${LAUNCH[@]}"'])
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "PYTHON_EXEC")}
    env.update(PATH=path, PYTHONPATH=str(tmp_path / "site"))
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]


def test_fleets_launch_line_run_by_the_stand_in_gives_each_worker_torchruns_variables(tmp_path):
    """Options in both spellings and with values; torchrun found on PATH, as an entry point whose
    #! line names a python that PATH's python3 is not: the worker runs under torchrun's python."""
    torchrun, _ = entry_points(tmp_path)
    command = ["torchrun", "--nproc_per_node=2", "--rdzv-backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0",
               "--max-restarts", "0", "--start-method", "spawn", "--role", "trainer", "--local-ranks-filter", "0",
               "train.py", "--lr", "1"]
    other = tmp_path / "other"  # a python3 first on PATH that is not torchrun's
    other.mkdir()
    (other / "python3").symlink_to("/bin/false")
    seen = _run_fleets_line(command, tmp_path, f"{other}:{torchrun.parent}:{os.environ['PATH']}")
    names = set(recorded("nopython")[0]["added_or_changed"]) - SHELLS_OWN  # fleet adds --no-python
    for rank, given in enumerate(seen):
        assert given["argv"][2:] == [sys.executable, "train.py", "--lr", "1"]
        env = given["env"]
        assert names <= set(env), names - set(env)
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["ROLE_NAME"]) == (str(rank), str(rank), "2",
                                                                                          "trainer")
        assert env["OMP_NUM_THREADS"] == "1"  # torch.distributed.run's, for more than one worker a node
        assert task.rank_of(env, "torchrun") == rank
        assert task.whose(env, "torchrun", rank, "node1", [])["local_rank"] == rank


def test_python_m_torch_distributed_run_keeps_its_own_m_and_its_python(tmp_path):
    """The recorded `python3 -m torch.distributed.run ...`: python's -m is not torchrun's -m, and the
    workers run under that python (the recording's `executable`), with the script's own -m moved."""
    entry_points(tmp_path)
    for script, moved in ((["train.py", "--lr", "1"], []), (["-m", "pkg.train", "--x"], ["-m"])):
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", *script]
        here = tmp_path / script[0].strip("-")
        here.mkdir()
        (here / "site").symlink_to(tmp_path / "site")
        seen = _run_fleets_line(command, here, os.environ["PATH"])
        for rank, given in enumerate(seen):
            assert given["argv"][2:] == [sys.executable, *moved, *[w for w in script if w != "-m"]]
            assert task.rank_of(given["env"], "torchrun") == rank


@pytest.mark.parametrize("flag", ["--virtual-local-rank", "--virtual_local_rank"])
def test_virtual_local_rank_gives_each_worker_local_rank_zero_and_its_own_gpu(tmp_path, flag):
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    done = subprocess.run([sys.executable, str(STANDIN), "--nproc-per-node", "2", flag, str(recorder), str(tmp_path)],
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "3,5"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text())["env"] for r in (0, 1)]
    assert [(e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in seen] == [("0", "3"), ("0", "5")]


@pytest.mark.parametrize("shebang, python_exec, want", [
    ("#!/opt/torch/.venv/bin/python", None, "/opt/torch/.venv/bin/python"),
    ("#!/usr/bin/env python3.12", None, "python3.12"),
    ("#!/bin/sh", None, "python3"),  # not read: PATH's python3, as before
    ("#!/opt/torch/.venv/bin/python", "/opt/other/bin/python", "/opt/other/bin/python"),
])
def test_the_workers_python_is_the_one_torchrun_would_run(tmp_path, shebang, python_exec, want):
    """torch/distributed/run.py runs PYTHON_EXEC, else its own sys.executable: the #! line's."""
    (tmp_path / "torchrun").write_text(shebang + "\n")
    (tmp_path / "torchrun").chmod(0o755)
    command = ["torchrun", "--nproc-per-node", "2", "train.py"]
    la = launch("torchrun", command, ["agent"], "/r", None)
    script = "\n".join(["set -u", "COMMAND=(" + shlex.join(command) + ")", *la.setup, 'printf "%s\\0" "${LAUNCH[@]}"'])
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_EXEC"}
    env.update(PATH=f"{tmp_path}:{os.environ['PATH']}", **({"PYTHON_EXEC": python_exec} if python_exec else {}))
    words = subprocess.run(["bash", "-c", script], env=env, capture_output=True, check=True).stdout.split(b"\0")
    assert [w.decode() for w in words[:-1]] == ["torchrun", "--nproc-per-node", "2", "--no-python", "agent", want,
                                                "train.py"]
