"""What one node's look sample means, for either path (lab servers over SSH, or a Slurm job's
step): the node's figures held to their shape, each GPU judged by the same policy as
``fleet profile``, and the line framing of a session's stream.

A line past :data:`LINE_LIMIT` ends that host's look. A host whose last sample is older than
:data:`STALE_AFTER` intervals is shown stale, and the others go on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable

from .agent import wire
from .agent.messages import Activity, Conditions, LookGpu, LookProcess, LookSample
from .agentcall import cut_strings
from .policy import neighbours, verdicts
from .policy.gpustate import Gpu
from .policy.nodestate import NodeState
from .policy.vocabulary import Request

# bytes of one sample's line: a few KB a GPU; a node sending more is not believed
LINE_LIMIT = 4 << 20
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
    activity: Activity
    conditions: Conditions
    processes: list[LookProcess]
    unseen: list[str]           # what shows processes the lists hide (another PID namespace)
    ncu: str                    # the verdict for ncu there now: ok or refused
    ncu_reasons: tuple[str, ...]
    free: bool                  # nobody else on it, no MIG, no MPS: `--gpu free` would take it
    uuid: str | None = None     # NVML's, from the node's state: a record's GPU is found by it again

    def to_json(self) -> dict:
        return {"host": self.host, "index": self.index, "name": self.name, "uuid": self.uuid,
                "memory_used": self.memory_used,
                "memory_total": self.memory_total, "activity": self.activity.to_json(),
                "conditions": self.conditions.to_json(),
                "processes": [p.to_json() for p in self.processes],
                "unseen": self.unseen, "ncu": self.ncu,
                "ncu_reasons": list(self.ncu_reasons), "free": self.free}


@dataclass
class HostView:
    host: str
    seq: int | None = None
    received: float | None = None          # time.monotonic() of its last sample, here
    sampled_at: float | None = None        # the node's clock at that sample
    gpus: list[GpuView] = field(default_factory=list)
    error: str | None = None
    # the node's probed state, from its first line
    state: NodeState | None = field(default=None, repr=False)
    started: float = field(default_factory=time.monotonic)

    def stale(self, now: float, interval: float) -> bool:
        """No sample for STALE_AFTER intervals (the first may take START_BOUND: a
        connection and a probe)."""
        if self.error is not None:
            return False
        if self.received is None:
            return now - self.started > START_BOUND
        return now - self.received > STALE_AFTER * interval


def _merged(state: NodeState, sample: LookSample) -> NodeState:
    """The probed state with each GPU's people and memory as this sample saw them."""
    fresh = {g.index: Gpu.read(g.document) for g in sample.gpus}
    return replace(state, gpus=tuple(
        replace(g, processes=fresh[g.index].processes,
                process_list_error=fresh[g.index].process_list_error,
                memory_used_by_processes=fresh[g.index].memory_used_by_processes,
                sampled_pids=fresh[g.index].sampled_pids)
        for g in state.gpus if g.index in fresh))


def judge(host: str, state: NodeState, sample: LookSample) -> list[GpuView]:
    """Each GPU of one sample, with the policy's verdict for ncu on it alone."""
    merged = _merged(state, sample)
    known = {g.index: g for g in merged.gpus}
    return [_view(host, merged, known[g.index] if g.index in known else None,
                  g) for g in sample.gpus]


def _view(host: str, merged: NodeState, probed: Gpu | None, g: LookGpu) -> GpuView:
    """One GPU of a sample as the look shows it; ``probed``: the node's state of it, None where the
    node's first sample did not describe it (then it counts as refused and shared)."""
    request = Request(gpus=(g.index,))
    if probed is None:
        return GpuView(host, g.index, None, g.memory_used, g.memory_total, g.activity, g.conditions,
                       list(g.processes), [], "refused",
                       ("the node's first sample did not describe this GPU",), False)
    verdict = verdicts.counters(merged, request, "ncu", "ncu")
    return GpuView(host, g.index, probed.name, g.memory_used, g.memory_total, g.activity,
                   g.conditions,
                   list(g.processes), neighbours.unseen_tenants(merged, request), verdict.status,
                   verdict.reasons, not neighbours.sharing(merged, request), probed.uuid)


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
            self.error = (f"sent a line of more than {LINE_LIMIT >> 20} "
                          "MiB: its look is not believed")
            self.buf.clear()


def sample_of(body: dict) -> tuple[LookSample | None, str | None]:
    """A sample's body held to its shape and read (its strings cut), or why it is not taken."""
    wrong = wire.problems(body, "look")
    if wrong:
        return None, f"its look is malformed: {'; '.join(wrong[:2])}"
    return LookSample.read(cut_strings(body)), None


def take(view: HostView, body: dict, on_view: Callable[[HostView], None]) -> None:
    """One sample of a host's look, held to its shape, judged and shown."""
    take_sample(view, *sample_of(body), on_view)


def take_sample(view: HostView, sample: LookSample | None, why: str | None,
                on_view: Callable[[HostView], None]) -> None:
    """A sample already read (``sample_of``), judged and shown; ``why`` where it was not taken."""
    if sample is None:
        view.error = why
    elif view.state is None and sample.state is None:
        view.error = "its look began without the node's state"
    else:
        view.state = NodeState.read(sample.state) if sample.state is not None else view.state
        view.seq, view.received, view.sampled_at = sample.seq, time.monotonic(), sample.time
        view.gpus = judge(view.host, view.state, sample)
    on_view(view)
