"""Why fleet's gathering rate is bimodal: its real path with one knob changed, interleaved with scp.

    sudo .venv/bin/python bench/transfer_modes.py --size-mib 1024 --runs 7 \
        --variants 'fleet:;rcvbuf-1m:STREAM_RCVBUF=1048576' 

For every run (fleet's path, ``fetch_verified``: exec-channel stream, sha256, rename; and scp)
it records, besides the rate, what tells a fast round from a slow one: the client's CPU seconds
(all its threads, or scp's process), sshd's (its sessions and the remote command included), the
whole machine's busy and steal seconds (steal: time the hypervisor gave to other VMs), and for
fleet the SSH packets received, their average payload (sshd packs more than 32 KiB into one
packet only when its socket is backed up), and the CPU per command name. ``--variants`` names
fleet's path with some of ``fleet.transport.ssh_fetch``'s constants changed. Raw results go to
``bench/results/transfer-modes-<commit>-<label>.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.agent.messages import ReportFile  # noqa: E402
from fleet.collection.fetch import fetch_verified  # noqa: E402
from fleet.inventory import load  # noqa: E402
from fleet.transport import Fanout  # noqa: E402
from fleet.transport import ssh_fetch  # noqa: E402
from fleet.transport.settings import SSHSettings  # noqa: E402
from bench.transfer import random_report  # noqa: E402
from bench.measure import cpu_stat, sshd_cpu  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


class ProcessCPU:
    """CPU seconds per command name of every process seen during a run, sampled from /proc every
    50 ms (a process's last < 50 ms is missed): where the machine's busy time goes, sshd's
    session, ``cat``, ``sftp-server`` and kernel threads included."""

    def __init__(self):
        self.seen: dict[int, tuple[str, float]] = {}
        self.before = self.sample()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    @staticmethod
    def sample() -> dict[int, tuple[str, float]]:
        out = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    head, rest = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)
                except OSError:
                    continue
                f = rest.split()
                out[int(d)] = (head.split("(", 1)[1], (int(f[11]) + int(f[12])) / HZ)
        return out

    def loop(self) -> None:
        while not self.stop.wait(0.05):
            self.seen.update(self.sample())

    def result(self) -> dict[str, float]:
        self.stop.set()
        self.thread.join()
        self.seen.update(self.sample())
        by_name: dict[str, float] = {}
        for pid, (name, cpu) in self.seen.items():
            old = self.before.get(pid)  # (a kernel worker's name changes with its work: pid only)
            used = cpu - old[1] if old else cpu
            name = name.split("-")[0] if name.startswith("kworker") else name
            if used > 0.005:
                by_name[name] = round(by_name.get(name, 0) + used, 3)
        return dict(sorted(by_name.items(), key=lambda kv: -kv[1]))


class Discard:
    def write(self, block: bytes) -> None:
        pass


def fleet_get(c: SSHCluster, report: dict, dest: Path, knobs: dict[str, int], floor: str | None = None) -> int:
    """fleet's gathering path with ssh_fetch's knobs set; the SSH packets received during the fetch.
    ``floor``: "discard" or "hash": fleet's stream alone, its bytes dropped (or only hashed)."""
    for k, v in knobs.items():
        setattr(ssh_fetch, k, v)

    async def go() -> int:
        host = load([c.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(c.ssh_config))) as fan:
            conn = await fan.transport_for(host).connection(host)
            seq = conn._recv_seq
            if floor is None:
                entry = await fetch_verified(fan, host, ReportFile.read(report), dest)
                assert entry["verified"], entry
            else:  # the stream alone: what asyncssh's receiving costs, with no write (and no hash)
                digest = hashlib.sha256() if floor == "hash" else None
                await ssh_fetch._stream_copy(conn, report["path"], Discard(), 0, report["size"],
                                             digest.update if digest else None)
                assert digest is None or digest.hexdigest() == report["sha256"]
            return (conn._recv_seq - seq) & 0xffffffff
    return asyncio.run(go())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--variants", default="fleet:",
                    help="NAME:KNOB=VALUE,...;... ssh_fetch's knobs per variant, e.g. 'rcv1m:STREAM_RCVBUF=1048576'")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="the folder for the raw results")
    ap.add_argument("--label", default="run", help="names the raw file: transfer-modes-<commit>-<label>.json")
    ap.add_argument("--no-by-command", dest="by_command", action="store_false",
                    help="no sampling of /proc during the runs (it takes some CPU of its own)")
    ap.add_argument("--floors", action="store_true",
                    help="also fleet's stream with its bytes dropped, and only hashed: no write")
    args = ap.parse_args()
    size = args.size_mib << 20
    variants = {}
    for spec in args.variants.split(";"):
        name, _, knobs = spec.partition(":")
        variants[name] = {k: int(v) for k, _, v in (kv.partition("=") for kv in knobs.split(",") if kv)}
    defaults = {k: getattr(ssh_fetch, k) for knobs in variants.values() for k in knobs}
    floors = {"floor-discard": "discard", "floor-hash": "hash"} if args.floors else {}
    c = SSHCluster(1)
    dest = Path(tempfile.mkdtemp(prefix="fleet-transfer-modes-", dir="/var/tmp"))
    tools = {"scp": None} | variants | {name: {} for name in floors}
    rows: dict[str, list[dict]] = {name: [] for name in tools}
    try:
        c.start()
        h = c.hosts[0]
        report = random_report(c, size)
        cfg = c.dir / "ssh_config.openssh"
        cfg.write_text(c.ssh_config.read_text() + f"  Port {h.port}\n")
        for round_ in range(args.runs + 1):
            for name, knobs in tools.items():
                for f in dest.iterdir():
                    f.unlink()
                subprocess.run(["sync"], check=True)
                (b0, s0), d0 = cpu_stat(), sshd_cpu(c)
                k0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt + k0.ru_minflt
                procs = ProcessCPU() if args.by_command else None
                c0, t0 = time.process_time(), time.monotonic()
                if knobs is None:
                    subprocess.run(["scp", "-q", "-F", str(cfg), f"{h.address}:{report['path']}", str(dest / name)],
                                   check=True)
                    packets = None
                else:
                    packets = fleet_get(c, report, dest / name, {**defaults, **knobs}, floors.get(name))
                wall = time.monotonic() - t0
                by_command = procs.result() if procs else {}
                k1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                cpu = time.process_time() - c0 + (k1.ru_utime + k1.ru_stime - k0.ru_utime - k0.ru_stime)
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt + k1.ru_minflt - m0
                (b1, s1), sshd = cpu_stat(), sshd_cpu(c) - d0
                busy, steal = b1 - b0, s1 - s0
                assert name in floors or (dest / name).stat().st_size == size
                row = {"mb_per_s": size / wall / 1e6, "wall_s": wall, "client_cpu_s": cpu, "client_page_faults": faults, "sshd_cpu_s": sshd,
                       "machine_busy_s": busy, "steal_s": steal, "packets": packets,
                       "kib_per_packet": size / packets / 1024 if packets else None,
                       "cpu_s_by_command": by_command}
                print(f"[modes] round {round_} {name:<22} {row['mb_per_s']:5.0f} MB/s  client cpu {cpu:5.2f} s  "
                      f"faults {faults:7d}  sshd {sshd:5.2f} s  busy {busy:5.2f} s  steal {steal:4.2f} s" + (f"  {row['kib_per_packet']:5.1f} KiB/pkt" if packets else ""),
                      flush=True)
                print("         " + ", ".join(f"{k} {v:.2f}" for k, v in list(by_command.items())[:8]), flush=True)
                if round_:
                    rows[name].append(row)
    finally:
        for k, v in defaults.items():
            setattr(ssh_fetch, k, v)
        c.stop()
        shutil.rmtree(dest, ignore_errors=True)
    print(f"\n## {args.size_mib} MiB, {args.runs} rounds; / scp = median of paired ratios\n")
    print("| path | MB/s median (min-max) | / scp paired | client CPU s | sshd CPU s | machine busy s | steal s |"
          " KiB/packet |")
    print("|---|---|---|---|---|---|---|---|")
    paired = {}
    for name, v in rows.items():
        rate = [r["mb_per_s"] for r in v]
        paired[name] = [a["mb_per_s"] / b["mb_per_s"] for a, b in zip(v, rows["scp"])]
        med = (lambda k: f"{statistics.median(r[k] for r in v):.2f}" if v[0][k] is not None else "")
        print(f"| {name} | {statistics.median(rate):.0f} ({min(rate):.0f}-{max(rate):.0f}) | "
              f"{statistics.median(paired[name]):.2f} | {med('client_cpu_s')} | {med('sshd_cpu_s')} | "
              f"{med('machine_busy_s')} | {med('steal_s')} | "
              f"{med('kib_per_packet')} |")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "fleet"], capture_output=True,
                           text=True).stdout.splitlines()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"transfer-modes-{commit}-{args.label}.json"
    out.write_text(json.dumps({"size_mib": args.size_mib, "runs": args.runs, "fleet_commit": commit,
                               "variants": variants,
                               "uncommitted_fleet_files": dirty, "rounds": rows, "over_scp_by_round": paired},
                              indent=1))
    print(f"\nraw: {out}")


if __name__ == "__main__":
    main()
