"""Bringing a file home over a host's SSH connection: SFTP for small files, the raw stdout of
``dd`` on an exec channel for large ones (see ``SSHTransport.fetch``; the largest go through
OpenSSH's own client where it can be used, ``openssh_fetch``)."""

from __future__ import annotations

import asyncio
import shlex
import stat
from typing import Callable

import asyncssh


SFTP_SESSIONS = 4      # transfers at once over one connection (sshd's MaxSessions is 10)
SFTP_CHUNK = 8 << 20  # bytes per read call; asyncssh keeps several requests in flight within each

# The exec-channel stream for large files: asyncssh's SFTP client spends more client CPU per
# byte than a plain channel (its SFTP packet parsing and reassembly), and on a busy client that
# decides the rate (bench/transfer_variants.py compares the paths; docs/performance-gathering.md).
STREAM_MIN = 8 << 20       # below one chunk the stream gains nothing over SFTP
STREAM_WINDOW = 16 << 20   # channel window: sshd may read this far ahead of us. With asyncssh's
# 2 MiB, sshd stalls on window adjusts; 16 MiB measured best (4 MiB: -10%).
STREAM_PKTSIZE = 256 << 10  # our max packet size: when its socket is backed up sshd joins what it
#                             has read into one bigger packet (~48 KiB on average instead of 32),
# fewer packets for asyncssh to handle in Python (OpenSSH's limit: 256 KiB).
STREAM_BATCH = 1 << 20     # bytes joined and handed to the writer thread at once. With 8 MiB
#                            batches a 1 GiB copy took 1.56x as long (paired, slower in 9 of 9
#                            rounds), with 2 s more client CPU and 0.7 s more of sshd's on the
#                            same two cores; likely because each byte then goes join -> write ->
#                            hash through memory larger than the caches (the client's page faults
#                            were counted: not the cause). 256 KiB-2 MiB measured alike.
#                            (docs/performance-gathering.md, bench/transfer_modes.py)
STREAM_QUEUED = 16         # batches waiting for the writer before the channel is paused (16 MiB)
STREAM_RECV = 64 << 10     # bytes per socket read: see _smaller_reads
# a stream that sends nothing this long is given up (a node's file system hung,
STALL_SECONDS = 60.0
# a FIFO at the path): keepalives only notice a silent connection, not a silent command


async def asyncssh_copy(conn: asyncssh.SSHClientConnection, gate: asyncio.Semaphore, remote: str,
                        local: str,
                        offset: int, size: int | None,
                        on_block: Callable[[bytes], None] | None) -> str:
    """``remote`` from ``offset`` on over the host's asyncssh connection; returns "sftp" or
    "stream". SFTP opens the file (a clear error when it is missing or unreadable) and tells its
    size: a small rest is read over SFTP; a large one (>= STREAM_MIN) comes as the raw stdout of
    ``dd`` on an exec channel, as asyncssh's SFTP client costs about half again as much client
    CPU per byte as a plain channel, and on a busy client that decides the rate. ``gate`` bounds
    the host's transfers at once."""
    from ..agent.files import open_partial

    async with gate:
        async with conn.start_sftp_client() as sftp:
            await refuse_link(sftp, remote)
            async with sftp.open(remote, "rb") as src:
                if size is None:  # else what the node's result named: never more is asked for
                    size = (await src.stat()).size
                if size is None or size - offset < STREAM_MIN:
                    with open_partial(local, offset) as dst:
                        await _ordered_copy(src, dst, offset, on_block)
                    return "sftp"
        with open_partial(local, offset) as dst:
            await _stream_copy(conn, remote, dst, offset, size, on_block)
        return "stream"


async def _ordered_copy(src, dst, offset: int, on_block: Callable[[bytes], None] | None) -> None:
    """Read in large chunks (pipelined inside asyncssh, and the next chunk asked for while this
    one is written and hashed in a thread) and write them in order, so that whatever a cut
    connection leaves on disk is a clean prefix to resume from."""

    def consume(block: bytes) -> None:
        dst.write(block)
        if on_block is not None:
            on_block(block)  # hashlib releases the GIL: this overlaps with the transfer

    ahead: asyncio.Future | None = asyncio.ensure_future(src.read(SFTP_CHUNK, offset))
    try:
        while ahead is not None and (block := await ahead):
            offset += len(block)
            # A short chunk is the end of the file: asking past it only makes asyncssh complain.
            ahead = asyncio.ensure_future(src.read(SFTP_CHUNK,
                                                   offset)) if len(block) == SFTP_CHUNK else None
            await asyncio.to_thread(consume, block)
    finally:
        if ahead is not None and not ahead.done():
            ahead.cancel()


def read_command(remote: str, offset: int, count: int) -> str:
    """The node's command that sends ``count`` bytes of ``remote`` from ``offset`` on, for both
    streams (asyncssh's channel and OpenSSH's client): GNU dd, which refuses a link at the path
    (``nofollow``: what the node names is data, never a path to follow) and never sends more than
    the node's result said the file holds (``count_bytes``), however the file grows meanwhile.
    ``fullblock``: without it dd counts a short read (a pipe's, a network file system's) as a
    whole block of the count, and stops early."""
    return shlex.join(["dd", f"if={remote}", "iflag=nofollow,skip_bytes,count_bytes,fullblock",
                       f"skip={offset}", f"count={count}", "bs=1M", "status=none"])


class _StreamReceiver(asyncssh.SSHClientSession):
    """The channel's side of ``_stream_copy``: packets joined into STREAM_BATCH blocks and queued
    for the writer; the channel paused while STREAM_QUEUED blocks wait (asyncssh then sends no
    window adjust and sshd stops at the window)."""

    def __init__(self) -> None:
        self.chunks: asyncio.Queue[list[bytes] | None] = asyncio.Queue()
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()
        self.stderr: list[bytes] = []
        self.parts: list[bytes] = []
        self.have = 0
        self.paused = False
        self.chan: asyncssh.SSHClientChannel | None = None

    def connection_made(self, chan: asyncssh.SSHClientChannel) -> None:
        self.chan = chan

    def data_received(self, data: bytes, datatype) -> None:
        if datatype is not None:  # stderr: kept for the error message
            if sum(map(len, self.stderr)) < 4096:
                self.stderr.append(data)
            return
        self.parts.append(data)
        self.have += len(data)
        if self.have >= STREAM_BATCH:
            self.chunks.put_nowait(self.parts)
            self.parts, self.have = [], 0
            if self.chunks.qsize() >= STREAM_QUEUED and not self.paused:
                self.paused = True
                self.chan.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.parts:  # what arrived before a cut is still a good prefix
            self.chunks.put_nowait(self.parts)
            self.parts = []
        self.chunks.put_nowait(None)
        if not self.ended.done():
            self.ended.set_result(exc)

    def caught_up(self) -> None:
        """The writer has taken a block: let sshd send again once the queue is short."""
        if self.paused and self.chunks.qsize() < STREAM_QUEUED:
            self.paused = False
            self.chan.resume_reading()


async def _stream_copy(conn: asyncssh.SSHClientConnection, remote: str, dst, offset: int, size: int,
                       on_block: Callable[[bytes], None] | None) -> None:
    """The file from ``offset`` on as the stdout of ``read_command``, raw bytes.

    Packets are taken as asyncssh's channel hands them over (no stream reader in between),
    joined into STREAM_BATCH blocks and written and hashed in a thread, in order: what a cut
    connection leaves on disk is a clean prefix, as with SFTP. No byte for STALL_SECONDS ends it."""

    def consume(parts: list[bytes]) -> None:
        block = b"".join(parts)
        dst.write(block)
        if on_block is not None:
            on_block(block)  # hashlib releases the GIL: this overlaps with the transfer

    _smaller_reads(conn)
    command = read_command(remote, offset, size - offset)
    chan, receiver = await conn.create_session(_StreamReceiver, command, encoding=None,
                                               window=STREAM_WINDOW, max_pktsize=STREAM_PKTSIZE)
    try:
        got = 0
        while (parts := await _next_batch(receiver, command)) is not None:
            await asyncio.to_thread(consume, parts)
            got += sum(map(len, parts))
            receiver.caught_up()
        exc = await receiver.ended
        if exc is not None:
            raise exc if isinstance(exc, (asyncssh.Error, OSError)) else OSError(str(exc))
        check_end(command, chan.get_exit_status(), b"".join(receiver.stderr), got, size - offset)
    finally:
        chan.close()


async def _next_batch(receiver: _StreamReceiver, command: str) -> list[bytes] | None:
    try:
        return await asyncio.wait_for(receiver.chunks.get(), STALL_SECONDS)
    except asyncio.TimeoutError:
        raise OSError(f"`{command}` sent nothing for {STALL_SECONDS:g} s: given up") from None


def check_end(command: str, status: int | None, stderr: bytes, got: int, want: int) -> None:
    """Raises OSError unless the node's command ended well having sent exactly ``want`` bytes."""
    if status != 0:
        why = stderr.decode(errors="replace").strip() or f"exit status {status}"
        raise OSError(f"`{command}` failed: {why}")
    if got != want:  # the file shrank, or the login shell wrote to stdout
        said = stderr.decode(errors="replace").strip()
        raise OSError(f"`{command}` gave {got} bytes, {want} expected"
                      + (f": {said}" if said else ""))


async def refuse_link(sftp: asyncssh.SFTPClient, remote: str) -> None:
    """What the node names is data, never a path to follow: a link at the path is refused, and
    anything but a regular file (a FIFO would hold sftp-server's open for ever). The node's sha256
    is the check that holds regardless; this says why, before a byte."""
    mode = (await sftp.lstat(remote)).permissions or 0
    if stat.S_ISLNK(mode):
        raise OSError(f"{remote} is a symbolic link on the node: not followed")
    if not stat.S_ISREG(mode):
        raise OSError(f"{remote} is not a regular file on the node")


def _smaller_reads(conn: asyncssh.SSHClientConnection) -> None:
    """Have asyncio read the connection's socket STREAM_RECV bytes at a time (its default: 256 KiB).

    asyncssh keeps unparsed input in a bytes object and slices every packet off its front,
    copying the rest each time: the cost grows with the square of the bytes handed over per
    read. 64 KiB reads measured ~1.3x faster than 256 KiB for a 1 GiB stream (1 MiB: slower
    still). ``max_size`` is an attribute of asyncio's selector socket transport, not public
    API: where it is missing nothing is changed. It stays set for the connection (harmless:
    only bulk data sees a difference)."""
    transport = getattr(conn, "_transport", None)
    if isinstance(getattr(transport, "max_size", None), int) and transport.max_size > STREAM_RECV:
        transport.max_size = STREAM_RECV
