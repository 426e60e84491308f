"""fleet on Slurm against raw sbatch, on the same test cluster in one run.

    sudo .venv/bin/python bench/slurm.py --runs 5

1. Round trip: ``fleet profile --partition gpu -- true`` (script rendered, agent
   staged, submitted, watched, each rank planned on its node, report hashed,
   gathered and verified into the store) against ``ssh login sbatch --wait``
   of a job that runs ``srun nsys profile true`` (OpenSSH, same login sshd,
   same stand-in nsys), interleaved. The difference is fleet's overhead.
2. Status load with 20 jobs in flight: slurmctld's own RPC counters (``sdiag``)
   over 5 poll intervals, for ``fleet jobs`` (one batched call per interval)
   against a loop of ``squeue -j ID`` per job, the way a script polls.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.slurm import SlurmCluster, configure_login  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402

INTERVALS = 5
IN_FLIGHT = 20


def fleet(c: SSHCluster, store: str, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", **c.env(), "FLEET_STORE": store, "PYTHONPATH": str(REPO)}  # this checkout's fleet
    return subprocess.run([sys.executable, "-m", "fleet", *args], env=env, cwd=REPO, capture_output=True, text=True,
                          check=True)


def ssh(c: SSHCluster, command: str) -> subprocess.CompletedProcess:
    h = c.hosts[0]
    return subprocess.run(["ssh", "-F", str(c.ssh_config), "-p", str(h.port), h.address, command],
                          capture_output=True, text=True, check=True)


def job_rpcs(s: SlurmCluster) -> int:
    """Job-information RPCs slurmctld has served since the last reset (squeue, scontrol show job)."""
    out = s.run("sdiag").stdout
    return sum(int(n) for n in re.findall(r"REQUEST_JOB_INFO\w*\s*\(\s*\d+\)\s*count:(\d+)", out))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="the folder for the raw results")
    args = ap.parse_args()
    s, c = SlurmCluster(2), SSHCluster(1)
    store = tempfile.mkdtemp(prefix="fleet-bench-store-")
    walls: dict[str, list[float]] = {"fleet": [], "sbatch": []}
    try:
        s.start()
        configure_login(s, c)
        c.start()
        nsys = c.hosts[0].vars["nsys_path"]
        raw = (f"cd {c.runs} && sbatch --wait --parsable --partition=gpu -o raw-%j.out --wrap "
               f"'mkdir -p raw-$SLURM_JOB_ID && srun {nsys} profile -o raw-$SLURM_JOB_ID/rank%q{{SLURM_PROCID}} true'")
        tools = {"fleet": lambda: fleet(c, store, "profile", "--partition", "gpu", "--poll", "1", "--", "true"),
                 "sbatch": lambda: ssh(c, raw)}
        for round_ in range(args.runs + 1):
            for name, run in tools.items():
                start = time.monotonic()
                run()
                wall = time.monotonic() - start
                print(f"[bench] round {round_} {name:<6} {wall:5.2f} s", flush=True)
                if round_:  # round 0 warms caches
                    walls[name].append(wall)

        for _ in range(IN_FLIGHT):
            fleet(c, store, "profile", "--partition", "gpu", "--no-wait", "--", "sleep", "120")
        listing = json.loads(fleet(c, store, "jobs", "--json").stdout)
        ids = [j["job_id"] for j in listing.get("data", listing)["jobs"]]  # --json's envelope
        assert len(ids) == IN_FLIGHT, ids
        rpcs = {}
        for name, poll in (("fleet jobs", lambda: fleet(c, store, "jobs")),
                           ("squeue -j per job", lambda: ssh(c, " ; ".join(f"squeue -h -j {j}" for j in ids)))):
            s.run("sdiag", "--reset")
            for _ in range(INTERVALS):
                poll()
                time.sleep(1)
            rpcs[name] = job_rpcs(s)
            print(f"[bench] {name}: {rpcs[name]} job-information RPCs in {INTERVALS} intervals", flush=True)
        s.run("scancel", *ids)
    finally:
        c.stop()
        s.stop()
        subprocess.run(["rm", "-rf", store])

    fl, sb = statistics.median(walls["fleet"]), statistics.median(walls["sbatch"])
    print(f"\n## Slurm round trip, {args.runs} runs (seconds, median (min-max))\n")
    print("| way | wall |\n|---|---|")
    for name, v in walls.items():
        print(f"| {name} | {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) |")
    print(f"\nfleet overhead over raw sbatch --wait: {fl - sb:+.2f} s (ratio {fl / sb:.2f})")
    print(f"\n## status calls with {IN_FLIGHT} jobs in flight, {INTERVALS} poll intervals (slurmctld sdiag)\n")
    print("| poller | job-information RPCs | per interval |\n|---|---|---|")
    for name, n in rpcs.items():
        print(f"| {name} | {n} | {n / INTERVALS:.1f} |")
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / "slurm.json"
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "fleet"], capture_output=True,
                           text=True).stdout.splitlines()
    out.write_text(json.dumps({"runs": args.runs, "wall_s": walls, "job_info_rpcs": rpcs,
                               "intervals": INTERVALS, "in_flight": IN_FLIGHT, "fleet_commit": commit,
                               "uncommitted_fleet_files": dirty}, indent=1))


if __name__ == "__main__":
    main()
