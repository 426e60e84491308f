"""torchrun as its documentation and its source have it: every option the real torchrun's --help
lists (recorded on an H200 test machine: tests/fixtures/launchers-h200/torchrun-help.txt) is
skipped with its value before the script, the stand-in takes exactly those, and its workers get
the variables torch's elastic agent sets (tests/fixtures/torchrun-source/worker-env.json)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.agent import task
from fleet.slurm.launchers import TORCHRUN_FLAGS, command_problem, launch, script_index

FIXTURES = Path(__file__).parent / "fixtures"
STANDIN = Path(__file__).parent / "standins" / "torchrun"
WORKER_ENV = json.loads((FIXTURES / "torchrun-source" / "worker-env.json").read_text())

RECORD = """
import json, os, sys
with open(os.path.join(sys.argv[1], "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ)}, f)
"""


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


def test_fleets_launch_line_run_by_the_stand_in_gives_each_worker_torchruns_variables(tmp_path):
    """fleet's own injection (--no-python, the agent's words, python3 on the script), given options
    in both spellings and with values; the 'agent' here records what each worker was given."""
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    out = tmp_path / "out"
    out.mkdir()
    command = ["torchrun", "--nproc_per_node=2", "--rdzv-backend", "c10d", "--rdzv_endpoint", "127.0.0.1:0",
               "--max-restarts", "0", "--start-method", "spawn", "--role", "trainer", "--local-ranks-filter", "0",
               "train.py", "--lr", "1"]
    la = launch("torchrun", command, [sys.executable, str(recorder), str(out)], "/r", None)
    script = "\n".join(["COMMAND=(" + " ".join(f"'{w}'" for w in command) + ")", *la.setup,
                        f'"{STANDIN}" "${{LAUNCH[@]:1}}"'])
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        given = json.loads((out / f"rank{rank}.json").read_text())
        assert given["argv"][1:] == [str(out), "python3", "train.py", "--lr", "1"]
        env = given["env"]
        assert set(WORKER_ENV["variables"]) <= set(env), set(WORKER_ENV["variables"]) - set(env)
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["ROLE_NAME"]) == (str(rank), str(rank), "2",
                                                                                          "trainer")
        assert env["OMP_NUM_THREADS"] == "1"  # torch.distributed.run's, for more than one worker a node
        assert task.rank_of(env, "torchrun") == rank
        assert task.whose(env, "torchrun", rank, "node1", [])["local_rank"] == rank


@pytest.mark.parametrize("flag", ["--virtual-local-rank", "--virtual_local_rank"])
def test_virtual_local_rank_gives_each_worker_local_rank_zero_and_its_own_gpu(tmp_path, flag):
    recorder = tmp_path / "record.py"
    recorder.write_text(RECORD)
    done = subprocess.run([sys.executable, str(STANDIN), "--nproc-per-node", "2", flag, str(recorder), str(tmp_path)],
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": "3,5"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text())["env"] for r in (0, 1)]
    assert [(e["LOCAL_RANK"], e["CUDA_VISIBLE_DEVICES"]) for e in seen] == [("0", "3"), ("0", "5")]
