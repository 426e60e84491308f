"""Bringing one large report home: fleet against OpenSSH's scp and sftp, same sshd, same run.

    sudo .venv/bin/python bench/transfer.py --size-mib 1024 --runs 9

One real sshd on loopback holds a file of random bytes. Interleaved after a
warm-up round: fleet's gathering path (the file opened and sized over asyncssh
SFTP, a large one then streamed as ``cat``'s stdout on an exec channel, written
in order, the sha256 computed as it arrives and checked against the node's,
then the atomic rename), ``scp`` and ``sftp -b`` as OpenSSH ships them. Each destination is
deleted and ``sync`` called before every run. Raw results, with the per-round ratios, go to
``bench/results/transfer-<MiB>-<commit>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.store.collect import fetch_verified  # noqa: E402
from fleet.inventory import load  # noqa: E402
from fleet.transport import Fanout  # noqa: E402
from fleet.transport.settings import SSHSettings  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402


def fleet_get(c: SSHCluster, report: dict, dest: Path) -> None:
    async def go():
        host = load([c.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(c.ssh_config))) as fan:
            entry = await fetch_verified(fan, host, report, dest)
            assert entry["verified"], entry
    asyncio.run(go())


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    size = args.size_mib << 20
    c = SSHCluster(1)
    dest = None
    results: dict[str, list[float]] = {"fleet": [], "scp": [], "sftp": []}
    try:
        c.start()
        h = c.hosts[0]
        report = random_report(c, size)
        src = report["path"]
        cfg = c.dir / "ssh_config.openssh"
        cfg.write_text(c.ssh_config.read_text() + f"  Port {h.port}\n")
        dest = Path(tempfile.mkdtemp(prefix="fleet-transfer-bench-", dir="/var/tmp"))
        batch = c.dir / "sftp.batch"
        batch.write_text(f"get {src} {dest / 'sftp.out'}\n")
        tools = {
            "fleet": lambda: fleet_get(c, report, dest / "fleet.out"),
            "scp": lambda: subprocess.run(["scp", "-q", "-F", str(cfg), f"{h.address}:{src}", str(dest / "scp.out")],
                                          check=True),
            "sftp": lambda: subprocess.run(["sftp", "-q", "-F", str(cfg), "-b", str(batch), h.address], check=True,
                                           stdout=subprocess.DEVNULL),
        }
        for round_ in range(args.runs + 1):
            for name, run in tools.items():
                for f in dest.iterdir():
                    f.unlink()
                subprocess.run(["sync"], check=True)
                start = time.monotonic()
                run()
                wall = time.monotonic() - start
                assert (dest / f"{name}.out").stat().st_size == size
                print(f"[bench] round {round_} {name:<5} {wall:6.2f} s  {size / wall / 1e6:6.0f} MB/s", flush=True)
                if round_:
                    results[name].append(size / wall / 1e6)
    finally:
        c.stop()
        if dest is not None:
            subprocess.run(["rm", "-rf", str(dest)])
    print(f"\n## transfer of {args.size_mib} MiB over one loopback sshd, {args.runs} runs (MB/s, median (min-max))\n")
    print("| tool | MB/s |\n|---|---|")
    for name, v in results.items():
        print(f"| {name} | {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f}) |")
    for peer in ("scp", "sftp"):
        paired = statistics.median(f / p for f, p in zip(results["fleet"], results[peer]))
        print(f"\nfleet / {peer} throughput: {statistics.median(results['fleet']) / statistics.median(results[peer]):.2f}"
              f" (paired {paired:.2f})")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    out = REPO / "bench" / "results" / f"transfer-{args.size_mib}-{commit}.json"
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "fleet"], capture_output=True,
                           text=True).stdout.splitlines()
    paired = {peer: [f / p for f, p in zip(results["fleet"], results[peer])] for peer in ("scp", "sftp")}
    out.write_text(json.dumps({"size_mib": args.size_mib, "runs": args.runs, "fleet_commit": commit,
                               "uncommitted_fleet_files": dirty, "mb_per_s": results,
                               "fleet_over_peer_by_round": paired}, indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
