"""Synthetic node states for the pure policy: a node as the agent describes it (two idle H200-class
GPUs, the tools found, a writable report folder), changed one path at a time."""

from __future__ import annotations

import copy

from fleet import policy
from fleet.policy import Request


def proc(pid, user="alice", uid=1000, foreign=False, name="python3", mem=10**9, **kw):
    return {"pid": pid, "user": user, "uid": uid, "foreign": foreign, "name": name, "used_memory": mem,
            "kinds": ["compute"], **kw}


BASE = {
    "euid": 1000, "uid": 1000, "perf_event_paranoid": 2, "host_pid_namespace": True,
    "capabilities": {"sys_admin": False, "perfmon": False},
    "nvidia": {"driver_loaded": True, "profiling_admin_only": 0},
    "nvml": {"available": True},
    "gpus": [{"index": 0, "architecture": 9, "mig_mode": {"current": 0, "pending": 0}, "processes": []},
             {"index": 1, "architecture": 9, "mig_mode": {"current": 0, "pending": 0}, "processes": []}],
    "mps": {"control_daemon": [], "servers": []},
    "dcgm": {"hostengine": [], "exporter": [], "listening": []},
    "tools": {"nsys": {"path": "/opt/nsys", "version": "2025.3.1"}, "ncu": {"path": "/opt/ncu", "version": "2025.3.1"}},
    "report_dir": {"path": "/var/tmp/fleet-alice", "writable": True, "free_bytes": 10**11, "memory_backed": False},
}


def document(**changes) -> dict:
    """The node's document as the agent writes it, changed at each ``a__0__b`` path."""
    s = copy.deepcopy(BASE)
    for path, value in changes.items():
        node = s
        keys = path.split("__")
        for k in keys[:-1]:
            node = node[int(k)] if k.isdigit() else node[k]
        node[keys[-1]] = value
    return s


def state(**changes) -> policy.NodeState:
    """The node's state as the policy reads it: the changed document, read as the wire's reader does."""
    return policy.NodeState.read(document(**changes))


def verdicts(s, request=Request()):
    return {v.way: v for v in policy.assess(s, request)}


TENANT = proc(4242, user="bob", uid=1001, foreign=True)
