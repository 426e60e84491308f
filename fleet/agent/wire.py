"""The one wire between fleet and its agent: how every answer is framed, and the shape it must have.

Shipped to the nodes (standard library, Python 3.8) and imported by the controller, which
imports nothing else of the agent. An answer is one line: ``MARK`` then a JSON object
``{"wire": 1, "kind": KIND, "body": {...}}``; it is the last line on stdout over SSH, and the
content of a rank's ``HOST.result.json`` on Slurm. Whatever else the workload or the profiler
prints cannot pass for one (the agent's relay escapes the mark's first byte).

An answer is data from a node that may be anyone's: :func:`read` takes the last well-formed
one of its kind, and :func:`problems` holds its body to its shape (types, the status
vocabulary, sizes, hashes, plain file names), so that a malformed answer fails that host alone,
with the reason, and never reaches code that would trust it.
"""

from __future__ import annotations

import json
import re
from enum import Enum

MARK = "\x1e@@fleet-result@@ "
VERSION = 1
KINDS = ("probe", "profile", "repair", "look")


class AgentStatus(str, Enum):
    """What an agent says of one run (the body of a "profile" answer, and of a rank's result
    file): the node sets its result's status only to one of these (its ``value``, a plain
    string in the JSON), and the controller reads it back into one."""
    OK = "ok"
    REFUSED = "refused"
    STOPPED = "stopped"
    NO_REPORT = "no-report"
    ERROR = "error"
    YIELDED = "yielded"
    PROFILER_ERROR = "profiler-error"

    def __str__(self):  # the word itself, as a StrEnum's is (Python 3.11), wherever it is written
        return self.value

    def __format__(self, spec):
        return self.value.__format__(spec)


RESULT_STATUSES = tuple(s.value for s in AgentStatus)
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# reports, notes, reasons: more than any run makes; a node sending more is not believed
MAX_ITEMS = 10000


class WireError(ValueError):
    """No answer of the asked kind could be read, or it is not of its shape."""


def frame(kind, body):
    """The one framing of an agent's answer, as a line."""
    return MARK + json.dumps({"wire": VERSION, "kind": kind, "body": body},
                             separators=(",", ":")) + "\n"


def answers(text, kind):
    """The bodies of every answer of ``kind`` in ``text``, in order; lines that carry none are
    skipped. Result files of earlier agents hold the bare result document (or it after MARK):
    they read as "profile" answers."""
    found = []
    for line in text.split("\n"):  # not splitlines(): it also splits at MARK's \x1e
        framed = line.startswith(MARK)
        if framed:
            line = line[len(MARK):]
        elif not (kind == "profile" and line.startswith("{")):
            continue
        try:
            doc = json.loads(line)
        # cut off, or nested past the stack: no answer fleet wrote
        except (ValueError, RecursionError):
            continue
        if not isinstance(doc, dict):
            continue
        if "wire" in doc:
            if doc.get("kind") == kind and isinstance(doc.get("body"), dict):
                found.append(doc["body"])
        elif kind == "profile":  # an earlier agent's result document
            found.append(doc)
    return found


def read(text, kind):
    """The last answer of ``kind`` in ``text``, held to its shape; WireError
    says why there is none."""
    found = answers(text, kind)
    if not found:
        raise WireError("no %s answer from the agent" % kind)
    wrong = problems(found[-1], kind)
    if wrong:
        raise WireError("the agent's %s answer is malformed: %s" % (kind, "; ".join(wrong[:3])))
    return found[-1]


# -- shapes ----------------------------------------------------------------------------------
# A shape is a type (or tuple of types), a list [shape], a dict {key: shape} (every key optional,
# REQUIRED lists those that are not), or a function returning a problem or None.

def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def non_negative(v):
    return None if _is_int(v) and 0 <= v < 1 << 62 else "not a size"


def int_or_none(v):
    return None if v is None or _is_int(v) else "not an integer"


def number_or_none(v):
    ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
                       and abs(v) < 1e15)
    return None if ok else "not a number"


def str_or_none(v):
    return None if v is None or isinstance(v, str) else "not a string"


def sha256(v):
    return None if isinstance(v, str) and SHA256.match(v) else "not a sha256"


def one_of(*allowed):
    return lambda v: None if v in allowed else "not one of %s" % ", ".join(allowed)


def check(value, shape, where="", required=()):
    """Every way ``value`` is not of ``shape``, as 'where: what' lines."""
    if callable(shape) and not isinstance(shape, type):
        why = shape(value)
        return ["%s: %s (%.60r)" % (where or "answer", why, value)] if why else []
    if isinstance(shape, list):
        return _check_list(value, shape[0], where)
    if isinstance(shape, dict):
        return _check_object(value, shape, where, required)
    if not isinstance(value, shape) or (isinstance(value, bool) and shape in (int, (int, float))):
        return ["%s: not %s (%.60r)" % (where or "answer", getattr(shape, "__name__", shape),
                                        value)]
    return []


def _check_list(value, item_shape, where):
    """A list (of at most MAX_ITEMS) each of whose items is of ``item_shape``."""
    if not isinstance(value, list) or len(value) > MAX_ITEMS:
        return ["%s: not a list" % where]
    return [p for i, item in enumerate(value)
            for p in check(item, item_shape, "%s[%d]" % (where, i))]


def _check_object(value, shape, where, required):
    """An object with each of ``required``, and each key of ``shape`` it has of that key's shape."""
    if not isinstance(value, dict):
        return ["%s: not an object" % (where or "answer")]
    wrong = ["%s: missing" % _member(where, k) for k in required if k not in value]
    for key, sub in shape.items():
        if key in value:
            wrong += check(value[key], sub, _member(where, key))
    return wrong


def _member(where, key):
    return where + "." + key if where else key


FILE = {"path": str, "size": non_negative, "sha256": sha256, "status": str_or_none,
        "summary": str_or_none, "kind": str_or_none, "truncated": str_or_none}
FILE_REQUIRED = ("path", "size", "sha256")
NEWCOMER = {"gpu": int_or_none, "pid": int_or_none, "user": str_or_none, "used_memory": int_or_none,
            "unseen": bool, "appeared_s": number_or_none, "overlap_s": number_or_none,
            "action": str_or_none}
WORKLOAD = {"exit_status": int_or_none, "signal": str_or_none, "running": (dict, type(None))}
# A workload left running on the node (--detach, Ctrl-C's "leave it running"): its pids, each one's
# start time in clock ticks since boot and the boot's id (a pid used again later is not
# it), and its output's file.
RUNNING = {"pids": [non_negative], "started": [int_or_none], "boot": str_or_none,
           "output": str_or_none, "session": int_or_none}
# The moments of a run on the node, seconds since its agent's process started (agent/run.py).
PHASES = ("started", "checked", "profiler_ended", "collected", "summarized", "answered")
RESULT = {
    "status": one_of(*RESULT_STATUSES), "host": str_or_none, "node": str_or_none, "reasons": [str],
    "notes": [str],
    "given_up": [str], "reports": [FILE], "summaries": [FILE], "changed": dict,
    "restored": (dict, type(None)),
    "exit_status": int_or_none, "stopped": bool, "rank": int_or_none, "profiler_errors": [str],
    "workload": (dict, type(None)), "newcomer": (dict, type(None)),
    "conditions": (dict, type(None)),
    "tenants": list, "processes_seen": list, "gpu": str_or_none, "driver": str_or_none,
    "tool_version": str_or_none, "slurm_node": str_or_none, "whose": (dict, type(None)),
    # a launcher's ranks that left no report (agent/run.py: rank_reports)
    "missing_ranks": [non_negative],
    # a line for each of nsys's data left without its report (agent/qdstrm.py)
    "unfinished": [str],
    "phases": {k: number_or_none for k in PHASES},  # each moment of the run's (agent/procs.Clock)
}
PROBE = {"host": str_or_none, "uid": int_or_none, "gid": int_or_none, "user": str_or_none,
         "nvml": dict, "gpus": [dict], "mps": dict, "dcgm": dict, "tools": dict, "report_dir": dict,
         "nvidia": dict, "perf_event_paranoid": int_or_none}
GPU = {"index": int, "name": str_or_none, "uuid": str_or_none, "processes": [dict],
       "architecture": int_or_none}
PROCESS = {"pid": int_or_none, "user": str_or_none, "uid": int_or_none, "used_memory": int_or_none}
REPAIR = {"value": (dict, type(None)), "error": str_or_none, "host": str_or_none}
# One sample of the live look (fleet/agent/look.py): the first carries the node's probed state.
ACTIVITY = {"source": one_of("gpm", "utilization"), "utilization": number_or_none,
            "why": str_or_none,
            **{k: number_or_none for k in ("sm_activity", "sm_occupancy", "tensor_activity",
                                           "dram_bandwidth",
                                            "fp32_activity", "fp16_activity", "fp64_activity")}}
LOOK_GPU = {"index": int, "processes": [dict], "process_list_error": str_or_none,
            "memory_used_by_processes": int_or_none, "sampled_pids": (list, type(None)),
            "memory_total": int_or_none, "memory_used": int_or_none, "activity": dict,
            "conditions": dict}
LOOK_PROCESS = dict(PROCESS, name=str_or_none, command=str_or_none, container=str_or_none,
                    slurm_job=str_or_none, foreign=bool, why=str_or_none, session=int_or_none)
CONDITIONS = {"sm_clock_mhz": int_or_none, "mem_clock_mhz": int_or_none,
              "throttle": (list, type(None)),
              "temperature_c": int_or_none, "power_w": number_or_none}
LOOK = {"host": str_or_none, "seq": non_negative, "time": number_or_none, "gpus": [dict],
        "state": dict}


def _look_problems(body):
    wrong = check(body, LOOK, required=("seq", "gpus"))
    for i, gpu in enumerate(body.get("gpus") or [] if not wrong else []):
        where = "gpus[%d]" % i
        wrong += check(gpu, LOOK_GPU, where, required=("index", "activity", "processes"))
        if not isinstance(gpu, dict) or wrong:
            continue
        wrong += check(gpu["activity"], ACTIVITY, where + ".activity", required=("source",))
        wrong += check(gpu.get("conditions") or {}, CONDITIONS, where + ".conditions")
        wrong += [p for j, proc in enumerate(gpu["processes"])
                  for p in check(proc, LOOK_PROCESS, "%s.processes[%d]" % (where, j),
                                 required=("pid",))]
        wrong += check(gpu.get("sampled_pids") or [], [int], where + ".sampled_pids")
    if not wrong and "state" in body:
        wrong += ["state." + p for p in problems(body["state"], "probe")]
    return wrong


def _profile_problems(body):
    """Every way a profile's result is not of RESULT's shape, its files',
    newcomer's and workload's."""
    wrong = check(body, RESULT, required=("status",))
    if wrong:
        return wrong
    for key in ("reports", "summaries"):
        wrong += [p for i, f in enumerate(body.get(key, []))
                  for p in check(f, FILE, "%s[%d]" % (key, i), FILE_REQUIRED)]
    wrong += check(body.get("newcomer") or {}, NEWCOMER, "newcomer")
    wrong += check(body.get("workload") or {}, WORKLOAD, "workload")
    running = (body.get("workload") or {}).get("running") if not wrong else None
    return wrong + (check(running, RUNNING, "workload.running", ("pids", "started"))
                    if running is not None else [])


def problems(body, kind):
    """Every way an answer's body is not of its kind's shape (empty: it may be used)."""
    if kind == "profile":
        return _profile_problems(body)
    if kind == "probe":
        wrong = check(body, PROBE)
        for i, gpu in enumerate(body.get("gpus") or [] if not wrong else []):
            wrong += check(gpu, GPU, "gpus[%d]" % i, required=("index",))
            for j, proc in enumerate(gpu.get("processes") or [] if isinstance(gpu, dict) else []):
                wrong += check(proc, PROCESS, "gpus[%d].processes[%d]" % (i, j))
        return wrong
    if kind == "repair":
        return check(body, REPAIR)
    if kind == "look":
        return _look_problems(body)
    return ["%s: no such kind of answer" % kind]


def named_files(body, besides=()):
    """The files a profile's result names for fleet to bring home (its reports, then its summaries),
    each a dict as the node wrote it, but those whose path is in ``besides`` (already home): the
    collector holds each to FILE's shape itself."""
    named = [f for key in ("reports", "summaries") for f in body.get(key) or []]
    return [f for f in named if not (isinstance(f, dict) and f.get("path") in besides)]


def named_path(entry):
    """The path a file's entry names, for the record of one not fetched (None
    where it names none)."""
    return entry.get("path") if isinstance(entry, dict) else None
