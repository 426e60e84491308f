"""What writing 1 GiB into the page cache costs right after 1 GiB was freed, and after a pause.

    sudo .venv/bin/python bench/page_reuse.py

Every transfer bench writes 1 GiB of fresh page cache per run, after deleting the previous
run's copy. On a VM whose kernel reports free pages to the hypervisor (virtio-balloon free page
reporting, as on the test bed), memory left free for a while is handed back, and writing into it
again costs more. This measures that cost on the machine itself, with no SSH at all. Raw results
go to ``bench/results/page-reuse.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAUSES = (0, 4, 0, 4, 0, 4, 0.5, 2, 8)


def write_gib(path: Path, block: bytes, size: int = 1 << 30) -> tuple[float, float]:
    c0, t0 = time.process_time(), time.monotonic()
    with open(path, "wb") as f:
        for _ in range(size // len(block)):
            f.write(block)
    return time.process_time() - c0, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size-mib", type=int, default=1024, help="what is freed and written again each time")
    ap.add_argument("--pauses", default=",".join(map(str, PAUSES)), help="seconds waited after each free")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="the folder for the raw results")
    args = ap.parse_args()
    size = args.size_mib << 20
    block = os.urandom(1 << 20)
    scratch = Path(tempfile.mkdtemp(prefix="fleet-page-reuse-", dir="/var/tmp"))
    old, new = scratch / "a", scratch / "b"
    rows = []
    try:
        write_gib(old, block, size)
        os.sync()
        for pause in (float(p) for p in args.pauses.split(",")):
            old.unlink()
            os.sync()
            time.sleep(pause)
            cpu, wall = write_gib(new, block, size)
            os.sync()
            rows.append({"size_mib": args.size_mib, "pause_s": pause, "cpu_s": round(cpu, 3), "wall_s": round(wall, 3)})
            print(f"freed {args.size_mib} MiB, waited {pause:4.1f} s, wrote {args.size_mib} MiB: CPU {cpu:.2f} s, "
                  f"wall {wall:.2f} s", flush=True)
            old, new = new, old
    finally:
        for p in (old, new):
            p.unlink(missing_ok=True)
        scratch.rmdir()
    reporting = Path("/sys/module/page_reporting/parameters/page_reporting_order")
    doc = {"rows": rows, "kernel": os.uname().release,
           "page_reporting_order": reporting.read_text().strip() if reporting.exists() else None}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "page-reuse.json").write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
