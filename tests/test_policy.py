"""The policy is a pure function: each rule, by table, on synthetic node states."""

from __future__ import annotations

import copy

import pytest

from fleet import policy
from fleet.policy import DEGRADED, OK, REFUSED, Request
from tests.harness.node_states import TENANT, proc, state, verdicts

OWN = proc(777, user="alice", uid=1000, foreign=False)
GHOST = {"pid": 99999, "user": None, "uid": None, "foreign": True, "name": None, "used_memory": None,
         "kinds": ["compute"], "why": "pid not visible from the agent"}
MPS_SERVER = proc(555, user="root", uid=0, foreign=True, name="nvidia-cuda-mps-server")

# (case, state changes, request, expected ncu status, expected text in the reasons)
COUNTER_RULES = [
    ("alone on the GPU", {}, Request(), OK, "no other process"),
    ("another user's process", {"gpus__0__processes": [TENANT]}, Request(), REFUSED, "pid 4242 (bob"),
    ("unresolvable pid", {"gpus__0__processes": [GHOST]}, Request(), REFUSED, "pid 99999 (unknown user"),
    ("own process counts by default", {"gpus__0__processes": [OWN]}, Request(), REFUSED, "--allow-own"),
    ("own process with --allow-own", {"gpus__0__processes": [OWN]}, Request(allow_own=True), OK, "no other"),
    ("--allow-own never admits others", {"gpus__0__processes": [OWN, TENANT]}, Request(allow_own=True), REFUSED,
     "bob"),
    ("MPS server on the GPU", {"gpus__0__processes": [MPS_SERVER], "mps__servers": [555]}, Request(allow_own=True),
     REFUSED, "MPS server"),
    ("MPS control daemon on the node", {"mps__control_daemon": [12]}, Request(), REFUSED, "MPS control daemon"),
    ("MIG enabled", {"gpus__0__mig_mode": {"current": 1, "pending": 1}}, Request(gpus=(0,)), REFUSED, "MIG mode"),
    ("tenant on another GPU only", {"gpus__1__processes": [TENANT]}, Request(gpus=(0,)), OK, "no other"),
    ("tenant on the chosen GPU", {"gpus__1__processes": [TENANT]}, Request(gpus=(1,)), REFUSED, "GPU 1: pid 4242"),
    ("counters admin-only, not root", {"nvidia__profiling_admin_only": 1}, Request(), REFUSED, "RmProfilingAdminOnly=1"),
    ("counters unknown, not root", {"nvidia__profiling_admin_only": None}, Request(), REFUSED, "cannot read"),
    ("counters admin-only, root", {"nvidia__profiling_admin_only": 1, "euid": 0}, Request(), OK, "root"),
    ("counters admin-only, CAP_SYS_ADMIN", {"nvidia__profiling_admin_only": 1,
                                            "capabilities__sys_admin": True}, Request(), OK, "CAP_SYS_ADMIN"),
    ("DCGM on Ampere", {"dcgm__hostengine": [99], "gpus__0__architecture": 8}, Request(gpus=(0,)), REFUSED,
     "predate Hopper"),
    ("DCGM on Ampere, --pause-dcgm", {"dcgm__hostengine": [99], "gpus__0__architecture": 8},
     Request(gpus=(0,), pause_dcgm=True), OK, "pause DCGM"),
    ("DCGM listener on Ampere", {"dcgm__listening": [{"port": 9400}], "gpus__0__architecture": 7},
     Request(gpus=(0,)), REFUSED, "DCGM"),
    ("DCGM on Hopper shares counters", {"dcgm__hostengine": [99]}, Request(), OK, "no other"),
    ("no NVML", {"nvml": {"available": False, "error": "no driver"}, "gpus": []}, Request(), REFUSED, "NVML"),
    ("ncu missing", {"tools__ncu": None}, Request(), REFUSED, "ncu not found"),
]


@pytest.mark.parametrize("case,changes,request_,expected,text", COUNTER_RULES, ids=[r[0] for r in COUNTER_RULES])
def test_counter_rules_for_ncu_and_gpu_metrics(case, changes, request_, expected, text):
    v = verdicts(state(**changes), request_)
    assert v["ncu"].status == expected
    assert any(text in r for r in v["ncu"].reasons), v["ncu"].reasons
    if case != "ncu missing":  # nsys GPU metrics program the same counters: same rules
        assert v["nsys-gpu-metrics"].status == expected


def test_refusal_names_tenant_user_pid_gpu_and_gives_a_remedy():
    v = verdicts(state(gpus__0__processes=[TENANT]))["ncu"]
    assert v.tenants == (policy.Tenant(0, 4242, "bob", 10**9, "belongs to another user"),)
    assert "GPU 0: pid 4242 (bob, 1.0 GB) belongs to another user" in v.reasons[0]
    assert v.remedy and "nsys" in v.remedy


def test_ncu_always_gets_an_explicit_clock_control():
    from fleet.plan import ProfileRequest, plan

    s = state(gpus__0__uuid="GPU-a", gpus__1__uuid="GPU-b")
    argv = plan("h", s, ProfileRequest(tool="ncu", command=("x",), run_id="r")).command.argv()
    assert argv[argv.index("--clock-control") + 1] == "base"


SAMPLING_RULES = [
    ("paranoid 2", {"perf_event_paranoid": 2}, {}, OK, (), {}),
    ("paranoid 1", {"perf_event_paranoid": 1}, {}, OK, (), {}),
    ("paranoid 4, not owned", {"perf_event_paranoid": 4}, {}, DEGRADED, policy.NO_SAMPLING_FLAGS, {}),
    ("paranoid 3, owned", {"perf_event_paranoid": 3}, {"kernel.perf_event_paranoid": 2}, OK, (),
     {"kernel.perf_event_paranoid": 2}),
    ("paranoid at the owned value: held too", {"perf_event_paranoid": 2}, {"kernel.perf_event_paranoid": 2}, OK, (),
     {"kernel.perf_event_paranoid": 2}),
    ("paranoid below the owned value: left alone", {"perf_event_paranoid": 1}, {"kernel.perf_event_paranoid": 2}, OK,
     (), {}),
    ("paranoid 4, owned at a useless value", {"perf_event_paranoid": 4}, {"kernel.perf_event_paranoid": 3},
     DEGRADED, policy.NO_SAMPLING_FLAGS, {}),
    ("paranoid 4, root", {"perf_event_paranoid": 4, "euid": 0}, {}, OK, (), {}),
    ("no perf events", {"perf_event_paranoid": None}, {}, DEGRADED, policy.NO_SAMPLING_FLAGS, {}),
]


@pytest.mark.parametrize("case,changes,owned,expected,flags,sysctls", SAMPLING_RULES, ids=[r[0] for r in SAMPLING_RULES])
def test_cpu_sampling_rules(case, changes, owned, expected, flags, sysctls):
    v = verdicts(state(**changes), Request(owned_sysctls=owned))["nsys-cpu-sampling"]
    assert (v.status, v.flags, v.sysctls) == (expected, flags, sysctls)
    if expected == DEGRADED:
        assert "--sample=none --cpuctxsw=none" in v.reasons[0] and "owned_sysctls" in v.remedy


def test_the_doctor_example_text_for_paranoid_4():
    v = verdicts(state(perf_event_paranoid=4))["nsys-cpu-sampling"]
    assert v.reasons[0] == "perf_event_paranoid=4: CPU sampling off, fleet will pass --sample=none --cpuctxsw=none"
    assert v.remedy == "list kernel.perf_event_paranoid in owned_sysctls (value 2) to let fleet set it"


TRACE_RULES = [
    ("beside a tenant", {"gpus__0__processes": [TENANT]}, OK),
    ("nsys missing", {"tools__nsys": None}, REFUSED),
    ("report dir not writable", {"report_dir__writable": False}, REFUSED),
    ("no GPU", {"nvml": {"available": False, "error": "x"}, "gpus": []}, DEGRADED),
    ("as root, nsys another account can change", {"euid": 0, "tools__nsys__writable_by_others": "/opt/x is "
                                                  "writable by every account"}, REFUSED),
    ("as a user, nsys of their own folder", {"euid": 1000, "tools__nsys__writable_by_others": "/home/a is "
                                             "writable by group 100"}, OK),
]


@pytest.mark.parametrize("case,changes,expected", TRACE_RULES, ids=[r[0] for r in TRACE_RULES])
def test_nsys_trace_is_allowed_beside_tenants(case, changes, expected):
    assert verdicts(state(**changes))["nsys-trace"].status == expected


def test_problems_matrix_flags_memory_backed_report_dir_and_neighbours():
    from fleet.lab.doctor import problems

    p = problems(state(report_dir__memory_backed=True, report_dir__fstype="tmpfs",
                              gpus__0__processes=[TENANT], mps__control_daemon=[3]))
    assert p["collection"].status == "warn" and "memory-backed" in p["collection"].text
    assert p["neighbours"].status == "warn" and "bob" in p["neighbours"].text and "MPS" in p["neighbours"].text
    assert p["placement"].status == OK


def test_the_policy_does_not_touch_its_input():
    s = state(gpus__0__processes=[TENANT])
    before = copy.deepcopy(s)
    policy.assess(s, Request(allow_own=True))
    policy.findings(s)
    assert s == before
