"""The node's state has one shape: the dataclasses of fleet/policy/nodestate.py and gpustate.py name
exactly the keys the agent fills, as the shipped agent's probe answers over the wire; their reader
keeps every value the agent sent; and the wire's shapes name no key besides them."""

from __future__ import annotations

import dataclasses
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
from fleet.policy import gpustate
from fleet.policy import nodestate as ns
from tests.harness import fakenvml
from tests.harness.sshd import STANDINS

# Reached from NodeState but filled by no probe: what a Slurm rank adds of its node's prolog
# (agent/task.py), and what the reader keeps besides the document's keys.
NOT_PROBED = {ns.PrologVerdict}
ADDED_BY_A_RANK = {"prolog_verdict"}
READER_ONLY = {"errors", "document"}


def all_keys(cls) -> set[str]:
    """The document's keys a dataclass reads: its fields, less what the reader keeps of its own."""
    return {f.name for f in dataclasses.fields(cls)} - (READER_ONLY if cls is ns.NodeState else set())


def _arms(hint) -> list:
    """The hint's alternatives (``X | None``, ``X``)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return list(typing.get_args(hint))
    return [hint]


def _class_arm(hint):
    found = [a for a in _arms(hint) if dataclasses.is_dataclass(a)]
    return found[0] if found else None


def _item_hint(hint):
    """The items' hint of a ``Tuple[X, ...]`` arm (a list in the document), or None."""
    for arm in _arms(hint):
        if typing.get_origin(arm) in (tuple, typing.Tuple):
            return typing.get_args(arm)[0]
    return None


def walk(value, hint, where: str, seen: dict, wrong: list, section: bool = False) -> None:
    """Holds ``value`` (the document) to ``hint``: each dict's keys to its dataclass's fields (none it
    does not name; a failed section's ``{"error": ...}`` where the probe may leave one), and records
    which fields of each dataclass were seen."""
    cls = _class_arm(hint)
    if cls is not None and isinstance(value, dict):
        if section and set(value) == {"error"}:
            return
        extra = set(value) - all_keys(cls)
        if extra:
            wrong.append(f"{where}: keys {sorted(extra)} are not fields of {cls.__name__}")
            return
        seen.setdefault(cls, set()).update(value)
        hints = typing.get_type_hints(cls)
        for key, item in value.items():
            walk(item, hints[key], f"{where}.{key}", seen, wrong, cls is ns.NodeState and key in ns.SECTIONS)
    elif cls is not None and value is not None:
        wrong.append(f"{where}: {value!r} is no object")
    elif _item_hint(hint) is not None and isinstance(value, list):
        for i, item in enumerate(value):
            walk(item, _item_hint(hint), f"{where}[{i}]", seen, wrong)


def kept(read, value, where: str, wrong: list) -> None:
    """Whether the reader kept ``value`` (the document) as ``read``: every key's value, a list as a
    tuple, an object as its dataclass, a failed section in ``errors``."""
    if dataclasses.is_dataclass(read) and isinstance(value, dict):
        for key, item in value.items():
            if isinstance(read, ns.NodeState) and isinstance(item, dict) and set(item) == {"error"}:
                if read.errors.get(key) != item["error"]:
                    wrong.append(f"{where}.{key}: the section's error is not kept")
                continue
            kept(getattr(read, key), item, f"{where}.{key}", wrong)
    elif isinstance(value, list):
        if not isinstance(read, tuple) or len(read) != len(value):
            wrong.append(f"{where}: {value!r} read as {read!r}")
            return
        for i, (r, v) in enumerate(zip(read, value)):
            kept(r, v, f"{where}[{i}]", wrong)
    elif read != value:
        wrong.append(f"{where}: {value!r} read as {read!r}")


def reachable(cls, out: set | None = None) -> set:
    """Every dataclass ``cls`` holds, however deep."""
    out = set() if out is None else out
    out.add(cls)
    for hint in typing.get_type_hints(cls).values():
        for part in (_class_arm(hint), _class_arm(_item_hint(hint)) if _item_hint(hint) else None):
            if part is not None and part not in out:
                reachable(part, out)
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
    port listening; and a node where NVML fails to start. A key the agent adds, renames or drops
    without the type, one the type names that the agent never fills, or a value the reader does not
    keep, fails here."""
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
        assert set(state) == all_keys(ns.NodeState) - ADDED_BY_A_RANK, i
        walk(state, ns.NodeState, f"state{i}", seen, wrong)
        kept(ns.NodeState.read(state), state, f"state{i}", wrong)
    assert wrong == []
    unfilled = {cls.__name__: sorted(all_keys(cls) - seen.get(cls, set())) for cls in reachable(ns.NodeState)
                if cls not in NOT_PROBED}
    assert {name: keys for name, keys in unfilled.items() if keys} == {"NodeState": sorted(ADDED_BY_A_RANK)}
    processes = states[0]["gpus"][0]["processes"]
    assert [p.get("why") is not None for p in processes] == [False, False, True]  # the walk saw all three kinds


def test_the_wire_holds_a_probe_to_keys_of_the_node_state():
    """What the controller checks of a probe's answer names keys the agent fills, under the same names."""
    assert set(wire.PROBE) <= all_keys(ns.NodeState)
    assert set(wire.GPU) <= all_keys(gpustate.Gpu)
    assert set(wire.PROCESS) <= all_keys(gpustate.GpuProcess)


def test_the_walk_finds_a_key_the_type_does_not_name_and_a_value_the_reader_drops():
    """It would pass on nothing: an extra key, one deep down, an object that is none, a failed
    section where none may fail, and a value the reader leaves out are each found."""
    wrong: list = []
    walk({"index": 0, "processes": [], "process_list_error": None, "memory_used_by_processes": None,
          "sampled_pids": [], "surprise": 1}, gpustate.Gpu, "gpu", {}, wrong)
    walk({"gpus": [{"index": 0, "processes": [{"pid": 1, "surprise": 2}]}]}, ns.NodeState, "state", {}, wrong)
    walk({"nvml": 3, "report_dir": {"error": "OSError: gone"}, "mps": {"error": "no"}}, ns.NodeState, "node", {},
         wrong)
    kept(gpustate.Gpu(index=0), {"index": 0, "name": "H200"}, "read", wrong)
    assert [w.split(":")[0] for w in wrong] == ["gpu", "state.gpus[0].processes[0]", "node.nvml", "node.mps",
                                                 "read.name"]


def test_a_docker_run_where_the_other_profiler_was_not_found():
    """The agent names a profiler it did not find as None (``tools.ncu: None``): nsys in a container
    mounts nsys's folder alone (reading that None as a dict stopped the run with a traceback)."""
    from fleet.lab.profile import in_docker
    from fleet.plan import LabPart, ProfileRequest, plan

    nsys = "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys"
    state = ns.NodeState.read({
        "uid": 1001, "gid": 1001, "euid": 1001, "perf_event_paranoid": 2, "host_pid_namespace": True,
        "nvml": {"available": True, "error": None}, "report_dir": {"path": "/var/tmp/fleet-ana", "writable": True},
        "tools": {"nsys": {"path": nsys, "found_by": "PATH"}, "ncu": None},
        "gpus": [{"index": 0, "uuid": "GPU-a", "processes": []}]})
    req = ProfileRequest(tool="nsys", command=("python3", "app.py"), run_id="r", lab=LabPart(docker_image="pytorch:25.01"))
    argv = in_docker(plan("h01", state, req), state, req, None).command.argv()
    mounts = [argv[i + 1] for i, w in enumerate(argv) if w == "-v"]
    assert "/opt/nvidia/nsight-systems/2025.3.1:/opt/nvidia/nsight-systems/2025.3.1:ro" in mounts
    assert not any("nsight-compute" in m for m in mounts) and argv[argv.index("pytorch:25.01") + 1] == nsys
