"""The smaller rules of problems 4 and 5, each by table, and the planner applying them as the
verdicts promise (no rule of its own)."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from fleet import policy
from fleet.plan import Command, LabPart, Plan, ProfileRequest, RankPart, plan
from fleet.policy import OK, REFUSED, Request

from tests.harness.node_states import BASE, TENANT, proc, verdicts
from tests.harness.node_states import state as bare_state


def state(**changes):
    """A node state as the agent writes it, GPUs with their UUIDs (the planner pins and locks by them)."""
    return bare_state(gpus__0__uuid="GPU-a", gpus__1__uuid="GPU-b", **changes)

USES_COUNTERS = [("nsys", False, False), ("nsys", True, True), ("ncu", False, True), ("ncu", True, True)]


@pytest.mark.parametrize("tool,gpu_metrics,expected", USES_COUNTERS)
def test_uses_counters(tool, gpu_metrics, expected):
    assert policy.uses_counters(tool, gpu_metrics) is expected
    assert ProfileRequest(tool=tool, command=("x",), run_id="r", gpu_metrics=gpu_metrics).uses_counters is expected


# (asked on the command line, uses counters) -> the job takes its nodes whole
EXCLUSIVE = [(None, False, False), (None, True, True), (True, False, True), (False, True, False)]


@pytest.mark.parametrize("asked,counters,expected", EXCLUSIVE)
def test_exclusive_node(asked, counters, expected):
    assert policy.exclusive_node(asked, counters) is expected


def test_held_sysctls_are_for_nsys_sampling_only():
    assert policy.held_sysctls("nsys") == [policy.PARANOID_SYSCTL] and policy.held_sysctls("ncu") == []


# (in a Slurm job, GPUs chosen, counters) -> (GPU locks, last-moment check, CUDA_VISIBLE_DEVICES)
GUARDS = [
    (None, None, False, (False, False, False)),
    (None, (0,), False, (False, False, True)),
    (None, (0,), True, (True, True, True)),
    (None, None, True, (True, True, False)),
    ("41", (0,), True, (False, False, False)),  # the allocation is the lock; Slurm chose the GPUs
    ("41", None, False, (False, False, False)),
]


@pytest.mark.parametrize("job,gpus,counters,expected", GUARDS)
def test_guards(job, gpus, counters, expected):
    g = policy.guards(Request(gpus=gpus, job=job), counters)
    assert (g.gpu_locks, g.recheck, g.pin_gpus) == expected


# (prolog verdict) -> tenants it means, for job 41
WHOLE = {"job": "41", "nvml": True, "tenants": []}
PROLOG = [
    (None, []),                                                   # no prolog installed here
    (WHOLE, []),
    (dict(WHOLE, tenants=["GPU 0: pid 7 (bob) belongs to another user"]), ["GPU 0: pid 7 (bob)"]),
    ({"error": "/run/fleet/jobs/41/verdict.json: Permission denied"}, ["Permission denied"]),
    ({"error": "the prolog left no verdict for this job"}, ["left no verdict"]),
    (dict(WHOLE, tenants="garbage"), ["no tenants list"]),
    ({"job": "41", "nvml": True}, ["no tenants list"]),
    ({}, ["not job 41's"]),
    (dict(WHOLE, job="40"), ["job 40's, not job 41's"]),          # another job's verdict
    (dict(WHOLE, nvml=False), ["root could not see the GPUs"]),    # it saw nothing: says nothing
]


@pytest.mark.parametrize("verdict,expected", PROLOG)
def test_prolog_verdict_fails_closed(verdict, expected):
    """It counted as "no tenants" when it saw no GPU, named no list, or was another job's."""
    found = policy.prolog_tenants(None if verdict is None else policy.PrologVerdict.read(verdict), "41")
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), found


def test_dcgm_inside_a_job_is_the_prologs_to_pause():
    """A rank's plan paused DCGM itself, as the job's user: every rank failed with "needs root"."""
    s = state(gpus__0__architecture=8, dcgm__hostengine=[99])
    req = ProfileRequest(tool="ncu", command=("x",), run_id="r", pause_dcgm=True, rank=RankPart(job="41", gpus=(0,)))
    refused = plan("rank0", replace(s, prolog_verdict=policy.PrologVerdict.read(WHOLE)), req)
    assert refused.status == REFUSED and "prolog did not pause" in refused.reasons[-1]
    paused = plan("rank0", replace(s, prolog_verdict=policy.PrologVerdict.read(dict(WHOLE, dcgm="paused"))), req)
    assert paused.status == OK and paused.pause_dcgm is False and paused.sysctls == {}


def test_a_prolog_verdict_that_cannot_be_read_refuses_counters_not_trace():
    s = state(prolog_verdict={"error": "verdict.json: Permission denied"})  # a job's rank
    v = verdicts(s, Request(job="41"))
    assert v["ncu"].status == REFUSED and "prolog" in v["ncu"].reasons[0]
    assert v["nsys-trace"].status == OK


# (tool, counters, sampling wanted, seccomp profile) -> (SYS_ADMIN, seccomp used, sampling given up)
DOCKER = [
    ("nsys", False, False, None, (False, None, False)),
    ("nsys", False, True, None, (False, None, True)),
    ("nsys", False, True, "/p.json", (False, "/p.json", False)),
    ("nsys", True, True, "/p.json", (True, "/p.json", False)),
    ("ncu", True, False, "/p.json", (True, None, False)),
]


@pytest.mark.parametrize("tool,counters,sampling,seccomp,expected", DOCKER)
def test_docker_privileges(tool, counters, sampling, seccomp, expected):
    d = policy.docker_privileges(tool, counters, sampling, seccomp)
    assert (d.cap_sys_admin, d.seccomp_profile, bool(d.given_up)) == expected


HOSTENGINE, EXPORTER = {"dcgm__hostengine": [99]}, {"dcgm__exporter": [98], "dcgm__listening": [{"port": 9400}]}
DCGM = [  # (DCGM here, GPU 0's architecture, --pause-dcgm, tool) -> ncu status, fleet pauses DCGM
    ({}, 8, False, "ncu", OK, False),
    (HOSTENGINE, 9, True, "ncu", OK, False),           # Hopper shares the counters: nothing to pause
    (HOSTENGINE, 8, False, "ncu", REFUSED, False),
    (HOSTENGINE, 8, True, "ncu", OK, True),
    (HOSTENGINE, 8, True, "nsys", OK, False),          # a trace needs no counters
    (EXPORTER, 8, True, "ncu", REFUSED, False),        # an embedded engine cannot be paused from outside
    (EXPORTER, 8, False, "ncu", REFUSED, False),
    ({"dcgm__listening": [{"port": 5555}]}, 7, True, "ncu", OK, True),
]


@pytest.mark.parametrize("dcgm,arch,asked,tool,status,paused", DCGM)
def test_dcgm_pause_is_promised_and_planned_alike(dcgm, arch, asked, tool, status, paused):
    """Before, the verdict promised a pause beside dcgm-exporter alone that the plan never made."""
    s = state(gpus__0__architecture=arch, **dcgm)
    req = ProfileRequest(tool=tool, command=("x",), run_id="r", pause_dcgm=asked, lab=LabPart(gpus=(0,)))
    v = verdicts(s, Request(gpus=(0,), pause_dcgm=asked))["ncu"]
    p = plan("h", s, req)
    assert v.status == status and p.pause_dcgm is paused
    if tool == "ncu":
        assert p.status == status and any("pause DCGM" in r for r in v.reasons) == paused


def test_every_dcgm_state_the_verdict_promises_a_pause_for_is_planned_with_one():
    for dcgm, arch, asked in itertools.product([{}, HOSTENGINE, EXPORTER, {**HOSTENGINE, **EXPORTER}],
                                               [7, 8, 9], [False, True]):
        s = state(gpus__0__architecture=arch, **dcgm)
        v = verdicts(s, Request(gpus=(0,), pause_dcgm=asked))["ncu"]
        p = plan("h", s, ProfileRequest(tool="ncu", command=("x",), run_id="r", pause_dcgm=asked, lab=LabPart(gpus=(0,))))
        assert any("pause DCGM" in r for r in v.reasons) == p.pause_dcgm, (dcgm, arch, asked)


def test_a_job_plan_is_made_with_the_job_rules_not_patched_after():
    s = state(gpus__0__processes=[dict(TENANT, foreign=False, user="alice", slurm_job="41")])
    req = ProfileRequest(tool="ncu", command=("x",), run_id="r", rank=RankPart(job="41", gpus=(0,)))
    p = plan("rank0", s, req)
    assert p.status == OK and p.gpu_locks == () and p.recheck is None and "CUDA_VISIBLE_DEVICES" not in p.env
    lab = plan("h", state(), ProfileRequest(tool="ncu", command=("x",), run_id="r", lab=LabPart(gpus=(0,))))
    assert lab.gpu_locks and lab.recheck and lab.env["CUDA_VISIBLE_DEVICES"]


def test_plan_and_request_round_trip_through_json():
    s = state(perf_event_paranoid=4)
    req = ProfileRequest(tool="nsys", command=("python3", "a b.py"), run_id="r", gpu_metrics=False,
                         profiler_args=("--trace=cuda",), lab=LabPart(gpus=(1,), timeout=5.0))
    assert ProfileRequest.from_json(req.to_json()) == req
    p = plan("h", s, req)
    assert Plan.from_json(p.to_json()) == p and p.to_json()["argv"] == list(p.command.argv())
    refused = plan("h", state(gpus__0__processes=[TENANT]), ProfileRequest(tool="ncu", command=("x",), run_id="r"))
    assert refused.status == REFUSED and Plan.from_json(refused.to_json()) == refused


def test_the_command_renders_in_one_order():
    c = Command(("nsys", "profile"), ("--output=o",), ("--trace=cuda",), ("app", "--", "x"), ("docker", "run", "img"))
    assert c.argv() == ("docker", "run", "img", "nsys", "profile", "--output=o", "--trace=cuda", "--", "app", "--", "x")
    assert BASE["tools"]["nsys"]["path"] in plan("h", state(), ProfileRequest(tool="nsys", command=("x",),
                                                                                run_id="r")).command.profiler


def _nsys_plan(*user_flags, paranoid=4, tool="nsys"):
    return plan("h", state(perf_event_paranoid=paranoid),
                ProfileRequest(tool=tool, command=("app",), run_id="r", profiler_args=tuple(user_flags)))


def test_the_users_sampling_choice_wins_and_no_option_is_given_twice():
    """nsys exits 1 on an option given twice: fleet's --sample=none beside the user's --sample."""
    for user in (("--sample=process-tree",), ("--sample", "process-tree"), ("-s", "cpu"), ("-scpu",)):
        argv = _nsys_plan(*user).command.argv()
        options = [w.split("=")[0] for w in argv[:argv.index("--")]]
        assert options.count("--sample") + options.count("-s") + sum(o.startswith("-s") and len(o) > 2
                                                                     for o in options) == 1, argv
        assert "--cpuctxsw=none" in argv  # what the user did not choose stays
    given_up = _nsys_plan("--sample=process-tree", paranoid=2).without_sampling("no sudo").command.argv()
    assert "--sample=none" not in given_up and "--cpuctxsw=none" in given_up


def test_a_timeout_is_nsys_own_duration_unless_the_user_gave_one():
    """A signal lost every kernel on an H200 (tests/fixtures/tools-2025.3-h200); --duration kept them."""
    def argv(*user, timeout=2.5, tool="nsys"):
        return plan("h", state(), ProfileRequest(tool=tool, command=("app",), run_id="r", lab=LabPart(timeout=timeout),
                                                 profiler_args=tuple(user))).command.argv()
    assert "--duration=3" in argv() and "--duration=7" in argv(timeout=7)
    assert not [w for w in argv(timeout=None) if w.startswith("--duration")]
    for user in (("--duration=9",), ("--duration", "9"), ("-d", "9"), ("-d9",)):  # --dur: refused, two match
        words = argv(*user)
        assert "--duration=3" not in words and words[words.index("--") - len(user):words.index("--")] == user
    assert not [w for w in argv(tool="ncu") if w.startswith("--duration")]  # ncu: SIGINT at the timeout
    for moved in (("--delay=5",), ("-y", "5"), ("-c", "cudaProfilerApi"), ("--kill", "none")):
        assert not [w for w in argv(*moved) if w.startswith("--duration")], moved  # the agent's signal then
    assert "--duration=31535820" in argv(timeout=365 * 86400 - 180)  # a Slurm job without a limit: a year
    for bad in (0, -5, float("inf"), float("nan"), 1e300):
        p = plan("h", state(), ProfileRequest(tool="nsys", command=("app",), run_id="r", lab=LabPart(timeout=bad)))
        assert p.status == REFUSED and "--timeout" in p.reasons[0], bad


def test_ncus_clock_control_is_the_users_when_given():
    for user in (("--clock-control", "none"), ("--clock-c", "none"), ("--clock-control=none",)):
        argv = _nsys_plan(*user, tool="ncu", paranoid=2).command.argv()
        assert sum(w.startswith("--clock-c") for w in argv) == 1 and "base" not in argv, argv
    assert "--cpuctxsw=none" not in _nsys_plan("--cpuctx=process-tree").command.argv()


OWNED_BY_FLEET = [("nsys", ("-o", "mine")), ("nsys", ("--output=mine",)), ("nsys", ("-omine",)),
                  ("ncu", ("-o", "mine")), ("ncu", ("--export", "mine")),
                  ("nsys", ("--gpu-metrics-devices=all",)), ("nsys", ("--gpu-metrics-device", "0")),
                  # unique prefixes: nsys and ncu 2025.3 take --out for --output and --exp for --export
                  ("nsys", ("--out=/tmp/x",)), ("ncu", ("--exp", "mine")), ("nsys", ("--gpu-metrics-dev=all",))]


@pytest.mark.parametrize("tool,user", OWNED_BY_FLEET)
def test_flags_that_break_fleets_contract_are_refused_before_anything_runs(tool, user):
    """-X -o mine was accepted and the report never collected; -X --gpu-metrics-devices=all
    programmed the counters of GPUs nobody had checked for tenants."""
    from fleet.userflags import profiler_args_error

    assert profiler_args_error(tool, user)
    p = _nsys_plan(*user, tool=tool, paranoid=2)
    assert p.status == REFUSED and p.reasons[0].startswith("-X")
    assert profiler_args_error(tool, ("--trace=cuda,nvtx", "--stats=false")) is None


def test_the_command_line_refuses_them_in_one_line_touching_nothing(tmp_path):
    from tests.conftest import run_fleet

    marker = tmp_path / "ran"
    out = run_fleet("profile", "--store", str(tmp_path / "store"), "--hosts", "localhost", "-X", "-o", "-X", "mine",
                    "--", "touch", str(marker))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "fleet's" in out.stderr
    assert not marker.exists() and not (tmp_path / "store").exists()


def _gpus(*minors):
    return [{"index": i, "minor": m} for i, m in enumerate(minors)]


# (Slurm's GPU ids, the GPUs NVML shows as (index, minor)) -> NVML indices checked (None: all)
JOB_GPUS = [
    ((2, 3), _gpus(0, 1, 2, 3), (2, 3)),          # the whole node visible: ids are the minors
    ((2, 3), _gpus(2, 3), (0, 1)),                # constrained devices: NVML counts from 0
    ((1,), _gpus(3, 1, 0, 2), (1,)),              # NVML's order is not the devices' order
    ((5,), _gpus(0, 1), None),                    # no such device: every visible GPU is checked
    ((0,), [], None),                             # no GPU seen at all: a trace can still run
    (None, _gpus(0, 1), None),                    # no GRES
    ((0,), [{"index": 0, "minor": None}], None),  # minors unknown
]


@pytest.mark.parametrize("ids,gpus,expected", JOB_GPUS)
def test_a_jobs_gpus_are_found_by_device_not_by_index(ids, gpus, expected):
    """Slurm's ids were taken as NVML indices: in a job with constrained devices the check looked
    at another GPU than the job's, or refused every rank ("no GPU [0]") where NVML saw none."""
    assert policy.job_gpu_indices(ids, tuple(policy.Gpu.read(g) for g in gpus)) == expected


def test_a_rank_whose_nvml_sees_no_gpu_still_gets_a_trace():
    s = state(gpus=[], nvml={"available": False, "error": "no device in this job's cgroup"})
    req = ProfileRequest(tool="nsys", command=("x",), run_id="r",
                         rank=RankPart(job="41", gpus=policy.job_gpu_indices((0,), ())))
    p = plan("rank0", s, req)
    assert p.status == OK and any(g.startswith("GPU activity") for g in p.given_up)


# --gpu free: the GPUs nobody else may be using, by the rule that refuses ncu there, least busy first.
FREE = [
    ({}, [0, 1]),
    ({"gpus__0__processes": [TENANT]}, [1]),
    ({"gpus__1__memory_used_by_processes": 3 * 2**30}, [0]),  # held by processes the lists do not show
    ({"gpus__0__mig_mode": {"current": 1, "pending": 1}}, [1]),
    ({"mps__control_daemon": [77]}, []),                    # MPS: every GPU may be shared
    ({"gpus__0__utilization": {"gpu": 60}}, [1, 0]),        # both free: the idle one first
]


@pytest.mark.parametrize("changes,expected", FREE)
def test_free_gpus_follow_the_counters_refusal_and_put_the_least_busy_first(changes, expected):
    s = state(**changes)
    assert [g.index for g in policy.free_gpus(s, Request())] == expected
    for g in s.gpus:  # free exactly where ncu would be allowed on that GPU alone
        ncu = verdicts(s, Request(gpus=(g.index,)))["ncu"].status
        assert (ncu == OK) == (g.index in expected), (g.index, ncu)
    assert len(policy.not_free(s, Request())) == len(s.gpus) - len(expected)


def test_your_own_process_makes_a_gpu_not_free_unless_allowed():
    s = state(gpus__0__processes=[proc(5, user="alice", uid=1000)])
    assert [g.index for g in policy.free_gpus(s, Request())] == [1]
    assert policy.not_free(s, Request())[0].startswith("GPU 0: tenant: GPU 0: pid 5 (alice")
    assert [g.index for g in policy.free_gpus(s, Request(allow_own=True))] == [0, 1]
