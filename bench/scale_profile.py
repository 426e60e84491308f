"""Runs the fleet command line under cProfile or tracemalloc, for bench/scale.py --profile.

    python bench/scale_profile.py cpu|memory|objects REPORT -- FLEET-ARGS...

cpu: the 40 functions with the most cumulative and own time. memory: what is allocated, by line,
when the run's asyncio loop returns (every result held, nothing printed yet), and the peak.
"""

from __future__ import annotations

import asyncio
import cProfile
import io
import pstats
import sys
import tracemalloc


def main() -> None:
    mode, report, sep, *args = sys.argv[1:]
    from fleet.cli.main import main as fleet

    out = open(report, "w")
    if mode == "objects":  # what is still alive when the loop returns, and what a full collection frees
        import collections
        import gc
        import resource

        real_run = asyncio.run

        def run_and_count(coro, **kw):
            result = real_run(coro, **kw)
            kinds = collections.Counter(type(o).__name__ for o in gc.get_objects())
            print("peak RSS MiB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, file=out)
            print("gc counts", gc.get_count(), "live:", kinds.most_common(25), file=out)
            print("collected", gc.collect(), file=out)
            return result

        asyncio.run = run_and_count
        try:
            fleet(args)
        except SystemExit:
            pass
    elif mode == "memory":
        tracemalloc.start(4)
        real_run = asyncio.run

        def run_and_snapshot(coro, **kw):
            result = real_run(coro, **kw)
            current, peak = tracemalloc.get_traced_memory()
            print(f"traced: {current / 2**20:.1f} MiB now, {peak / 2**20:.1f} MiB peak", file=out)
            for stat in tracemalloc.take_snapshot().statistics("lineno")[:30]:
                print(stat, file=out)
            return result

        asyncio.run = run_and_snapshot
        try:
            fleet(args)
        except SystemExit:
            pass
    else:
        prof = cProfile.Profile()
        try:
            prof.runcall(fleet, args)
        except SystemExit:
            pass
        text = io.StringIO()
        stats = pstats.Stats(prof, stream=text)
        stats.sort_stats("cumulative").print_stats(40)
        stats.sort_stats("tottime").print_stats(40)
        out.write(text.getvalue())
    out.close()


if __name__ == "__main__":
    main()
