"""Where fleet's client CPU goes while it gathers one large file (cProfile of fetch_verified).

    sudo .venv/bin/python bench/transfer_profile.py --size-mib 256
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import shutil
import pstats
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.agent.messages import ReportFile  # noqa: E402
from fleet.collection.fetch import fetch_verified  # noqa: E402
from fleet.inventory import load  # noqa: E402
from fleet.transport import Fanout  # noqa: E402
from fleet.transport.settings import SSHSettings  # noqa: E402
from bench.transfer import random_report  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args()
    size = args.size_mib << 20
    c = SSHCluster(1)
    dest = Path(tempfile.mkdtemp(prefix="fleet-transfer-profile-", dir="/var/tmp"))  # this run's own
    try:
        c.start()
        report = random_report(c, size)

        async def go():
            host = load([c.inventory]).select(["h01"])[0]
            async with Fanout(SSHSettings(config=str(c.ssh_config))) as fan:
                await fan.run(host, ["true"])  # connection up before the clock starts
                prof = cProfile.Profile()
                t0, c0 = time.monotonic(), time.process_time()
                prof.enable()
                entry = await fetch_verified(fan, host, ReportFile.read(report), dest / "out")
                prof.disable()
                wall, cpu = time.monotonic() - t0, time.process_time() - c0
                assert entry["verified"], entry
                print(f"{size / wall / 1e6:.0f} MB/s, client CPU {cpu:.2f} s for {wall:.2f} s wall")
                pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
        asyncio.run(go())
    finally:
        c.stop()
        shutil.rmtree(dest, ignore_errors=True)


if __name__ == "__main__":
    main()
