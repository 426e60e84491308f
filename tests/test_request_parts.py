"""A request in parts: what every node needs travels to each Slurm rank; the lab servers' choices
and what a rank fills in from its job never do, and a run's manifest records it all, flat."""

from __future__ import annotations

import json
import shlex
from dataclasses import fields, replace

from fleet import policy
from fleet.plan import RECORD, LabPart, ProfileRequest, RankPart, plan
from fleet.request import WINDOW_FIELDS
from fleet.slurm import options
from fleet.slurm.script import JobFiles, JobSpec, render

LAB = LabPart(gpus=(1,), timeout=30.0, lock_wait=5.0, docker_image="nvcr.io/nvidia/pytorch:25.01-py3")
FILES = JobFiles("/scratch/ana/fleet-reports/r", "/scratch/ana/fleet-reports", "/usr/bin/python3",
                 {"nsys": "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys"}, nonce="0" * 32)


def rank_request(script: str) -> dict:
    """The request in the agent's argument of the batch script's FLEET_TASK array, as bash reads it."""
    [line] = [l for l in script.splitlines() if l.startswith("FLEET_TASK=(")]
    return json.loads(shlex.split(line[len("FLEET_TASK=("):-1])[-1])["request"]


def test_what_a_rank_receives_holds_no_lab_choice_and_nothing_the_rank_fills():
    req = ProfileRequest(tool="ncu", command=("python3", "train.py"), run_id="r", allow_own=True,
                         profiler_args=("--set=full",), lab=LAB)
    sent = rank_request(render(req, options.checked(JobSpec(partition="gpu", nodes=2), req), FILES))
    own = {f.name for f in fields(ProfileRequest)} - {"lab", "rank"}
    assert set(sent) == own - set(WINDOW_FIELDS)  # a window the workload opens travels only where asked
    windowed = replace(req, tool="nsys", profiler_args=(), nvtx_window="step", repeat=2)
    got = rank_request(render(windowed, options.checked(JobSpec(partition="gpu", nodes=2), windowed), FILES))
    assert set(got) == own - {"cuda_profiler_window"} and (got["nvtx_window"], got["repeat"]) == ("step", 2)
    assert ProfileRequest.from_json(got) == replace(windowed, lab=None, command=())  # the command goes in COMMAND
    assert not set(sent) & ({f.name for f in fields(LabPart)} | {f.name for f in fields(RankPart)})
    assert sent["allow_own"] is True and sent["profiler_args"] == ["--set=full"] and sent["command"] == []
    got = ProfileRequest.from_json(sent)
    assert got.lab is None and got.rank is None and got.gpus is None and got.docker_image is None


def test_a_rank_reads_only_what_every_node_needs():
    """A document with the rank's own keys, lab keys at their defaults and unknown ones: the rank's
    fields come from its job alone."""
    doc = dict(ProfileRequest(tool="nsys", command=("x",), run_id="r").to_json(), job="999",
               output_name="../elsewhere", surprise=1)
    got = ProfileRequest.from_json(doc)
    assert got == ProfileRequest(tool="nsys", command=("x",), run_id="r") and got.job is None


def test_the_rank_part_is_what_the_plan_uses_on_the_node():
    req = ProfileRequest(tool="nsys", command=("x",), run_id="r",
                         rank=RankPart(job="41", gpus=(0,), output_name="n1/rank3", timeout=60.0))
    state = {"euid": 0, "perf_event_paranoid": 2, "nvml": {"available": True, "error": None},
             "report_dir": {"path": "/var/tmp/fleet", "writable": True},
             "tools": {"nsys": {"path": "/usr/bin/nsys", "found_by": "PATH"}, "ncu": None},
             "gpus": [{"index": 0, "uuid": "GPU-a", "processes": []}, {"index": 1, "uuid": "GPU-b", "processes": []}]}
    p = plan("rank3", policy.NodeState.read(state), req)
    assert p.output == "/var/tmp/fleet/r/n1/rank3" and p.watch.job == "41" and p.watch.gpus == (0,)
    assert "--duration=60" in p.command.fleet_flags and p.gpu_locks == () and p.lock_wait == 0.0


def test_the_manifest_records_the_request_flat_as_before():
    """Every key of the record, in its order, whichever part gave the value; read back it is the same request."""
    req = ProfileRequest(tool="nsys", command=("a b",), run_id="r", gpu_metrics=True, lab=LAB)
    doc = req.to_json()
    assert tuple(doc) == RECORD == ("tool", "command", "run_id", "gpus", "gpu_metrics", "allow_own", "pause_dcgm",
                                    "profiler_args", "timeout", "lock_wait", "clock_control", "output_name", "job",
                                    "docker_image", "launcher", "starts", "program", "ranks", "window", "detach",
                                        "nvtx_window", "cuda_profiler_window", "repeat")
    assert (doc["gpus"], doc["timeout"], doc["lock_wait"], doc["docker_image"], doc["job"]) == \
        ((1,), 30.0, 5.0, LAB.docker_image, None)
    assert ProfileRequest.from_json(json.loads(json.dumps(doc))) == req
    plain = ProfileRequest(tool="nsys", command=("x",), run_id="r")
    assert ProfileRequest.from_json(plain.to_json()) == plain and plain.to_json()["lock_wait"] == 0.0
