"""The team store against its peers, side by side on one SeaweedFS and one PostgreSQL (started here on
loopback as the tests start them): a 1 GiB report sent by fleet against boto3's own upload_file with the
same part size and a SHA-256 checksum; the client's peak memory as the report grows; `fleet reports ls`
over 100,000 catalogued runs; `fleet reports push` of an embedded store of 200 small runs, then again
(all unchanged). Prints one JSON document; run as root from the checkout's root:

    .venv/bin/python bench/team_store.py > bench/results/team-store-COMMIT.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.harness.teamstore import BUCKET, TeamSite, embedded_run  # noqa: E402

ROUNDS = 3


def big_file(path: Path, mib: int) -> str:
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(mib):
            block = hashlib.sha256(str(i).encode()).digest() * 32768
            f.write(block)
            digest.update(block)
    return digest.hexdigest()


def child_peak_rss(code: str, env: dict) -> tuple[float, int]:
    """Seconds and peak RSS (KiB) of a fresh Python running ``code``."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss


def upload_code(kind: str, path: Path, sha: str, key: str) -> str:
    if kind == "fleet":
        return (f"from pathlib import Path; from fleet.store.team import objects; "
                f"objects.upload(objects.client(), {BUCKET!r}, {key!r}, Path({str(path)!r}), {sha!r})")
    return ("import boto3; from boto3.s3.transfer import TransferConfig; from fleet.store.team import objects; "
            f"objects.client().upload_file({str(path)!r}, {BUCKET!r}, {key!r}, "
            "ExtraArgs={'ChecksumAlgorithm': 'SHA256'}, "
            "Config=TransferConfig(multipart_chunksize=objects.PART_SIZE, multipart_threshold=objects.PART_SIZE, "
            "max_concurrency=objects.WORKERS))")


def pushed(site: TeamSite, work: Path, runs: int) -> list[float]:
    """Seconds of `fleet reports push` of an embedded store of ``runs`` small runs (a report and a
    summary each), then of the same push again, every run unchanged."""
    root = work / "pushed"
    root.mkdir(mode=0o700)
    for i in range(runs):
        embedded_run(root, f"20261201-{i // 60:02d}{i % 60:02d}00-{i:04x}", {"gx03": f"report {i}".encode() * (i + 1)},
                     kernel_ns=1000 + i)
    times = []
    for _ in ("first", "again"):
        start = time.perf_counter()
        r = site.fleet("reports", "push", env=site.env("alice", root))
        times.append(round(time.perf_counter() - start, 2))
        assert r.returncode == 0 and f"{runs} run(s) in the team store" in r.stdout, r.stderr[-2000:]
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=1024, help="the report sent by fleet and by boto3")
    ap.add_argument("--rounds", type=int, default=ROUNDS)
    ap.add_argument("--memory-mib", default="128,512,1024,2048", help="the reports whose peak memory is measured")
    ap.add_argument("--catalogued", type=int, default=100_000, help="runs in the catalog `reports ls` lists")
    ap.add_argument("--pushed", type=int, default=200, help="runs of an embedded store `reports push` sends")
    a = ap.parse_args()
    upload = "upload_1gib" if a.mib == 1024 else f"upload_{a.mib}mib"
    site = TeamSite(people=("alice",))
    results: dict = {"commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                              text=True).stdout.strip(), upload: [], "memory": {}}
    try:  # a start that fails half-way stops what it started too
        site.start()
        work = site.dir / "bench"
        work.mkdir()
        env = {**os.environ, **site.env("alice")}
        path = work / "report.bin"
        sha = big_file(path, a.mib)
        for n in range(a.rounds):  # paired, alternating which goes first
            order = ("fleet", "boto3") if n % 2 == 0 else ("boto3", "fleet")
            row = {}
            for kind in order:
                row[kind] = round(child_peak_rss(upload_code(kind, path, sha, f"team/alice/bench/{kind}-{n}"),
                                                 env)[0], 2)
            results[upload].append(row)
        # 128 MiB is two parts in flight; from 512 MiB on, all WORKERS are: flat means 512, 1024 and
        # 2048 MiB alike.
        for mib in (int(m) for m in a.memory_mib.split(",")):
            small = work / f"r{mib}.bin"
            s = big_file(small, mib)
            code = upload_code("fleet", small, s, f"team/alice/bench/mem-{mib}")
            probe = ("import resource, runpy; " + code +
                     "; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")
            out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
            results["memory"][f"{mib} MiB"] = f"{int(out.stdout.split()[-1]) // 1024} MiB peak RSS"
            small.unlink()
        site.psql("INSERT INTO fleet.runs (run_id, site, day, started, status, manifest, manifest_sha256) "
                  "SELECT '20250101-' || lpad(g::text, 6, '0') || '-beef', 'lab', '2025-01-01', "
                  f"'2025-01-01T00:00:00+0000', 'complete', '{{}}', 'x' FROM generate_series(1, {a.catalogued}) g;"
                  "INSERT INTO fleet.reports (run_id, host, name, tool, status, started) "
                  "SELECT run_id, 'gx01', 'r.nsys-rep', 'nsys', 'complete', started FROM fleet.runs "
                  "WHERE run_id LIKE '20250101-%'; ANALYZE;", role="alice")
        for args in (["reports", "ls", "--since", "2026-01-01"], ["reports", "ls", "--host", "gx01", "--json"],
                     ["reports", "ls"]):
            times = []
            for _ in range(a.rounds):
                start = time.perf_counter()
                r = site.fleet(*args, env=site.env("alice"))
                times.append(round(time.perf_counter() - start, 2))
                assert r.returncode == 0, r.stderr
            results[f"fleet {' '.join(args)} ({a.catalogued:,} runs)"] = times
        results[f"fleet reports push ({a.pushed} runs): first, again"] = pushed(site, work, a.pushed)
    finally:
        site.stop()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
