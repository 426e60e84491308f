"""The node's state has one shape: the TypedDicts of fleet/policy/vocabulary.py name exactly the
keys the agent fills, as the shipped agent's probe answers over the wire, and the wire's shapes
name no key besides them."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import types
import typing
from pathlib import Path

from fleet.agent import bundle, wire
from fleet.policy import vocabulary as v
from tests.harness import fakenvml
from tests.harness.sshd import STANDINS

# Reached from NodeState but filled by no probe: a section's error (a collector that failed) and
# what a Slurm rank adds of its node's prolog (agent/task.py).
NOT_PROBED = {v.SectionError, v.PrologVerdict}
ADDED_BY_A_RANK = {"prolog_verdict"}


def all_keys(cls) -> set[str]:
    return set(cls.__required_keys__ | cls.__optional_keys__)


def _dict_arms(hint) -> list:
    """The TypedDicts a hint allows (``X | None``, ``X | SectionError``, ``X``)."""
    if typing.is_typeddict(hint):
        return [hint]
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(hint) if typing.is_typeddict(a)]
    return []


def walk(value, hint, where: str, seen: dict, wrong: list) -> None:
    """Holds ``value`` to ``hint``: each dict's keys to its TypedDict's (every required key there,
    none it does not name), and records which keys of each TypedDict were seen."""
    arms = _dict_arms(hint)
    if arms and isinstance(value, dict):
        fits = [c for c in arms if c.__required_keys__ <= set(value) <= all_keys(c)]
        if not fits:
            wrong.append(f"{where}: keys {sorted(value)} fit none of {[c.__name__ for c in arms]}")
            return
        cls = fits[0]
        seen.setdefault(cls, set()).update(value)
        hints = typing.get_type_hints(cls)
        for key, item in value.items():
            walk(item, hints[key], f"{where}.{key}", seen, wrong)
    elif arms and value is not None and not any(a in (str, int) for a in typing.get_args(hint)):
        wrong.append(f"{where}: {value!r} is no object")
    elif typing.get_origin(hint) in (list, typing.List) and isinstance(value, list):
        for i, item in enumerate(value):
            walk(item, typing.get_args(hint)[0], f"{where}[{i}]", seen, wrong)


def reachable(cls, out: set | None = None) -> set:
    """Every TypedDict ``cls`` holds, however deep."""
    out = set() if out is None else out
    out.add(cls)
    for hint in typing.get_type_hints(cls).values():
        for part in [hint, *typing.get_args(hint), *(a for h in typing.get_args(hint) for a in typing.get_args(h))]:
            for arm in _dict_arms(part):
                if arm not in out:
                    reachable(arm, out)
    return out


# A listener on DCGM's port in a network namespace of the probe's own (the machine's port stays
# free), kept open across the exec of the agent, which then sees it in /proc/net/tcp.
LISTEN_THEN_EXEC = ("import os, socket, sys; s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); "
                    "s.set_inheritable(True); os.execv(sys.argv[2], sys.argv[2:])")


def probe(env: dict, args: dict, listening: int | None = None) -> dict:
    """The shipped agent's probe as the controller reads it: the bundle on stdin, the answer off the wire."""
    argv = [sys.executable, "-c", bundle.BOOTSTRAP, json.dumps({"mode": "probe", **args})]
    if listening:
        argv = ["unshare", "--net", "--", sys.executable, "-c", LISTEN_THEN_EXEC, str(listening), *argv]
    out = subprocess.run(argv,
                         input=bundle.bundle(), capture_output=True, timeout=120, cwd="/",
                         env={"PATH": os.environ["PATH"], **env})
    assert out.returncode == 0, out.stderr.decode()
    return wire.read(out.stdout.decode(), "probe")


def unused_pid() -> int:
    pid = 4_000_000
    while Path(f"/proc/{pid}").exists():
        pid -= 1
    return pid


def test_the_probe_fills_exactly_the_node_states_keys(tmp_path):
    """Two nodes that between them show every key: GPUs with an own process, another account's and
    one whose pid cannot be seen, a GPU in MIG mode; nsys as found, an ncu others could change, DCGM's
    port listening; and a node where NVML fails to start. A key the agent adds, renames or drops without the type, or
    one the type names that the agent never fills, fails here."""
    lib = fakenvml.build(tmp_path / "lib")
    nobody = pwd.getpwnam("nobody")
    own = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, start_new_session=True)
    other = subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL, start_new_session=True,
                             user=nobody.pw_uid, group=nobody.pw_gid, extra_groups=[])
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)  # a folder every account may write: its ncu is not to be run as root
    shutil.copy(STANDINS / "ncu", open_dir / "ncu")
    try:
        gpus = tmp_path / "gpus.txt"
        fakenvml.write_scenario(gpus, {"gpus": [
            {"index": 0, "processes": [{"kind": "compute", "pid": own.pid, "mem": 10**9},
                                       {"kind": "compute", "pid": other.pid, "mem": 10**9},
                                       {"kind": "graphics", "pid": unused_pid(), "mem": 10**8}]},
            {"index": 1, "mig": 1, "mig_pending": 1, "mig_instances": [{"gi": 1, "ci": 0}]}]})
        no_nvml = tmp_path / "no-nvml.txt"
        fakenvml.write_scenario(no_nvml, {"init_error": 9})
        tools = {"nsys": str(STANDINS / "nsys"), "ncu": str(open_dir / "ncu")}
        rich = {"tools": tools, "environment_check": True, "report_dir": str(tmp_path / "reports"),
                "owner_uid": os.getuid()}
        states = [probe(fakenvml.env(lib, gpus), rich, listening=5555),
                  probe(fakenvml.env(lib, no_nvml), {"tools": {"nsys": str(STANDINS / "nsys")},
                                                     "environment_check": False})]
    finally:
        for p in (own, other):
            p.kill()  # by pid: the processes this test started
            p.wait()
    seen: dict = {}
    wrong: list = []
    for i, state in enumerate(states):
        assert set(state) == all_keys(v.NodeState) - ADDED_BY_A_RANK, i
        walk(state, v.NodeState, f"state{i}", seen, wrong)
    assert wrong == []
    unfilled = {cls.__name__: sorted(all_keys(cls) - seen.get(cls, set())) for cls in reachable(v.NodeState)
                if cls not in NOT_PROBED}
    assert {name: keys for name, keys in unfilled.items() if keys} == {"NodeState": sorted(ADDED_BY_A_RANK)}
    processes = states[0]["gpus"][0]["processes"]
    assert [p.get("why") is not None for p in processes] == [False, False, True]  # the walk saw all three kinds


def test_the_wire_holds_a_probe_to_keys_of_the_node_state():
    """What the controller checks of a probe's answer names keys the agent fills, under the same names."""
    assert set(wire.PROBE) <= all_keys(v.NodeState)
    assert set(wire.GPU) <= all_keys(v.Gpu)
    assert set(wire.PROCESS) <= all_keys(v.GpuProcess)


def test_the_walk_finds_a_key_the_type_does_not_name():
    """It would pass on nothing: an extra key, a missing one and a wrong nesting are each found."""
    wrong: list = []
    walk({"index": 0, "processes": [], "process_list_error": None, "memory_used_by_processes": None,
          "sampled_pids": [], "surprise": 1}, v.GpuLook, "gpu", {}, wrong)
    walk({"available": True}, v.Nvml, "nvml", {}, wrong)
    walk({"gpus": [{"index": 0}]}, v.NodeState, "state", {}, wrong)
    assert [w.split(":")[0] for w in wrong] == ["gpu", "nvml", "state.gpus[0]"]


def test_a_docker_run_where_the_other_profiler_was_not_found():
    """The agent names a profiler it did not find as None (``tools.ncu: None``): nsys in a container
    mounts nsys's folder alone (reading that None as a dict stopped the run with a traceback)."""
    from fleet.lab.profile import in_docker
    from fleet.plan import LabPart, ProfileRequest, plan

    nsys = "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys"
    state = {"uid": 1001, "gid": 1001, "euid": 1001, "perf_event_paranoid": 2, "host_pid_namespace": True,
             "nvml": {"available": True, "error": None}, "report_dir": {"path": "/var/tmp/fleet-ana", "writable": True},
             "tools": {"nsys": {"path": nsys, "found_by": "PATH"}, "ncu": None},
             "gpus": [{"index": 0, "uuid": "GPU-a", "processes": []}]}
    req = ProfileRequest(tool="nsys", command=("python3", "app.py"), run_id="r", lab=LabPart(docker_image="pytorch:25.01"))
    argv = in_docker(plan("h01", state, req), state, req, None).command.argv()
    mounts = [argv[i + 1] for i, w in enumerate(argv) if w == "-v"]
    assert "/opt/nvidia/nsight-systems/2025.3.1:/opt/nvidia/nsight-systems/2025.3.1:ro" in mounts
    assert not any("nsight-compute" in m for m in mounts) and argv[argv.index("pytorch:25.01") + 1] == nsys
