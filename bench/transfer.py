"""Bringing one large report home: fleet against OpenSSH's scp and sftp, and rsync, same sshd, same run.

    sudo .venv/bin/python bench/transfer.py --size-mib 1024 --runs 9 [--label NAME] [--content export]

One real sshd on loopback holds a file of random bytes, or with ``--content export`` a run's two
large files: an 85 MiB report (random bytes, ``--report-mib``) and an nsys SQLite export of the size asked
(``bench/synthetic_export.py``: it compresses as exports do), brought home in that order; the
pairs are then fleet against itself with the wire's compression off, ``scp``, and ``scp -C`` and
``rsync -z``, the peers that compress too. Interleaved after a
warm-up round: fleet's gathering path (``fetch_verified``: a large file through OpenSSH's own
client running dd on the node, written in order, the sha256 computed as it arrives and checked
against the node's, then the atomic rename), ``scp``, ``sftp -b`` and ``rsync`` over ssh as
shipped (OpenSSH's default cipher order, chacha20 first), ``scp -c aes128-gcm`` (the cipher
fleet's path chooses where the CPU has AES instructions), and fleet with the OpenSSH path off
(``asyncssh``: its own stream, as on a controller without ``ssh``). Each destination is
deleted and ``sync`` called before every run. Raw results, with the per-round ratios and the
way fleet's copies came, go to ``bench/results/transfer-<MiB>-<commit>[-label].json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.agent.messages import ReportFile  # noqa: E402
from fleet.collection.fetch import fetch_verified  # noqa: E402
from fleet.inventory import load  # noqa: E402
from fleet.transport import Fanout, openssh_fetch  # noqa: E402
from fleet.transport.settings import SSHSettings  # noqa: E402
from fleet.transport import compressed  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402
from bench.synthetic_export import grow  # noqa: E402


class Routes:
    """The Fanout, with the way each fetch came recorded (``SSHTransport.fetch`` returns it)."""

    def __init__(self, fan: Fanout, seen: list):
        self.fan, self.seen = fan, seen

    async def fetch(self, *args, **kwargs) -> str:
        self.seen.append(route := await self.fan.fetch(*args, **kwargs))
        return route


def fleet_get(c: SSHCluster, reports: list[dict], dest: Path, seen: list, openssh: bool = True,
              zstd: bool = True) -> None:
    """Each of ``reports`` brought home into ``dest`` in turn, over one connection, as a run's files are."""
    async def go():
        host = load([c.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(c.ssh_config))) as fan:
            for report in reports:
                entry = await fetch_verified(Routes(fan, seen), host, ReportFile.read(report),
                                             dest / Path(report["path"]).name)
                assert entry["verified"], entry
    least, library = openssh_fetch.OPENSSH_MIN, compressed.zstandard
    openssh_fetch.OPENSSH_MIN = least if openssh else 1 << 62
    compressed.zstandard = library if zstd else None  # as on a controller without zstandard
    try:
        asyncio.run(go())
    finally:
        openssh_fetch.OPENSSH_MIN, compressed.zstandard = least, library


def random_report(c: SSHCluster, size: int) -> dict:
    """A file of ``size`` random bytes on the sshd host, as the agent would describe a report."""
    src = c.scratch("transfer") / "big.nsys-rep"
    digest = hashlib.sha256()
    with open(src, "wb") as f:
        for _ in range(size >> 20):
            block = os.urandom(1 << 20)
            digest.update(block)
            f.write(block)
    src.chmod(0o644)
    return {"path": str(src), "size": size, "sha256": digest.hexdigest()}


def export_report(c: SSHCluster, size: int) -> dict:
    """An nsys SQLite export of about ``size`` bytes on the sshd host, described as the agent would."""
    src = grow(c.scratch("transfer") / "big.sqlite", size)
    src.chmod(0o644)
    with open(src, "rb") as f:
        digest = hashlib.file_digest(f, "sha256")
    return {"path": str(src), "size": src.stat().st_size, "sha256": digest.hexdigest()}


# Each fleet run is paired with the peer run beside it. asyncssh/scp: fleet's path on a
# controller without OpenSSH's client (or a host whose connection ssh cannot be told).
PAIRS = [("fleet", "scp"), ("fleet", "sftp"), ("fleet", "rsync"), ("fleet", "scp-aes"), ("asyncssh", "scp")]
# An export: fleet with the wire's compression and without, and the peers that compress.
EXPORT_PAIRS = [("fleet", "fleet-raw"), ("fleet", "scp"), ("fleet", "scp-C"), ("fleet", "rsync-z")]


def timed(run, dest: Path, size: int) -> float:
    """``run`` timed bringing the files into ``dest``, emptied and synced first; ``size``: their bytes."""
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir()
    subprocess.run(["sync"], check=True)
    start = time.monotonic()
    run()
    wall = time.monotonic() - start
    assert sum(f.stat().st_size for f in dest.iterdir()) == size
    return wall


def tools(c: SSHCluster, reports: list[dict], dest: Path, routes: dict) -> dict:
    """Each way measured, by name: a function that brings every report into ``dest / name``."""
    h = c.hosts[0]
    cfg = c.dir / "ssh_config.openssh"
    cfg.write_text(c.ssh_config.read_text() + f"  Port {h.port}\n")
    remote = [f"{h.address}:{r['path']}" for r in reports]
    batch = c.dir / "sftp.batch"
    batch.write_text("".join(f"get {r['path']} {dest / 'sftp'}/\n" for r in reports))

    return {
        "fleet": lambda: fleet_get(c, reports, dest / "fleet", routes["fleet"]),
        "asyncssh": lambda: fleet_get(c, reports, dest / "asyncssh", routes["asyncssh"], openssh=False),
        "fleet-raw": lambda: fleet_get(c, reports, dest / "fleet-raw", routes["fleet-raw"], zstd=False),
        "scp": lambda: subprocess.run(["scp", "-q", "-F", str(cfg), *remote, f"{dest / 'scp'}/"], check=True),
        "scp-aes": lambda: subprocess.run(["scp", "-q", "-F", str(cfg), "-c", "aes128-gcm@openssh.com", *remote,
                                           f"{dest / 'scp-aes'}/"], check=True),
        "scp-C": lambda: subprocess.run(["scp", "-q", "-C", "-F", str(cfg), *remote, f"{dest / 'scp-C'}/"], check=True),
        "sftp": lambda: subprocess.run(["sftp", "-q", "-F", str(cfg), "-b", str(batch), h.address], check=True,
                                       stdout=subprocess.DEVNULL),
        "rsync": lambda: subprocess.run(["rsync", "-q", "-e", f"ssh -F {cfg}", *remote, f"{dest / 'rsync'}/"],
                                        check=True),
        "rsync-z": lambda: subprocess.run(["rsync", "-q", "-z", "-e", f"ssh -F {cfg}", *remote,
                                           f"{dest / 'rsync-z'}/"], check=True),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--label", default="")
    ap.add_argument("--content", choices=("random", "export"), default="random")
    ap.add_argument("--report-mib", type=int, default=85, help="with --content export: the report's size")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="the folder for the raw results")
    args = ap.parse_args()
    size = args.size_mib << 20
    pairs = EXPORT_PAIRS if args.content == "export" else PAIRS
    c = SSHCluster(1)
    dest = None
    routes: dict[str, list[str]] = {"fleet": [], "asyncssh": [], "fleet-raw": []}
    try:
        c.start()
        # An export comes home after its run's report (here 85 MiB, the 30 s workload's on the H200):
        # the report's copy is what tells fleet how fast the link is.
        reports = ([random_report(c, args.report_mib << 20), export_report(c, size)] if args.content == "export"
                   else [random_report(c, size)])
        size = sum(r["size"] for r in reports)
        dest = Path(tempfile.mkdtemp(prefix="fleet-transfer-bench-", dir="/var/tmp"))
        ways = tools(c, reports, dest, routes)
        results: dict[str, dict[str, list[float]]] = {f"{a}/{b}": {a: [], b: []} for a, b in pairs}
        for round_ in range(args.runs + 1):
            for a, b in pairs:
                for name in (a, b) if round_ % 2 else (b, a):  # who goes first alternates by round
                    wall = timed(ways[name], dest / name, size)
                    print(f"[bench] round {round_} {a}/{b}: {name:<9} {wall:6.2f} s  {size / wall / 1e6:6.0f} MB/s",
                          flush=True)
                    if round_:
                        results[f"{a}/{b}"][name].append(size / wall / 1e6)
    finally:
        c.stop()
        if dest is not None:
            subprocess.run(["rm", "-rf", str(dest)])
    print(f"\n## transfer of {args.size_mib} MiB ({args.content}) over one loopback sshd, {args.runs} rounds (MB/s, median (min-max))\n")
    print("| pair | fleet side | peer | paired ratio (median, min-max) |\n|---|---|---|---|")
    paired = {}
    for pair, sides in results.items():
        a, b = pair.split("/")
        ratios = [x / y for x, y in zip(sides[a], sides[b])]
        paired[pair] = {"median": statistics.median(ratios), "by_round": ratios}
        show = lambda v: f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"
        print(f"| {pair} | {show(sides[a])} | {show(sides[b])} | {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) |")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"transfer-{args.size_mib}-{commit}{'-' + args.label if args.label else ''}.json"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "fleet"], capture_output=True,
                           text=True).stdout.splitlines()
    out.write_text(json.dumps({"size_mib": args.size_mib, "content": args.content, "bytes": size, "runs": args.runs,
                               "fleet_commit": commit, "uncommitted_fleet_files": dirty, "pairs": pairs,
                               "fleet_routes": routes,
                               "mb_per_s": results, "paired": paired,
                               "versions": {"ssh": subprocess.run(["ssh", "-V"], capture_output=True,
                                                                  text=True).stderr.strip(),
                                            "zstd": subprocess.run(["zstd", "--version"], capture_output=True,
                                                                   text=True).stdout.strip(),
                                            "rsync": subprocess.run(["rsync", "--version"], capture_output=True,
                                                                    text=True).stdout.splitlines()[0]}},
                              indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
