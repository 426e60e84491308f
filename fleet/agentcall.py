"""The controller's side of the node agent, for lab servers and Slurm alike: how it is started
on a node, and its answers read back, through the one wire (``fleet/agent/wire.py``).

What travels and how (the bootstrap, the loader, the bundle) is ``fleet/agent/bundle.py``.
An answer is checked against its shape before anything uses it: a node that sends a malformed
one fails alone, with the reason, and the other hosts go on.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Callable

from .agent import wire
from .agent.bundle import BOOTSTRAP, BOOTSTRAP_AHEAD, bundle
from .agent.messages import RepairAnswer
from .policy.nodestate import NodeState
from .transport import Result

if TYPE_CHECKING:
    from .inventory import Host
    from .transport import Fanout


PROBE_LIMIT = 16 << 20  # a probe answer is a few KB a GPU: a node sending more is not believed
# Characters of any one string of a node's answer that fleet keeps (a note, a reason, a path: paths
# are at most 4096 bytes): past it the string is cut and says so, in the store and on the terminal.
STRING_LIMIT = 8192
# Strings of any one list of strings that fleet keeps (notes, reasons, the profiler's errors: a
# handful each): past it the list is cut and its last item says how many were left out.
STRINGS_LIMIT = 200


def cut_strings(doc):
    """A node's answer with each string past :data:`STRING_LIMIT` cut, and each list of strings
    past :data:`STRINGS_LIMIT`, saying how much was left out (its shape otherwise as it came:
    checked by the wire before this)."""
    if isinstance(doc, str):
        return doc if len(doc) <= STRING_LIMIT else \
            f"{doc[:STRING_LIMIT]} [cut: {len(doc) - STRING_LIMIT} more characters]"
    if isinstance(doc, list):
        if len(doc) > STRINGS_LIMIT and all(isinstance(v, str) for v in doc):
            return [cut_strings(v)
                    for v in doc[:STRINGS_LIMIT]] + [f"[cut: {len(doc) - STRINGS_LIMIT} more]"]
        return [cut_strings(v) for v in doc]
    if isinstance(doc, dict):
        return {k: cut_strings(v) for k, v in doc.items()}
    return doc


def read_answer(text: str, kind: str) -> dict:
    """The node's answer of ``kind`` in ``text``, held to its shape (``wire.read``) and its
    strings cut to :data:`STRING_LIMIT`."""
    return cut_strings(wire.read(text, kind))


def agent_argv(host: "Host", args: dict) -> list[str]:
    python = host.vars.get("ansible_python_interpreter", "python3")
    return [python, "-c", BOOTSTRAP, json.dumps(args, separators=(",", ":"))]


def agent_call(host: "Host", args: dict) -> tuple[list[str], bytes]:
    """The command line and stdin of an agent call whose arguments may be long (a plan holds the
    workload's command): they follow the agent on stdin, where no argv limit applies."""
    python = host.vars.get("ansible_python_interpreter", "python3")
    return [python, "-c", BOOTSTRAP, "-"], bundle() + arguments(args)


def agent_call_ahead(host: "Host", mode: str) -> tuple[list[str], bytes]:
    """The command line and stdin of an agent call started ahead of its arguments: the agent alone
    on stdin, its length on the command line; the arguments follow later (:func:`arguments`), on
    the same stdin, which then ends."""
    python = host.vars.get("ansible_python_interpreter", "python3")
    payload = bundle()
    return [python, "-c", BOOTSTRAP_AHEAD, str(len(payload)), "-ahead", mode], payload


def arguments(args: dict) -> bytes:
    """An agent call's arguments as they follow the agent on its stdin."""
    return json.dumps(args, separators=(",", ":")).encode()


def agent_args(host: "Host", owner_uid: int | None = None, environment_check: bool = True,
               versions: tuple[str, ...] | None = None) -> dict:
    """What the agent needs from the inventory; ``nsys status -e`` only when asked (doctor);
    ``versions``: the profilers whose ``--version`` is read (a run's own, none for the live look;
    both where not said)."""
    args: dict = {"tools": {t: host.vars[f"{t}_path"] for t in ("nsys", "ncu")
                            if host.vars.get(f"{t}_path")},
                  "environment_check": environment_check}
    if versions is not None:
        args["versions"] = list(versions)
    if host.vars.get("report_dir"):
        args["report_dir"] = host.vars["report_dir"]
    if owner_uid is not None:
        args["owner_uid"] = owner_uid
    return args


def read_state(host: "Host", r: Result) -> Result:
    """Turn the agent's output into ``r.extra['state']`` (a :class:`NodeState`), or a
    clear per-host error."""
    # unreachable, or an answer past its bound
    if r.error and (not r.reached or r.error_kind == "agent"):
        return r
    python = host.vars.get("ansible_python_interpreter", "python3")
    err = r.stderr.decode("utf-8", "replace").strip()
    if r.exit_status == 127 or (r.exit_status and "not found" in err and python in err):
        r.error, r.error_kind = (f"{python} not found on {host.name}: fleet's agent needs Python "
                                 "3.8 or newer there (set "
                                 "ansible_python_interpreter to its path)"), "no-python"
        return r
    if r.exit_status != 0 or r.error:
        last = err.splitlines()[-1] if err else (r.error or f"exit status {r.exit_status}")
        if "SyntaxError" in err:
            last = (f"{python} on {host.name} is too old for fleet's agent "
                    f"(3.8 or newer needed): {last}")
        r.error, r.error_kind = f"agent failed on {host.name}: {last}", r.error_kind or "agent"
        return r
    try:
        r.extra["state"] = NodeState.read(read_answer(r.stdout.decode("utf-8", "replace"), "probe"))
        r.stdout = b""  # kept parsed: with thousands of hosts, not twice
    except wire.WireError as e:
        r.error, r.error_kind = f"{host.name}: {e}", "agent"
    return r


def probed_document(r: Result) -> dict | None:
    """The probe's answer as the agent wrote it (its strings cut), for ``--json``;
    None where none came."""
    state = r.extra.get("state")
    return state.document if state is not None else None


def read_repair(host: "Host", r: Result) -> Result:
    """``fleet repair``'s answer from the agent: ``r.extra['repair']`` (what was put back, a
    ``messages.Repaired``), or one line in ``r.error``; the agent may print its own error, print
    nothing, or something else."""
    if r.error and not r.reached:
        return r
    text = r.stdout.decode("utf-8", "replace")
    try:
        answer = RepairAnswer.read(read_answer(text, "repair"))
    except wire.WireError:
        answer = RepairAnswer()
    if answer.error is not None:
        r.error, r.error_kind = f"{host.name}: {answer.error}", "agent"
    elif answer.value is None:
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        why = (err[-1] if err else f"it printed {text.strip()[:80]!r}"
               if text.strip() else "it printed nothing")
        r.error, r.error_kind = (f"{host.name}: the agent gave no repair result (exit status "
                                 f"{r.exit_status}): {why}"), "agent"
    else:
        r.extra["repair"] = answer.value
    return r


async def probe(fan: "Fanout", hosts: list["Host"], *, owner_uid: int | None = None,
                environment_check: bool = True, versions: tuple[str, ...] | None = None,
                timeout: float = 120.0, on_result: Callable[[Result], None] | None = None,
                last_use: bool = False) -> list[Result]:
    """One round trip per host; each Result carries ``extra['state']`` or an error. ``last_use``:
    nothing follows on these hosts in this run (their connections close as each one answers)."""
    payload = bundle()

    async def one(host: "Host") -> Result:
        args = agent_args(host, owner_uid, environment_check, versions)
        r = await fan.run(host, agent_argv(host, args), input=payload, timeout=timeout,
                          limit=PROBE_LIMIT)
        return read_state(host, r)

    return await fan.each(hosts, one, on_result, last_use=last_use)
