"""Where the node agent's time goes before a profiler starts, on the node itself (a GPU node: its
real NVML, nsys and ncu): the shipped agent in probe mode, as ``fleet profile`` asks it (no
``nsys status -e``), run as fleet starts it, its code cache warm, against ``python3 -c pass``;
then once under cProfile, the functions that took the most of it.

    PYTHONPATH=. /opt/torch/.venv/bin/python3 bench/agent_profile.py --python python3 --runs 9

Prints, for each run, the agent's wall time and its own ``elapsed_ms`` (the probe's sections,
after the interpreter and the bundle's imports), the medians, and the profile's top functions by
cumulative time. The Python that runs this script needs fleet's agent modules and the NVML
binding (nvidia-ml-py) to build the bundle; ``--python`` is the node's, which runs the agent.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet.agent.bundle import BOOTSTRAP, bundle  # noqa: E402

ARGS = {"mode": "probe", "tools": {}, "environment_check": False}  # as lab/profile.py's probe asks
# BOOTSTRAP under cProfile: the agent runs in this namespace as it would (it finds `b` here), and its
# exit is caught so that the profile is printed, to stderr, after it.
PROFILED = """import cProfile, pstats, sys, zlib
b = sys.stdin.buffer.read()
profile = cProfile.Profile()
profile.enable()
try:
    exec(compile(zlib.decompress(b), '<fleet-agent>', 'exec'))
except SystemExit:
    pass
profile.disable()
pstats.Stats(profile, stream=sys.stderr).sort_stats('cumulative').print_stats(%d)
"""


def timed(argv: list[str], stdin: bytes | None) -> tuple[float, str]:
    start = time.monotonic()
    done = subprocess.run(argv, input=stdin, capture_output=True, timeout=120)
    took = time.monotonic() - start
    if done.returncode != 0:
        sys.exit(f"{argv[0]} exited {done.returncode}: {done.stderr.decode(errors='replace')[-500:]}")
    return took, done.stdout.decode(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", default="python3", help="the node's Python, which runs the agent")
    ap.add_argument("--runs", type=int, default=9)
    ap.add_argument("--top", type=int, default=30, help="functions of the profile to print")
    args = ap.parse_args()
    payload = bundle() + json.dumps(ARGS).encode()
    agent = [args.python, "-c", BOOTSTRAP, "-"]
    timed(agent, payload)  # the code cache filled, as every call after a node's first finds it
    walls, elapsed, bare = [], [], []
    for run in range(args.runs):
        wall, out = timed(agent, payload)
        found = re.search(r'"elapsed_ms":\s*([0-9.]+)', out)
        walls.append(wall)
        elapsed.append(float(found.group(1)) if found else float("nan"))
        bare.append(timed([args.python, "-c", "pass"], None)[0])
        print(f"run {run}: agent {wall * 1000:7.1f} ms, its probe's sections {elapsed[-1]:7.1f} ms, "
              f"python3 -c pass {bare[-1] * 1000:6.1f} ms", flush=True)
    print(f"medians of {args.runs}: agent {statistics.median(walls) * 1000:.1f} ms, its probe's sections "
          f"{statistics.median(elapsed):.1f} ms, python3 -c pass {statistics.median(bare) * 1000:.1f} ms")
    done = subprocess.run([args.python, "-c", PROFILED % args.top], input=payload, capture_output=True, timeout=120)
    print(f"\none agent run under cProfile (exit {done.returncode}), by cumulative time:")
    print(done.stderr.decode(errors="replace"))


if __name__ == "__main__":
    main()
