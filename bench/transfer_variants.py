"""Alternatives for gathering one large file, interleaved with scp, with paired ratios.

    sudo .venv/bin/python bench/transfer_variants.py --size-mib 256 --runs 3 [--only fleet,exec-big,...]

Every variant opens its own connection (as fleet and scp do), writes the copy and
sha256s it while it arrives; the digest is checked. Reports wall-clock MB/s, the
client's CPU seconds (all its threads), the whole machine's busy CPU seconds, and
the SSH packets the client received (average payload per packet).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import asyncssh  # noqa: E402

from fleet.agent.messages import ReportFile  # noqa: E402
from fleet.collection.fetch import fetch_verified  # noqa: E402
from fleet.inventory import load  # noqa: E402
from fleet.transport import Fanout  # noqa: E402
from fleet.transport import ssh as fleet_ssh  # noqa: E402
from fleet.transport import ssh_fetch as fleet_ssh_fetch  # noqa: E402
from fleet.transport.settings import SSHSettings  # noqa: E402
from bench.transfer import random_report  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402

CHUNK = 8 << 20


def busy_jiffies() -> int:
    f = open("/proc/stat").readline().split()[1:]
    vals = list(map(int, f))
    return sum(vals) - vals[3] - vals[4]  # minus idle, iowait


class Ctx:
    def __init__(self, c: SSHCluster, report: dict):
        self.c, self.report = c, report
        self.host = load([c.inventory]).select(["h01"])[0]
        self.transport = fleet_ssh.SSHTransport(SSHSettings(config=str(c.ssh_config)))

    async def connect(self, **extra) -> asyncssh.SSHClientConnection:
        t = self.transport
        return await asyncssh.connect(self.host.address, known_hosts=t.known_hosts(self.host),
                                      **{**t.options(self.host), **extra})


async def _writer(dst, digest, q: asyncio.Queue, chan_resume) -> None:
    while (batch := await q.get()) is not None:
        block = b"".join(batch)

        def consume(block=block):
            dst.write(block)
            digest.update(block)
        await asyncio.to_thread(consume)
        chan_resume()


def _writev(fd: int, pieces: list) -> None:
    """All of pieces to fd, without joining them (os.writev, short writes continued)."""
    i = 0
    while i < len(pieces):
        group = pieces[i:i + 512]
        want = sum(map(len, group))
        n = os.writev(fd, group)
        if n < want:  # short write: finish this group piece by piece
            done = 0
            for p in group:
                if done + len(p) <= n:
                    done += len(p)
                    continue
                mv = memoryview(p)[max(0, n - done):]
                while mv:
                    k = os.write(fd, mv)
                    mv = mv[k:]
                done += len(p)
        i += 512


async def _writer_v(dst, digest, q: asyncio.Queue, chan_resume) -> None:
    fd = dst.fileno()
    while (batch := await q.get()) is not None:
        def consume(batch=batch):
            _writev(fd, batch)
            for p in batch:
                digest.update(p)
        await asyncio.to_thread(consume)
        chan_resume()


async def exec_copy(conn, remote: str, local: str, window: int, pktsize: int, digest, writev=False,
                    recv_size=0) -> int:
    """stdout of `cat` as raw bytes, written and hashed in a thread in CHUNK batches."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    state = {"batch": [], "n": 0, "queued": 0, "chan": None, "paused": False}
    done = loop.create_future()

    class Session(asyncssh.SSHClientSession):
        def connection_made(self, chan):
            state["chan"] = chan

        def data_received(self, data, datatype):
            if datatype is not None:
                return
            state["batch"].append(data)
            state["n"] += len(data)
            if state["n"] >= CHUNK:
                q.put_nowait(state["batch"])
                state["batch"], state["n"] = [], 0
                if q.qsize() >= 2 and not state["paused"]:
                    state["paused"] = True
                    state["chan"].pause_reading()

        def connection_lost(self, exc):
            if state["batch"]:
                q.put_nowait(state["batch"])
            q.put_nowait(None)
            if not done.done():
                done.set_result(exc)

    def resume():
        if state["paused"] and q.qsize() < 2:
            state["paused"] = False
            state["chan"].resume_reading()

    if recv_size:
        conn._transport.max_size = recv_size
    chan, _ = await conn.create_session(Session, f"cat -- {remote}", encoding=None,
                                        window=window, max_pktsize=pktsize)
    with open(local, "wb") as dst:
        await asyncio.gather((_writer_v if writev else _writer)(dst, digest, q, resume), done)
    assert chan.get_exit_status() == 0, chan.get_exit_status()
    return 0


async def sftp_copy(conn, remote, local, digest, **open_kw):
    async with conn.start_sftp_client() as sftp, sftp.open(remote, "rb", **open_kw) as src:
        with open(local, "wb") as dst:
            await fleet_ssh_fetch._ordered_copy(src, dst, 0, digest.update)


async def sftp_multi(conn, remote, local, digest, n: int, size: int):
    """n SFTP channels, each reading every n-th CHUNK; written in order."""
    sftps = [await conn.start_sftp_client() for _ in range(n)]
    files = [await s.open(remote, "rb") for s in sftps]
    nchunks = (size + CHUNK - 1) // CHUNK
    futs: dict[int, asyncio.Future] = {}
    nxt = 0

    def launch():
        nonlocal nxt
        while nxt < nchunks and len(futs) < n + 1:
            futs[nxt] = asyncio.ensure_future(files[nxt % n].read(CHUNK, nxt * CHUNK))
            nxt += 1
    with open(local, "wb") as dst:
        for i in range(nchunks):
            launch()
            block = await futs.pop(i)
            launch()

            def consume(block=block):
                dst.write(block)
                digest.update(block)
            await asyncio.to_thread(consume)
    for f in files:
        await f.close()
    for s in sftps:
        s.exit()


async def sftp_direct(conn, remote, local, digest, nreq: int = 16):
    """One SFTP request per read (sftp-server's max-read-length each), nreq in flight, results
    kept as bytes and joined once per CHUNK: none of asyncssh's bytearray reassembly."""
    import collections
    q: asyncio.Queue = asyncio.Queue()
    async with conn.start_sftp_client() as sftp, sftp.open(remote, "rb") as src:
        rl = src.read_len
        size = (await src.stat()).size
        with open(local, "wb") as dst:
            w = asyncio.ensure_future(_writer(dst, digest, q, lambda: None))
            inflight: collections.deque = collections.deque()
            off = 0
            batch, n = [], 0
            while True:
                while len(inflight) < nreq and off < size:
                    k = min(rl, size - off)
                    inflight.append((off, k, asyncio.ensure_future(src.read(k, off))))
                    off += k
                if not inflight:
                    break
                o, k, f = inflight.popleft()
                data = await f
                while len(data) < k:  # a short read: ask for the rest
                    more = await src.read(k - len(data), o + len(data))
                    if not more:
                        raise OSError("file shrank")
                    data += more
                batch.append(data)
                n += len(data)
                if n >= CHUNK:
                    q.put_nowait(batch)
                    batch, n = [], 0
                    while q.qsize() > 2:
                        await asyncio.sleep(0.001)
            if batch:
                q.put_nowait(batch)
            q.put_nowait(None)
            await w


def openssh_cat(cfg: Path, address: str, remote: str, local: str, digest, hashed: bool = True,
                ssh_opts: tuple = ()) -> None:
    """OpenSSH's own client (C crypto) streaming ``cat``; the pipe read here, written and
    hashed in a thread: what any path pays for the check on top of scp's copy."""
    proc = subprocess.Popen(["ssh", "-F", str(cfg), *ssh_opts, address, f"cat -- {remote}"], stdout=subprocess.PIPE,
                            bufsize=0)
    q: queue.Queue = queue.Queue(4)

    def writer():
        with open(local, "wb") as f:
            while (block := q.get()) is not None:
                f.write(block)
                if hashed:
                    digest.update(block)

    t = threading.Thread(target=writer)
    t.start()
    parts, have = [], 0
    while block := os.read(proc.stdout.fileno(), 1 << 20):
        parts.append(block)
        have += len(block)
        if have >= CHUNK:
            q.put(b"".join(parts))
            parts, have = [], 0
    q.put(b"".join(parts))
    q.put(None)
    t.join()
    assert proc.wait() == 0


def variants(ctx: Ctx, cfg: Path, dest: Path):
    r, size = ctx.report, ctx.report["size"]
    h = ctx.c.hosts[0]

    def fleet():
        async def go():
            async with Fanout(SSHSettings(config=str(ctx.c.ssh_config))) as fan:
                e = await fetch_verified(fan, ctx.host, ReportFile.read(r), dest / "fleet.out")
                assert e["verified"], e
        asyncio.run(go())
        return None

    def mk(fn, **conn_kw):
        def run(name):
            async def go():
                digest = hashlib.sha256()
                conn = await ctx.connect(**conn_kw)
                try:
                    await fn(conn, r["path"], str(dest / f"{name}.out"), digest)
                    pk = conn._recv_seq
                finally:
                    conn.close()
                    await conn.wait_closed()
                assert digest.hexdigest() == r["sha256"]
                return pk
            return asyncio.run(go())
        return run

    big = dict(window=16 << 20, max_pktsize=256 << 10)
    return {
        "fleet": lambda name: fleet(),
        "scp": lambda name: subprocess.run(["scp", "-q", "-F", str(cfg), f"{h.address}:{r['path']}",
                                            str(dest / "scp.out")], check=True) and None,
        "openssh-cat": lambda name: openssh_cat(cfg, h.address, r["path"], str(dest / f"{name}.out"),
                                                hashlib.sha256()),
        "openssh-cat-aes": lambda name: openssh_cat(cfg, h.address, r["path"], str(dest / f"{name}.out"),
                                                    hashlib.sha256(), ssh_opts=("-c", "aes128-gcm@openssh.com")),
        "openssh-cat-nohash": lambda name: openssh_cat(cfg, h.address, r["path"], str(dest / f"{name}.out"),
                                                       None, hashed=False),
        "old-sftp": mk(lambda c, s, d, g: sftp_copy(c, s, d, g)),  # fleet's path before the stream
        "sftp-big": mk(lambda c, s, d, g: sftp_copy(c, s, d, g), **big),
        "sftp-req64": mk(lambda c, s, d, g: sftp_copy(c, s, d, g, max_requests=64), window=16 << 20),
        "sftp-multi4": mk(lambda c, s, d, g: sftp_multi(c, s, d, g, 4, size)),
        "exec-32k": mk(lambda c, s, d, g: exec_copy(c, s, d, 2 << 20, 32 << 10, g)),
        "exec-big": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g)),
        "exec-pkt256-win2m": mk(lambda c, s, d, g: exec_copy(c, s, d, 2 << 20, 256 << 10, g)),
        "exec-pkt32-win16m": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 32 << 10, g)),
        "exec-big-wv": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g, True)),
        "exec-big-wv-w4m": mk(lambda c, s, d, g: exec_copy(c, s, d, 4 << 20, 256 << 10, g, True)),
        "sftp-direct16": mk(lambda c, s, d, g: sftp_direct(c, s, d, g, 16)),
        "sftp-direct32-w16m": mk(lambda c, s, d, g: sftp_direct(c, s, d, g, 32), window=16 << 20),
        "sftp-direct16-w16m": mk(lambda c, s, d, g: sftp_direct(c, s, d, g, 16), window=16 << 20, max_pktsize=256 << 10),
        "sftp-direct32-big": mk(lambda c, s, d, g: sftp_direct(c, s, d, g, 32), window=16 << 20, max_pktsize=256 << 10),
        "exec-w64m": mk(lambda c, s, d, g: exec_copy(c, s, d, 64 << 20, 256 << 10, g)),
        "exec-big-rx64k": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g, recv_size=64 << 10)),
        "exec-big-rx1m": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g, recv_size=1 << 20)),
        "exec-big-rx128k": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g, recv_size=128 << 10)),
        "exec-big-rx32k": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g, recv_size=32 << 10)),
        "exec-big-chacha": mk(lambda c, s, d, g: exec_copy(c, s, d, 16 << 20, 256 << 10, g),
                              encryption_algs=["chacha20-poly1305@openssh.com"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    size = args.size_mib << 20
    c = SSHCluster(1)
    dest = Path(tempfile.mkdtemp(prefix="fleet-transfer-variants-", dir="/var/tmp"))  # this run's own
    try:
        c.start()
        h = c.hosts[0]
        report = random_report(c, size)
        cfg = c.dir / "ssh_config.openssh"
        cfg.write_text(c.ssh_config.read_text() + f"  Port {h.port}\n")
        ctx = Ctx(c, report)
        tools = variants(ctx, cfg, dest)
        if args.only:
            tools = {k: v for k, v in tools.items() if k in args.only.split(",") or k == "scp"}
        res: dict[str, list[tuple[float, float, float]]] = {k: [] for k in tools}
        hz = os.sysconf("SC_CLK_TCK")
        for round_ in range(args.runs + 1):
            for name, run in tools.items():
                for f in dest.iterdir():
                    f.unlink()
                subprocess.run(["sync"], check=True)
                b0, c0, t0 = busy_jiffies(), time.process_time(), time.monotonic()
                pk = run(name)
                wall = time.monotonic() - t0
                cpu, busy = time.process_time() - c0, (busy_jiffies() - b0) / hz
                assert (dest / f"{name}.out").stat().st_size == size
                per = f"{size / pk / 1024:5.0f} KiB/pkt" if pk else ""
                print(f"[variants] round {round_} {name:<16} {size / wall / 1e6:5.0f} MB/s  client cpu {cpu:5.2f} s"
                      f"  machine busy {busy:5.2f} s  wall {wall:5.2f} s {per}", flush=True)
                if round_:
                    res[name].append((size / wall / 1e6, cpu, busy))
    finally:
        c.stop()
        subprocess.run(["rm", "-rf", str(dest)])
    print(f"\n## {args.size_mib} MiB, {args.runs} runs, medians; ratio = paired median of variant/scp\n")
    print("| variant | MB/s | client CPU s | machine busy s | / scp (paired) |\n|---|---|---|---|---|")
    for name, v in res.items():
        ratio = statistics.median(a[0] / b[0] for a, b in zip(v, res["scp"]))
        print(f"| {name} | {statistics.median(x[0] for x in v):.0f} | {statistics.median(x[1] for x in v):.2f} | "
              f"{statistics.median(x[2] for x in v):.2f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
