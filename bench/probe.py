"""What a probe costs: round trips per node, fleet probe against a bare round trip, agent time.

    sudo .venv/bin/python bench/probe.py --hosts 64 --runs 5
    sudo .venv/bin/python bench/probe.py --agent-only --before 8a3405d --after HEAD --runs 31

Starts N real sshd hosts on loopback whose simulated GPUs (the tests' fake
NVML) each carry a process, then, interleaved after a warm-up round:
  * ``fleet exec all -- true``: one SSH round trip per host, the floor;
  * ``fleet probe --json``: the agent shipped and run on every host.
From sshd's own logs it counts the sessions each probe opened per host. On
one node it times the agent (bootstrap, decompress, NVML, /proc, profilers'
--version) against ``python3 -c pass``.

With ``--agent-only`` it measures only the agent on one node, the bundles of two commits (``git
archive`` snapshots) interleaved run by run with ``python3 -c pass``: each with the node's code
cache warm (the steady state: every call after a node's first) and cold (an empty cache each
run: a node's first call, which also writes the cache).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fleet import agentcall as probe_mod  # noqa: E402
from fleet.agent import wire  # noqa: E402
from fleet.agent.bundle import bundle as agent_bundle  # noqa: E402
from tests.harness import fakenvml  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402
from bench.measure import children_cpu, stats, timed  # noqa: E402

FLEET = [str(REPO / ".venv" / "bin" / "fleet")]


def sessions(c: SSHCluster) -> list[int]:
    return [h.log.read_text().count("Starting session: command") for h in c.hosts]


def rusage_cpu(fn):
    """children_cpu to the microsecond (os.times counts 10 ms ticks): fn's result and its children's CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = fn()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return result, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def node_env(extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "XDG_CACHE_HOME")}
    return {**env, **extra}


def snapshot_bundle(ref: str, scratch: Path) -> tuple[str, bytes]:
    """The agent as fleet at ``ref`` ships it; (commit, bundle)."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", ref], capture_output=True, text=True,
                            check=True).stdout.strip()
    snap = scratch / commit
    snap.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "fleet"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    code = "import sys; from fleet.agent.bundle import bundle; sys.stdout.buffer.write(bundle())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, cwd=snap,
                         env={**os.environ, "PYTHONPATH": str(snap)})
    return commit, out.stdout


def agent_only(args) -> None:
    """The agent on one node, two commits' bundles, warm and cold code cache, paired run by run."""
    scratch = Path(tempfile.mkdtemp(prefix="fleet-probe-agent-"))
    own = subprocess.Popen(["sleep", "3600"])
    try:
        lib = fakenvml.build(scratch / "fakenvml")
        scenario = scratch / "scenario.txt"
        fakenvml.write_scenario(scenario, {"gpus": [{"index": 0, "processes": [
            {"kind": "compute", "pid": own.pid, "mem": 10**9}]}, {"index": 1}]})
        gpu_env = fakenvml.env(lib, scenario)
        bundles = dict(snapshot_bundle(ref, scratch) for ref in (args.before, args.after))
        argv = ["/usr/bin/python3", *probe_mod.agent_argv(_Host(), {"tools": {}, "environment_check": False})[1:]]
        rows: dict[str, list[tuple[float, float]]] = {"python3 -c pass": []}
        for commit in bundles:
            rows[f"agent {commit}, cache warm"], rows[f"agent {commit}, cache cold"] = [], []
        for round_ in range(args.runs + 1):  # round 0 fills the warm caches and is not counted
            (wall, *_), cpu = rusage_cpu(lambda: timed(["/usr/bin/python3", "-c", "pass"], node_env(gpu_env)))
            if round_:
                rows["python3 -c pass"].append((wall, cpu))
            for commit, data in bundles.items():
                for temperature in ("warm", "cold"):
                    home = scratch / f"cache-{commit}-{temperature}-{round_ if temperature == 'cold' else 0}"
                    home.mkdir(mode=0o700, exist_ok=True)
                    env = node_env({**gpu_env, "XDG_CACHE_HOME": str(home)})
                    (wall, out, err, rc), cpu = rusage_cpu(lambda: timed(argv, env, stdin=data))
                    assert rc == 0 and len(wire.read(out.decode(), "probe")["gpus"]) == 2, err[-500:]
                    if round_:
                        rows[f"agent {commit}, cache {temperature}"].append((wall, cpu))
    finally:
        own.kill()
        own.wait()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"## the agent on one node, {args.runs} runs (median (min-max))\n")
    print("| on one node | wall ms | CPU ms |\n|---|---|---|")
    for name, vals in rows.items():
        w, cp = stats([v[0] * 1000 for v in vals]), stats([v[1] * 1000 for v in vals])
        print(f"| {name} | {w['median']:.1f} ({w['min']:.1f}-{w['max']:.1f}) | "
              f"{cp['median']:.1f} ({cp['min']:.1f}-{cp['max']:.1f}) |")
    before, after = bundles
    floor = rows["python3 -c pass"]
    own_cpu = {name: statistics.median(v[1] - f[1] for v, f in zip(vals, floor)) * 1000
               for name, vals in rows.items() if name != "python3 -c pass"}
    paired = {f"{after} {t} / {before} {t}": statistics.median(
        a[1] / b[1] for a, b in zip(rows[f"agent {after}, cache {t}"], rows[f"agent {before}, cache {t}"]))
        for t in ("warm", "cold")}
    print(f"\nagent's own CPU (paired, less python3 -c pass), ms: {json.dumps({k: round(v, 1) for k, v in own_cpu.items()})}")
    print(f"paired CPU ratios: {json.dumps({k: round(v, 3) for k, v in paired.items()})}")
    results = args.out
    results.mkdir(parents=True, exist_ok=True)
    (results / f"probe-agent-{after}.json").write_text(json.dumps(
        {"bench": "probe --agent-only", "before": before, "after": after, "runs": rows,
         "agent_own_cpu_ms": own_cpu, "paired_cpu_ratios": paired,
         "bundle_bytes": {c: len(d) for c, d in bundles.items()},
         "node_python": subprocess.run(["/usr/bin/python3", "--version"], capture_output=True, text=True).stdout.strip()},
        indent=1))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hosts", type=int, default=64)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--agent-only", action="store_true", help="only the agent on one node, two commits paired")
    ap.add_argument("--before", default="main")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--node-runs", type=int, default=21, help="rounds of the agent alone on one node")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="the folder for the raw results")
    args = ap.parse_args()
    if args.agent_only:
        return agent_only(args)
    c = SSHCluster(args.hosts)
    own = subprocess.Popen(["sleep", "3600"])
    try:
        lib = fakenvml.build(c.dir / "fakenvml")
        scenario = c.dir / "scenario.txt"
        fakenvml.write_scenario(scenario, {"gpus": [{"index": 0, "processes": [
            {"kind": "compute", "pid": own.pid, "mem": 10**9}]}, {"index": 1}]})
        setenv = " ".join(f"{k}={v}" for k, v in fakenvml.env(lib, scenario).items())
        for h in c.hosts:
            h.options["SetEnv"] = setenv
        tools = c.standins()
        c.inventory_vars = {"nsys_path": str(tools / "nsys"), "ncu_path": str(tools / "ncu")}
        c.start()
        # This checkout's fleet, whatever the venv's editable install points at.
        env = {**os.environ, **c.env(), "PYTHONPATH": str(REPO)}
        rows: dict[str, list[tuple[float, float]]] = {"exec true": [], "probe": []}
        per_host: list[int] = []
        for round_ in range(args.runs + 1):
            (wall, out, err, rc), cpu = children_cpu(lambda: timed(FLEET + ["exec", "all", "--json", "--", "true"], env))
            assert rc == 0 and out.count(b'"exit_status": 0') == args.hosts, err[-500:]
            if round_:
                rows["exec true"].append((wall, cpu))
            before = sessions(c)
            (wall, out, err, rc), cpu = children_cpu(lambda: timed(FLEET + ["probe", "--json"], env))
            after = sessions(c)
            doc = json.loads(out)
            nodes = doc.get("data", doc)["nodes"]  # --json wraps the document in an envelope
            assert rc == 0 and all(n["state"] and len(n["state"]["gpus"]) == 2 for n in nodes), err[-500:]
            per_host += [a - b for a, b in zip(after, before)]
            if round_:
                rows["probe"].append((wall, cpu))

        # The agent on one node, outside SSH: the same command line the transports run.
        one_node = node_env(fakenvml.env(lib, scenario))
        # Two agents: with the stand-in profilers (each a Python script, so two more interpreter
        # starts) and with none installed, which is the agent's own cost.
        variants = {"agent, stand-in nsys and ncu": {"nsys": str(tools / "nsys"), "ncu": str(tools / "ncu")},
                    "agent, no profilers": {}}
        bundle = agent_bundle()
        node: dict[str, list[tuple[float, float]]] = {"python3 -c pass": [], **{v: [] for v in variants}}
        elapsed = {}
        for _ in range(args.node_runs):
            (wall, *_), cpu = children_cpu(lambda: timed(["/usr/bin/python3", "-c", "pass"], one_node))
            node["python3 -c pass"].append((wall, cpu))
            for name, found in variants.items():
                argv = ["/usr/bin/python3", *probe_mod.agent_argv(_Host(), {"tools": found,
                                                                            "environment_check": False})[1:]]
                (wall, out, err, rc), cpu = children_cpu(lambda: timed(argv, one_node, stdin=bundle))
                assert rc == 0, err
                node[name].append((wall, cpu))
                elapsed[name] = wire.read(out.decode(), "probe")["elapsed_ms"]  # a framed answer (wire.py)
    finally:
        own.kill()
        c.stop()

    print(f"## probe, {args.hosts} hosts, {args.runs} runs (median (min-max))\n")
    print("| command | wall s | client CPU s |\n|---|---|---|")
    for name, vals in rows.items():
        w, cp = stats([v[0] for v in vals]), stats([v[1] for v in vals])
        print(f"| fleet {name} | {w['median']:.2f} ({w['min']:.2f}-{w['max']:.2f}) | "
              f"{cp['median']:.2f} ({cp['min']:.2f}-{cp['max']:.2f}) |")
    ratio = statistics.median(p[0] / e[0] for p, e in zip(rows["probe"], rows["exec true"]))
    print(f"\nprobe / exec true (paired wall): {ratio:.2f}")
    print(f"SSH sessions per host per probe: min {min(per_host)}, max {max(per_host)} ({len(per_host)} samples)")
    print("\n| on one node | wall ms | CPU ms |\n|---|---|---|")
    for name, vals in node.items():
        w, cp = stats([v[0] * 1000 for v in vals]), stats([v[1] * 1000 for v in vals])
        print(f"| {name} | {w['median']:.1f} ({w['min']:.1f}-{w['max']:.1f}) | "
              f"{cp['median']:.1f} ({cp['min']:.1f}-{cp['max']:.1f}) |")
    print(f"\nagents' own elapsed_ms (last run): {elapsed}; bundle {len(bundle)} bytes")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "fleet"], capture_output=True,
                           text=True).stdout.splitlines()
    results = args.out
    results.mkdir(parents=True, exist_ok=True)
    (results / f"probe-{args.hosts}.json").write_text(json.dumps(
        {"hosts": args.hosts, "runs": rows, "sessions_per_host": per_host, "node": node,
         "agent_elapsed_ms": elapsed, "bundle_bytes": len(bundle), "fleet_commit": commit,
         "uncommitted_fleet_files": dirty}, indent=1))


class _Host:
    """The local node, as the transports see it."""
    name, vars = "local", {}


if __name__ == "__main__":
    main()
