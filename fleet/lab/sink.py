"""A lab run's output from each host, as it comes: the workload's and the profiler's lines relayed
to the terminal (prefixed with the host's name when several run), the agent's result line kept
apart and read (fleet/agentcall.py: read_answer)."""

from __future__ import annotations

from typing import Callable

from .. import agentcall
from ..agent import wire

# bytes of output without a newline relayed as one piece (no quadratic joins)
LINE_LIMIT = 1 << 16
RESULT_LIMIT = 64 << 20  # bytes of the agent's result line; a node sending more is not believed


class LineSink:
    """A host's output, line by line, prefixed when several hosts run; the agent's result line kept
    apart. Output is taken in chunks: a line is joined once, and one longer than LINE_LIMIT is
    relayed in pieces, so a workload that never prints a newline costs no more than one that
    does."""

    MARK = wire.MARK.encode()

    def __init__(self, host: str, prefix: bool, write: Callable[[str, str], None]):
        self.host, self.prefix, self.write = host, prefix, write
        self.partial = {"stdout": bytearray(), "stderr": bytearray()}
        self.result: dict | None = None
        self.malformed: str | None = None  # why the agent's result could not be used

    def __call__(self, stream: str, chunk: bytes) -> None:
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
