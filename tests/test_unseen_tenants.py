"""Tenants the process lists hide: the driver lists only the caller's PID namespace, but its
memory in use (v2) and utilization samples count everyone. The figures are those measured on an
H200 test machine (driver 580.159.04; docs/architecture.md, "Facts the agent relies on")."""

from __future__ import annotations

import pytest

from fleet import policy
from fleet.policy import OK, REFUSED, Request

from tests.harness.node_states import proc, state

IDLE_TENANT_USED = 1_722_613_760        # v2 used with another user's idle process on GPU 0
BUSY_TENANT_USED = 858_587_136          # v2 used with another user's GEMM loop
TENANT_LISTED = 1_713_373_184           # that process's own figure in the compute list
RESERVED = 644_939_776


def gpu0(**kw):
    """GPU 0 as the agent reports it (memory figures v2, utilization samples); GPU 1 free."""
    return {"gpus__0__memory_used_by_processes": kw.pop("used", 0), "gpus__0__memory_reserved": RESERVED,
            "gpus__0__sampled_pids": kw.pop("samples", []), "gpus__1__memory_used_by_processes": 0,
            "gpus__1__sampled_pids": [], **{f"gpus__0__{k}": v for k, v in kw.items()}}


TENANT = proc(4242, user="bob", uid=1001, foreign=True, mem=TENANT_LISTED)
OWN_IN_NS = proc(5, user="alice", uid=1000, foreign=False, mem=500 << 20)

# (case, host namespace?, GPU 0's figures, request) -> ncu status, text in the reasons
CASES = [
    ("host ns, GPU free", True, gpu0(), Request(), OK, "no other process"),
    ("host ns, tenant listed and named", True, gpu0(used=IDLE_TENANT_USED, processes=[TENANT]), Request(), REFUSED,
     "pid 4242 (bob"),
    ("other ns, GPU free: nothing in use", False, gpu0(), Request(), OK, "no other process"),
    ("other ns, idle tenant hidden", False, gpu0(used=IDLE_TENANT_USED), Request(), REFUSED,
     "1.6 GiB in use by processes not visible from here (the agent is in another PID namespace)"),
    ("other ns, busy tenant hidden", False, gpu0(used=BUSY_TENANT_USED, samples=[4242]), Request(), REFUSED,
     "0.8 GiB in use by processes not visible from here"),
    ("other ns, own process explains the memory, a sample names one not listed", False,
     gpu0(used=(500 << 20), processes=[OWN_IN_NS], samples=[31337]), Request(allow_own=True), REFUSED,
     "utilization samples name processes not visible"),
    ("other ns, own idle process explains the memory", False, gpu0(used=(500 << 20), processes=[OWN_IN_NS]),
     Request(allow_own=True), OK, "no other process"),
    ("other ns, driver without v2 memory", False, gpu0(used=None), Request(), REFUSED, "no memory figure"),
    ("host ns, memory not explained by the lists", True, gpu0(used=IDLE_TENANT_USED), Request(), REFUSED,
     "1.6 GiB in use by processes not visible from here"),
    ("NVML will not list processes", True, gpu0(process_list_error="compute processes: Insufficient Permissions"),
     Request(), REFUSED, "does not list its processes"),
    ("hidden tenant on another GPU only", False, gpu0(used=IDLE_TENANT_USED), Request(gpus=(1,)), OK,
     "no other process"),
    ("namespace unknown, figures clean", None, gpu0(), Request(), OK, "no other process"),
    ("namespace unknown, no figures", None, {}, Request(), REFUSED, "no memory figure"),
]


@pytest.mark.parametrize("case,host_ns,figures,request_,status,text", CASES, ids=[c[0] for c in CASES])
def test_unseen_tenants_refuse_counters(case, host_ns, figures, request_, status, text):
    s = state(host_pid_namespace=host_ns, **figures)
    v = {x.way: x for x in policy.assess(s, request_)}
    assert v["ncu"].status == status and v["nsys-gpu-metrics"].status == status
    assert any(text in r for r in v["ncu"].reasons), v["ncu"].reasons
    assert v["nsys-trace"].status == OK  # a trace programs no counters: a warning at most


def test_a_hidden_tenant_is_a_warning_for_nsys_trace_and_named_by_doctor():
    s = state(host_pid_namespace=False, **gpu0(used=IDLE_TENANT_USED))
    v = {x.way: x for x in policy.assess(s)}
    assert any(r.startswith("warning: GPU 0: 1.6 GiB in use") for r in v["nsys-trace"].reasons)
    assert "host's PID namespace" in v["ncu"].remedy
    neighbours = policy.findings(s)["neighbours"]
    assert neighbours.status == "warn" and "not visible from here" in neighbours.text
