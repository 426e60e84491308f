"""Time to report for the least workload, on this machine as its own node: `fleet profile --hosts
localhost --gpu 0 -- /bin/true`, fleet at two refs side by side, in interleaved pairs (who goes
first alternates by round), after one uncounted warm-up round of each.

The node is this machine with the tests' simulated NVML (two idle GPUs) and their stand-in
profilers (tests/harness), so what is measured is fleet's own work around nsys: the controller's
start, the probe, the plan, the run's agent, the copy home. fleet is measured from `git archive`
snapshots of the two refs, so edits to the working tree change nothing while it runs.

    .venv/bin/python bench/profile_true.py --before 4fa4e70 --after 3d30a37 --pairs 16

Raw results (milliseconds, each pair) go to bench/results/profile-true-BEFORE-AFTER.json.
"""

from __future__ import annotations

import argparse
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

from tests.harness import fakenvml  # noqa: E402
from tests.harness.procs import local_env  # noqa: E402


def snapshot(ref: str, into: Path) -> Path:
    """fleet as it was at ``ref``, unpacked from git into its own folder."""
    into.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "fleet"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def one(tree: Path, env: dict) -> float:
    """Seconds for one `fleet profile` of /bin/true from ``tree`` (its exit status must be 0)."""
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "fleet", "profile", "--hosts", "localhost", "--gpu",
                          "0", "--", "/bin/true"], cwd=tree, env=env, capture_output=True,
                         timeout=120)
    took = time.monotonic() - started
    if out.returncode != 0:
        raise SystemExit(f"fleet at {tree.name} exited {out.returncode}: "
                         f"{out.stderr.decode(errors='replace')[-400:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--pairs", type=int, default=14)
    ap.add_argument("--out", type=Path, help="the raw results' file (default: bench/results/"
                    "profile-true-BEFORE-AFTER.json)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="fleet-bench-true-") as d:
        d = Path(d)
        lib = fakenvml.build(d / "lib")
        scenario = fakenvml.write_scenario(d / "gpus.txt", {"gpus": [{"index": 0}, {"index": 1}]})
        env = {**{k: v for k, v in os.environ.items()
                  if not k.startswith("FLEET_") and k != "PYTHONDONTWRITEBYTECODE"},
               **local_env(fakenvml.env(lib, scenario)), "FLEET_STORE": str(d / "store")}
        trees = {"before": snapshot(args.before, d / "before"),
                 "after": snapshot(args.after, d / "after")}
        for tree in trees.values():  # warm-up: the node's code cache, the page cache
            one(tree, env)
        pairs = []
        for i in range(args.pairs):
            order = ("before", "after") if i % 2 else ("after", "before")
            took = {name: one(trees[name], env) for name in order}
            pairs.append({k: round(v * 1000, 1) for k, v in took.items()})
            print(f"{i + 1:3d}  before {took['before'] * 1000:7.1f} ms  after "
                  f"{took['after'] * 1000:7.1f} ms", flush=True)
    before, after = [p["before"] for p in pairs], [p["after"] for p in pairs]
    summary = {"before_ref": args.before, "after_ref": args.after,
               "before_median_ms": statistics.median(before),
               "after_median_ms": statistics.median(after),
               "after_faster_pairs": sum(a < b for a, b in zip(after, before)), "pairs": pairs}
    print(json.dumps({k: v for k, v in summary.items() if k != "pairs"}))
    out = args.out or REPO / "bench" / "results" / f"profile-true-{args.before}-{args.after}.json"
    out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
