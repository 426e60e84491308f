"""Where OpenSSH's client starts to pay: one file of each size brought home over a host whose
asyncssh connection is already open (as after the agent ran), through fleet's asyncssh stream
and through OpenSSH's client (its own handshake each time), paired, interleaved.

    sudo .venv/bin/python bench/transfer_threshold.py --sizes-mib 8,16,32,64,128 --runs 7

Raw results go to ``bench/results/transfer-threshold-<commit>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
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

from fleet.inventory import load  # noqa: E402
from fleet.agent.messages import ReportFile  # noqa: E402
from fleet.collection.fetch import fetch_verified  # noqa: E402
from fleet.transport import Fanout, compressed, openssh_fetch  # noqa: E402
from fleet.transport.settings import SSHSettings  # noqa: E402
from bench.transfer import Routes, random_report  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402


async def rounds(c: SSHCluster, reports: dict[int, dict], dest: Path, runs: int) -> dict:
    # The two raw paths are what is compared: the wire's compression, which a copy this loopback
    # found slow under load would turn on for the next, stays off (as on a controller without zstandard).
    compressed.zstandard = None
    host = load([c.inventory]).select(["h01"])[0]
    out: dict = {str(mib): {"asyncssh": [], "openssh": []} for mib in reports}
    async with Fanout(SSHSettings(config=str(c.ssh_config))) as fan:
        assert (await fan.run(host, ["true"])).ok  # the connection is open, as after the agent ran
        for round_ in range(runs + 1):
            for mib, report in reports.items():
                order = ("asyncssh", "openssh") if round_ % 2 else ("openssh", "asyncssh")
                for way in order:
                    for f in dest.iterdir():
                        f.unlink()
                    subprocess.run(["sync"], check=True)
                    openssh_fetch.OPENSSH_MIN = 0 if way == "openssh" else 1 << 62
                    seen: list = []
                    start = time.monotonic()
                    entry = await fetch_verified(Routes(fan, seen), host, ReportFile.read(report), dest / f"{way}.out")
                    wall = time.monotonic() - start
                    assert entry["verified"] and seen == [way if way == "openssh" else "stream"], (entry, seen)
                    print(f"[threshold] round {round_} {mib:>4} MiB {way:<8} {wall:6.3f} s", flush=True)
                    if round_:
                        out[str(mib)][way].append(wall)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes-mib", default="8,16,32,64,128")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="the folder for the raw results")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",")]
    c = SSHCluster(1)
    dest = Path(tempfile.mkdtemp(prefix="fleet-threshold-", dir="/var/tmp"))
    try:
        c.start()
        reports = {}
        for mib in sizes:
            report = random_report(c, mib << 20)
            moved = Path(report["path"]).with_name(f"r{mib}.nsys-rep")
            os.replace(report["path"], moved)
            reports[mib] = dict(report, path=str(moved))
        walls = asyncio.run(rounds(c, reports, dest, args.runs))
    finally:
        c.stop()
        subprocess.run(["rm", "-rf", str(dest)])
    print("\n| MiB | asyncssh stream s | OpenSSH's client s | openssh / asyncssh time, paired |\n|---|---|---|---|")
    paired = {}
    for mib, ways in walls.items():
        ratios = [o / a for o, a in zip(ways["openssh"], ways["asyncssh"])]
        paired[mib] = statistics.median(ratios)
        print(f"| {mib} | {statistics.median(ways['asyncssh']):.3f} | {statistics.median(ways['openssh']):.3f} | "
              f"{paired[mib]:.2f} |")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"transfer-threshold-{commit}.json"
    out.write_text(json.dumps({"runs": args.runs, "fleet_commit": commit, "seconds": walls,
                               "openssh_over_asyncssh_time_paired": paired}, indent=1))
    print(f"raw: {out}")


if __name__ == "__main__":
    main()
