"""Change points in nightly histories: fleet's detection (fleet/nightly/changes.py) against Apache Otava's
``compute_change_points``, side by side on the same synthetic histories with a planted truth
(tests/harness/histories.py: 60 nights, the change at night 40, 2 % noise a night).

For each kind of history and each tool: the change points found, those within 3 nights of the planted
one (placed), fleet's with the planted label too, recall, precision, and false change points per 100
histories (found minus placed). Otava knows nothing of a night's neighbours or clocks: it is given
every night (as a threshold alarm would be), and, a second time, only the nights fleet kept as clean,
to tell the method from the knowledge.

Otava is the bench's own (apache-otava 0.8.0 in a virtual environment of its own, called as a
subprocess with the series as JSON), not fleet's dependency:

    python3 -m venv /tmp/otava && /tmp/otava/bin/pip install apache-otava==0.8.0
    .venv/bin/python bench/changepoints.py --otava /tmp/otava/bin/python --histories 200 \\
        --out bench/results/changepoints-COMMIT.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fleet.nightly.changes import judge_series  # noqa: E402
from tests.harness import histories as hs  # noqa: E402

OTAVA = """
import json, sys
from otava.analysis import compute_change_points
found = []
for series in json.load(sys.stdin):
    points, _ = compute_change_points(list(series))  # lists: Otava 0.8.0 fails on numpy arrays with a step
    found.append([int(p.index) for p in points])
json.dump(found, sys.stdout)
"""


def otava(python: str, series: list[list[float]]) -> tuple[list[list[int]], float]:
    t = time.perf_counter()
    done = subprocess.run([python, "-c", OTAVA], input=json.dumps(series), capture_output=True, text=True, check=True)
    return json.loads(done.stdout), time.perf_counter() - t


def tally(found: list[list[int]], truths: list[hs.Truth]) -> dict:
    planted = sum(t.at is not None for t in truths)
    total = sum(len(f) for f in found)
    placed = sum(1 for f, t in zip(found, truths) for i in f if t.at is not None and abs(i - t.at) <= hs.TOLERANCE)
    return {"found": total, "placed": placed, "recall": placed / planted if planted else None,
            "precision": placed / total if total else None, "false_per_100": 100 * (total - placed) / len(truths)}


def scenario(name: str, count: int, python: str | None) -> dict:
    made = [hs.SCENARIOS[name](seed) for seed in range(count)]
    t = time.perf_counter()
    judged = [judge_series("m", "d", points) for points, _ in made]
    fleet_s = time.perf_counter() - t
    truths = [truth for _, truth in made]
    index = [{p.run_id: i for i, p in enumerate(points)} for points, _ in made]
    fleet_found = [[ix[c.run_after] for c in j.changes] for j, ix in zip(judged, index)]
    row = {"histories": count, "fleet": {**tally(fleet_found, truths), "seconds": round(fleet_s, 3),
                                         "labelled_right": hs.score(hs.SCENARIOS[name], range(count),
                                                                    lambda p: judge_series("m", "d", p)).right}}
    if python:
        everything, secs = otava(python, [[p.value for p in points] for points, _ in made])
        row["otava, every night"] = {**tally(everything, truths), "seconds": round(secs, 3)}
        clean = [[i for i, p in enumerate(points) if not p.contaminated_by()] for points, _ in made]
        found, secs = otava(python, [[points[i].value for i in keep] for (points, _), keep in zip(made, clean)])
        row["otava, clean nights"] = {**tally([[keep[i] for i in f] for f, keep in zip(found, clean)], truths),
                                      "seconds": round(secs, 3)}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--histories", type=int, default=200)
    ap.add_argument("--otava", help="a Python with apache-otava installed (the peer)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    results = {"noise": hs.NIGHT_NOISE, "nights": hs.NIGHTS, "at": hs.AT, "tolerance": hs.TOLERANCE,
               "scenarios": {name: scenario(name, args.histories, args.otava) for name in hs.SCENARIOS}}
    for name, row in results["scenarios"].items():
        for tool, r in row.items():
            if isinstance(r, dict):
                print(f"{name:28s} {tool:20s} found {r['found']:4d} placed {r['placed']:4d} recall {r['recall']} "
                      f"precision {r['precision'] and round(r['precision'], 3)} false/100 {r['false_per_100']:.1f} "
                      f"({r['seconds']} s)")
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
