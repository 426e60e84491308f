"""A host's output as its agent sends it: the workload's and the profiler's lines relayed to the
user as they come, each prefixed with the host when several run, and the agent's answers kept apart
and read."""

from __future__ import annotations

import asyncio
from typing import Callable

from .. import agentcall
from ..agent import wire
from ..transport.base import StopRequest

# bytes of output without a newline relayed as one piece (no quadratic joins)
LINE_LIMIT = 1 << 16
RESULT_LIMIT = 64 << 20  # bytes of the agent's result line; a node sending more is not believed
# Seconds a one call's probe answer may take, as long as a probe round trip may (agentcall.probe).
PROBE_WAIT = 120.0


class LineSink:
    """A host's output, line by line, prefixed when several hosts run; the agent's result line kept
    apart. Output is taken in chunks: a line is joined once, and one longer than LINE_LIMIT is
    relayed in pieces, so a workload that never prints a newline costs no more than one that
    does."""

    MARK = wire.MARK.encode()

    def __init__(self, host: str, prefix: bool, write: Callable[[str, str], None],
                 on_probe: Callable[[str], None] | None = None):
        self.host, self.prefix, self.write = host, prefix, write
        self.partial = {"stdout": bytearray(), "stderr": bytearray()}
        self.result: dict | None = None
        self.malformed: str | None = None  # why the agent's result could not be used
        # A run in one call (the agent's "lab" mode): its first answer is the probe's, given to
        # on_probe as it came; the profile's answer follows.
        self.on_probe = on_probe
        # Bytes on stdout before that answer, bounded as a probe round trip's output is; past the
        # bound, nothing more the node sends on stdout is read.
        self.before_probe, self.deaf = 0, False

    def waiting_for_probe(self) -> bool:
        """Whether this is a one call whose probe answer has not come (nor been given up on)."""
        return self.on_probe is not None and not self.deaf

    def __call__(self, stream: str, chunk: bytes) -> None:
        if stream == "stdout" and self.on_probe is not None:
            self.before_probe += len(chunk)
            if self.before_probe > agentcall.PROBE_LIMIT:
                self.on_probe, self.deaf = None, True
                self.malformed = (f"{self.host} sent more than {agentcall.PROBE_LIMIT >> 20} MiB "
                                  "on stdout before its probe answer: it is not believed")
        if stream == "stdout" and self.deaf:
            return
        buf, start = self.partial[stream], 0
        while (end := chunk.find(b"\n", start)) >= 0:
            buf += chunk[start:end]
            self.line(stream, bytes(buf))
            buf.clear()
            start = end + 1
        buf += chunk[start:]
        ours = stream == "stdout" and buf[:len(self.MARK)] == self.MARK[:len(buf)]
        if len(buf) > (RESULT_LIMIT if ours else LINE_LIMIT):
            if ours:
                self.malformed = f"the agent's result is over {RESULT_LIMIT >> 20} MiB"
                buf.clear()
            else:
                self.piece(stream, bytes(buf))
                buf.clear()

    def line(self, stream: str, raw: bytes) -> None:
        if stream == "stdout" and raw.startswith(self.MARK):
            if self.on_probe is not None:
                on_probe, self.on_probe = self.on_probe, None
                on_probe(raw.decode("utf-8", "replace"))
                return
            try:
                self.result, self.malformed = agentcall.read_answer(raw.decode("utf-8", "replace"),
                                                                    "profile"), None
            except wire.WireError as e:
                self.malformed = str(e)
            return
        self.piece(stream, raw)

    def piece(self, stream: str, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        self.write(stream, f"{self.host}: {text}\n" if self.prefix else text + "\n")

    def flush(self) -> None:
        for stream, rest in self.partial.items():
            if rest:
                self.line(stream, bytes(rest))
            rest.clear()


class ProbeDue:
    """A one call's stop: the user's (Ctrl-C, with its signal), or its probe's answer not come
    within ``within`` seconds. A node whose NVML hangs answers nothing, and a run without --timeout
    would otherwise wait on it for as long as SSH's keepalives go on. ``event`` is what the
    transport is given; ``close`` once the call has ended."""

    def __init__(self, sink: LineSink, stop: asyncio.Event | None, within: float = PROBE_WAIT):
        self.event = StopRequest()
        self.timer = asyncio.get_running_loop().call_later(within, self._late, sink, within)
        self.relay = asyncio.ensure_future(stop.wait()) if stop is not None else None
        if self.relay is not None:
            self.relay.add_done_callback(
                lambda done: done.cancelled() or self._stop(getattr(stop, "signal", "TERM")))

    def _late(self, sink: LineSink, within: float) -> None:
        if sink.waiting_for_probe():
            sink.malformed = (f"no probe answer from the agent within {within:g} s: the call was "
                              "stopped")
            self._stop("TERM")

    def _stop(self, signal: str) -> None:
        self.event.signal = signal
        self.event.set()

    def close(self) -> None:
        self.timer.cancel()
        if self.relay is not None:
            self.relay.cancel()
