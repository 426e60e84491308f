"""Bringing a file home over a host's SSH connection: SFTP for small files, the raw stdout of
``cat`` on an exec channel for large ones (see ``SSHTransport.fetch``)."""

from __future__ import annotations

import asyncio
import shlex
from typing import Callable

import asyncssh


SFTP_SESSIONS = 4      # transfers at once over one connection (sshd's MaxSessions is 10)
SFTP_CHUNK = 8 << 20  # bytes per read call; asyncssh keeps several requests in flight within each

# The exec-channel stream for large files: asyncssh's SFTP client spends more client CPU per
# byte than a plain channel (its SFTP packet parsing and reassembly), and on a busy client that
# decides the rate (bench/transfer_variants.py compares the paths; docs/performance-gathering.md).
STREAM_MIN = 8 << 20       # below one chunk the stream gains nothing over SFTP
STREAM_WINDOW = 16 << 20   # channel window: sshd may read this far ahead of us. With asyncssh's
#                            2 MiB, sshd stalls on window adjusts; 16 MiB measured best (4 MiB: -10%).
STREAM_PKTSIZE = 256 << 10  # our max packet size: when its socket is backed up sshd joins what it
#                             has read into one bigger packet (~48 KiB on average instead of 32),
#                             fewer packets for asyncssh to handle in Python (OpenSSH's limit: 256 KiB).
STREAM_BATCH = 1 << 20     # bytes joined and handed to the writer thread at once. With 8 MiB
#                            batches a 1 GiB copy took 1.56x as long (paired, slower in 9 of 9
#                            rounds), with 2 s more client CPU and 0.7 s more of sshd's on the
#                            same two cores; likely because each byte then goes join -> write ->
#                            hash through memory larger than the caches (the client's page faults
#                            were counted: not the cause). 256 KiB-2 MiB measured alike.
#                            (docs/performance-gathering.md, bench/transfer_modes.py)
STREAM_QUEUED = 16         # batches waiting for the writer before the channel is paused (16 MiB)
STREAM_RECV = 64 << 10     # bytes per socket read: see _smaller_reads


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
            ahead = asyncio.ensure_future(src.read(SFTP_CHUNK, offset)) if len(block) == SFTP_CHUNK else None
            await asyncio.to_thread(consume, block)
    finally:
        if ahead is not None and not ahead.done():
            ahead.cancel()


async def _stream_copy(conn: asyncssh.SSHClientConnection, remote: str, dst, offset: int, size: int,
                       on_block: Callable[[bytes], None] | None) -> None:
    """The file from ``offset`` on as the stdout of ``cat`` (``tail -c +N`` to resume), raw bytes.

    Packets are taken as asyncssh's channel hands them over (no stream reader in between),
    joined into STREAM_BATCH blocks and written and hashed in a thread, in order: what a cut
    connection leaves on disk is a clean prefix, as with SFTP. While the writer is behind, the
    channel is paused (asyncssh then sends no window adjust and sshd stops at the window)."""
    chunks: asyncio.Queue[list[bytes] | None] = asyncio.Queue()
    ended: asyncio.Future = asyncio.get_running_loop().create_future()
    stderr: list[bytes] = []
    state: dict = {"parts": [], "have": 0, "paused": False, "chan": None}

    class Stdout(asyncssh.SSHClientSession):
        def connection_made(self, chan: asyncssh.SSHClientChannel) -> None:
            state["chan"] = chan

        def data_received(self, data: bytes, datatype) -> None:
            if datatype is not None:  # stderr: kept for the error message
                if sum(map(len, stderr)) < 4096:
                    stderr.append(data)
                return
            state["parts"].append(data)
            state["have"] += len(data)
            if state["have"] >= STREAM_BATCH:
                chunks.put_nowait(state["parts"])
                state["parts"], state["have"] = [], 0
                if chunks.qsize() >= STREAM_QUEUED and not state["paused"]:
                    state["paused"] = True
                    state["chan"].pause_reading()

        def connection_lost(self, exc: Exception | None) -> None:
            if state["parts"]:  # what arrived before a cut is still a good prefix
                chunks.put_nowait(state["parts"])
                state["parts"] = []
            chunks.put_nowait(None)
            if not ended.done():
                ended.set_result(exc)

    def consume(parts: list[bytes]) -> None:
        block = b"".join(parts)
        dst.write(block)
        if on_block is not None:
            on_block(block)  # hashlib releases the GIL: this overlaps with the transfer

    _smaller_reads(conn)
    argv = ["cat", "--", remote] if not offset else ["tail", "-c", f"+{offset + 1}", "--", remote]
    chan, _ = await conn.create_session(Stdout, shlex.join(argv), encoding=None,
                                        window=STREAM_WINDOW, max_pktsize=STREAM_PKTSIZE)
    try:
        got = 0
        while (parts := await chunks.get()) is not None:
            await asyncio.to_thread(consume, parts)
            got += sum(map(len, parts))
            if state["paused"] and chunks.qsize() < STREAM_QUEUED:
                state["paused"] = False
                chan.resume_reading()
        exc = await ended
        if exc is not None:
            raise exc if isinstance(exc, (asyncssh.Error, OSError)) else OSError(str(exc))
        status = chan.get_exit_status()
        if status != 0:
            why = b"".join(stderr).decode(errors="replace").strip() or f"exit status {status}"
            raise OSError(f"`{shlex.join(argv)}` failed: {why}")
        if got != size - offset:  # the file changed, or the login shell wrote to stdout
            raise OSError(f"`{shlex.join(argv)}` gave {got} bytes, {size - offset} expected")
    finally:
        chan.close()


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
