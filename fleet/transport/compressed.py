"""A large file compressed for the wire: zstd on the node, undone here as the bytes arrive.

Over a link slower than the node's disk the bytes on the wire decide how long a report takes to
come home. nsys's SQLite exports compress about 3.2x with zstd's fastest level (the recorded H200
exports: 1,179,648 bytes to 333,337), at several hundred MB/s a core, so over 1 Gbit/s a 259 MB
export arrives in a third of the time (docs/performance.md, "Over a 1 Gbit/s link").

It pays only where the link, not the two ends' CPUs, decides: on this project's 2-core test bed,
on loopback, a compressed 259 MB export came home at half the raw rate. So a file is compressed
for the wire where this host's last large raw copy came slower than ``SLOW_LINK`` (``LinkRates``):
over a 1 Gbit/s link raw copies arrive at 110 MB/s, over loopback or 10 Gbit/s at several times
that. A run's report is fetched before its export, so its copy tells.

The node compresses only where it has ``zstd`` (it says which with the stream's first byte: ``Z``
then a zstd stream, or ``R`` then the raw bytes), niced and on two threads, beside whoever else
works there. It still reads the file as ``ssh_fetch.read_command`` does: GNU dd, no link
followed, never more than the bytes the node's result named. What comes is data: it is
decompressed here a bounded block at a time (a small stream that would inflate without end
fills no memory), never past the bytes asked for, and its sha256 is checked as with any copy.
"""

from __future__ import annotations

import os
import select
import shlex
import subprocess

from . import ssh_fetch
from .ssh_fetch import read_command

try:
    import zstandard
except ImportError:  # no zstd here: every file comes raw, as before
    zstandard = None

_ZSTD_ERRORS = (zstandard.ZstdError,) if zstandard is not None else ()

ZSTD = b"Z"
RAW = b"R"
READ_SIZE = 1 << 20       # bytes decompressed, written and hashed at once
# zstd's fastest level: at 1 Gbit/s the link, not the ratio, decides, and the node's cores are
# others' too (two threads, niced).
NODE_COMPRESSOR = "nice -n 10 zstd -1 -T2 -q -c"


# bytes/s: a raw copy slower than this came over a link of about 1 Gbit/s or less
SLOW_LINK = 150e6
MEASURED_FROM = 8 << 20   # bytes: a smaller copy's rate is its start's, not the link's


class LinkRates:
    """Each host's rate of its last large raw copy, which says whether the next is compressed."""

    def __init__(self) -> None:
        self._rates: dict[str, float] = {}

    def heard(self, host: str, way: str, size: int, seconds: float) -> None:
        """A copy of ``size`` bytes came ``way`` in ``seconds``; raw ones of
        MEASURED_FROM or more count."""
        if way in ("openssh", "stream") and size >= MEASURED_FROM and seconds > 0:
            self._rates[host] = size / seconds

    def slow(self, host: str) -> bool:
        """Whether ``host``'s link is slow enough that its files come compressed (never where
        nothing is known of it yet, or this machine cannot undo zstd)."""
        rate = self._rates.get(host)
        return available() and rate is not None and rate < SLOW_LINK


class Stalled(OSError):
    """Nothing came from the node for ``ssh_fetch.STALL_SECONDS``."""


def available() -> bool:
    """Whether this machine can undo the node's compression."""
    return zstandard is not None


def read_command_compressed(remote: str, offset: int, count: int) -> str:
    """The node's command that sends ``count`` bytes of ``remote`` from ``offset`` on,
    zstd-compressed where the node has zstd: ``Z`` or ``R`` first, then the stream. A POSIX shell
    runs it, whatever the account's login shell; the path reaches it as
    ``read_command`` quotes it."""
    dd = read_command(remote, offset, count)
    script = (f"if command -v zstd >/dev/null 2>&1; then printf Z; {dd} | {NODE_COMPRESSOR}; "
              f"else printf R; exec {dd}; fi")
    return shlex.join(["sh", "-c", script])


class _Pipe:
    """ssh's stdout, read with a bound on silence."""

    def __init__(self, fd: int):
        self.fd = fd

    def read(self, size: int = READ_SIZE) -> bytes:
        ready, _, _ = select.select([self.fd], [], [], ssh_fetch.STALL_SECONDS)
        if not ready:
            raise Stalled(f"the node sent nothing for {ssh_fetch.STALL_SECONDS:g} s: given up")
        return os.read(self.fd, size)


def _write_all(fd: int, block: memoryview) -> None:
    while block:
        block = block[os.write(fd, block):]


def _source(pipe: _Pipe):
    """What the node sends, readable as the file's own bytes, and whether it came compressed: the
    header read, then the raw stream itself or a zstd reader over it (None: ssh ended first)."""
    header = pipe.read(1)
    if not header:  # ssh ended before a byte (its status says why)
        return None, False
    if header == RAW:
        return pipe, False
    if header == ZSTD and zstandard is not None:
        reader = zstandard.ZstdDecompressor().stream_reader(pipe, read_size=READ_SIZE >> 2,
                                                            read_across_frames=True)
        return reader, True
    raise OSError(f"the node's stream began with {header[:1]!r}, "
                  "neither of fleet's marks: not read")


def inflate(proc: subprocess.Popen, pipe_fd: int, writer: int, want: int,
            on_block) -> tuple[int, str | None, str]:
    """In a thread: the file's bytes from ``pipe_fd`` (ssh's stdout) written to ``writer`` in
    order and handed to ``on_block``, until the stream ends, stalls, or would pass ``want``.
    Returns the bytes written, None, "stalled" or "too much" (then ssh is killed and nothing past
    ``want`` is written), and the way they came ("openssh-zstd", or "openssh" where raw)."""
    got, way = 0, "openssh"
    try:
        source, zstd = _source(_Pipe(pipe_fd))
        way = "openssh-zstd" if zstd else way
        while source is not None and (block := source.read(min(READ_SIZE, want + 1 - got))):
            if got + len(block) > want:
                proc.kill()
                _write_all(writer, memoryview(block)[:want - got])
                return want, "too much", way
            _write_all(writer, memoryview(block))
            if on_block is not None:
                on_block(block)  # hashlib releases the GIL for blocks this size
            got += len(block)
    except Stalled:
        proc.kill()
        return got, "stalled", way
    except _ZSTD_ERRORS as e:
        proc.kill()
        raise OSError(f"the node's compressed stream is not zstd's: {e}") from None
    return got, None, way
