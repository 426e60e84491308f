"""What one node's look sample means, for either path (lab servers over SSH, or a Slurm job's
step): the node's figures held to their shape, each GPU judged by the same policy as
``fleet profile``, and the line framing of a session's stream.

A line past :data:`LINE_LIMIT` ends that host's look. A host whose last sample is older than
:data:`STALE_AFTER` intervals is shown stale, and the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from .agent import wire
from .agentcall import cut_strings
from .policy import neighbours, verdicts
from .policy.vocabulary import Request

LINE_LIMIT = 4 << 20   # bytes of one sample's line: a few KB a GPU; a node sending more is not believed
STALE_AFTER = 3        # intervals without a sample before a host is shown stale
START_BOUND = 60.0     # seconds for a host's first sample (its connection and probe included)
CLOSE_GRACE = 1.0      # seconds between a look's end and its session's kill


@dataclass
class GpuView:
    """One GPU as the look shows it: the node's figures, and the policy's word on them."""
    host: str
    index: int
    name: str | None
    memory_used: int | None
    memory_total: int | None
    activity: dict
    conditions: dict
    processes: list[dict]
    unseen: list[str]           # what shows processes the lists hide (another PID namespace)
    ncu: str                    # the verdict for ncu there now: ok or refused
    ncu_reasons: tuple[str, ...]
    free: bool                  # nobody else on it, no MIG, no MPS: `--gpu free` would take it
    uuid: str | None = None     # NVML's, from the node's state: a record's GPU is found by it again

    def to_json(self) -> dict:
        return {"host": self.host, "index": self.index, "name": self.name, "uuid": self.uuid,
                "memory_used": self.memory_used,
                "memory_total": self.memory_total, "activity": self.activity, "conditions": self.conditions,
                "processes": self.processes, "unseen": self.unseen, "ncu": self.ncu,
                "ncu_reasons": list(self.ncu_reasons), "free": self.free}


@dataclass
class HostView:
    host: str
    seq: int | None = None
    received: float | None = None          # time.monotonic() of its last sample, here
    sampled_at: float | None = None        # the node's clock at that sample
    gpus: list[GpuView] = field(default_factory=list)
    error: str | None = None
    state: dict | None = field(default=None, repr=False)  # the node's probed state, from its first line
    started: float = field(default_factory=time.monotonic)

    def stale(self, now: float, interval: float) -> bool:
        """No sample for STALE_AFTER intervals (the first may take START_BOUND: a connection and a probe)."""
        if self.error is not None:
            return False
        if self.received is None:
            return now - self.started > START_BOUND
        return now - self.received > STALE_AFTER * interval


def _merged(state: dict, look: dict) -> dict:
    """The probed state with each GPU's people and memory as this sample saw them."""
    fresh = {g["index"]: g for g in look["gpus"]}
    gpus = [dict(g, **{k: fresh[g["index"]][k] for k in ("processes", "process_list_error",
                                                           "memory_used_by_processes", "sampled_pids")
                       if k in fresh.get(g["index"], {})})
            for g in state.get("gpus") or [] if isinstance(g, dict) and g.get("index") in fresh]
    return dict(state, gpus=gpus)


def judge(host: str, state: dict, look: dict) -> list[GpuView]:
    """Each GPU of one sample, with the policy's verdict for ncu on it alone."""
    merged = _merged(state, look)
    known = {g["index"]: g for g in merged["gpus"]}
    views = []
    for g in look["gpus"]:
        request = Request(gpus=(g["index"],))
        verdict = verdicts.counters(merged, request, "ncu", "ncu") if g["index"] in known else None
        shared = neighbours.sharing(merged, request) if g["index"] in known else [("not in the node's state", "")]
        views.append(GpuView(
            host, g["index"], known.get(g["index"], {}).get("name"), g.get("memory_used"), g.get("memory_total"),
            g["activity"], g.get("conditions") or {}, g["processes"],
            neighbours.unseen_tenants(merged, request) if g["index"] in known else [],
            verdict.status if verdict else "refused",
            verdict.reasons if verdict else ("the node's first sample did not describe this GPU",),
            not shared, known.get(g["index"], {}).get("uuid")))
    return views


class Lines:
    """Chunks of a session's stdout, as whole lines; a line past LINE_LIMIT is an error."""

    def __init__(self, on_line: Callable[[str], None]):
        self.buf, self.on_line, self.error = bytearray(), on_line, None

    def feed(self, stream: str, chunk: bytes) -> None:
        if stream != "stdout" or self.error:
            return
        self.buf += chunk
        while (end := self.buf.find(b"\n")) >= 0:
            line, self.buf = bytes(self.buf[:end]), self.buf[end + 1:]
            self.on_line(line.decode("utf-8", "replace"))
        if len(self.buf) > LINE_LIMIT:
            self.error = f"sent a line of more than {LINE_LIMIT >> 20} MiB: its look is not believed"
            self.buf.clear()


def take(view: HostView, body: dict, on_view: Callable[[HostView], None]) -> None:
    """One sample of a host's look, held to its shape, judged and shown."""
    wrong = wire.problems(body, "look")
    if wrong:
        view.error = f"its look is malformed: {'; '.join(wrong[:2])}"
    elif view.state is None and "state" not in body:
        view.error = "its look began without the node's state"
    else:
        body = cut_strings(body)
        view.state = body.get("state") or view.state
        view.seq, view.received, view.sampled_at = body["seq"], time.monotonic(), body.get("time")
        view.gpus = judge(view.host, view.state, body)
    on_view(view)
