"""Start-up benchmark: `fleet --version`, a local `fleet probe` and one host over SSH, against
`ssh host true` with the same key exchange, fleet before and after a change, in paired rounds.

One real sshd on loopback (tests/harness/sshd.py). Every round runs every command once, in the
same order, after one uncounted warm-up round; the ratios are medians of run-by-run ratios.
fleet is measured from `git archive` snapshots of two refs (--before, --after), so edits to the
working tree change nothing while it runs. Also records `python -X importtime` of
`fleet --version` for both refs, and the floors: `python -c pass` and `import asyncssh`.

    sudo .venv/bin/python bench/startup.py --runs 15 --before main --after HEAD

Raw results go to bench/results/startup.json.

Beside them, what a persistent connection gives (``--control-master``): ``ssh`` with
``ControlMaster auto``/``ControlPersist`` in its ssh_config, a call that starts the master (a new
socket each round) and one through a master already running; and, for asyncssh (which does not
speak OpenSSH's multiplexing protocol), a command on a connection a process already holds open,
the least a persistent fleet process of its own could answer with.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.sshd import SSHCluster  # noqa: E402
from bench.fanout import CURVE, base_env, git, versions  # noqa: E402

PY = REPO / ".venv" / "bin" / "python"


def snapshot(ref: str, scratch: Path) -> tuple[str, str]:
    """fleet/ as committed at ``ref``, extracted under ``scratch``; (commit, path for PYTHONPATH)."""
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    snap = scratch / f"fleet-{commit[:12]}"
    snap.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "fleet"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    return commit, str(snap)


def import_time_ms(path: str, runs: int = 7) -> dict:
    """`python -X importtime -m fleet --version`: fleet.cli.main's cumulative import time and the
    sum of every top-level import, medians in ms."""
    mains, totals = [], []
    for _ in range(runs):
        r = subprocess.run([str(PY), "-X", "importtime", "-m", "fleet", "--version"], capture_output=True,
                           text=True, env={**base_env(), "PYTHONPATH": path}, cwd="/", check=True)
        rows = [re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line) for line in r.stderr.splitlines()]
        rows = [m for m in rows if m]
        mains += [int(m.group(2)) / 1000 for m in rows if m.group(4) == "fleet.cli.main"]
        totals.append(sum(int(m.group(2)) for m in rows if len(m.group(3)) == 1) / 1000)
    return {"fleet.cli.main_ms": statistics.median(mains), "all_imports_ms": statistics.median(totals)}


def commands(c: SSHCluster, curve: Path, snaps: dict[str, str], control: Path | None) -> dict[str, dict]:
    h = c.hosts[0]
    cmds = {"python -c pass": {"argv": [str(PY), "-c", "pass"]},
            "python -c 'import asyncssh'": {"argv": [str(PY), "-c", "import asyncssh"]},
            "ssh host true": {"argv": ["ssh", "-F", str(curve), "-n", h.address, "true"]}}
    if control is not None:
        mux = ["-o", "ControlMaster=auto", "-o", "ControlPersist=600"]
        cmds["ssh host true, ControlMaster: starting it"] = {
            "argv": ["ssh", "-F", str(curve), *mux, "-o", f"ControlPath={control}/new-%C-{{round}}", "-n", h.address,
                     "true"], "after": ["ssh", "-F", str(curve), "-o", f"ControlPath={control}/new-%C-{{round}}",
                                        "-O", "exit", h.address]}
        cmds["ssh host true, ControlMaster: through it"] = {
            "argv": ["ssh", "-F", str(curve), *mux, "-o", f"ControlPath={control}/kept-%C", "-n", h.address, "true"]}
    for label, path in snaps.items():
        env = {"PYTHONPATH": path}
        cmds[f"fleet --version ({label})"] = {"argv": [str(PY), "-m", "fleet", "--version"], "env": env}
        cmds[f"fleet probe, local ({label})"] = {"argv": [str(PY), "-m", "fleet", "probe", "--json"], "env": env}
        cmds[f"fleet exec, one host over SSH ({label})"] = {
            "argv": [str(PY), "-m", "fleet", "exec", h.name, "--", "true"], "env": {**env, **c.env()}}
    return cmds


def run_once(cmd: dict, round_: int = 0) -> dict:
    env = {**base_env(), **cmd.get("env", {})}
    argv = [a.replace("{round}", str(round_)) for a in cmd["argv"]]
    before = os.times()
    start = time.monotonic()
    r = subprocess.run(argv, env=env, cwd="/", capture_output=True, stdin=subprocess.DEVNULL, timeout=120)
    wall = time.monotonic() - start
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    if cmd.get("after"):  # stop the master this call started (its own CPU is left out, as sshd's is)
        subprocess.run([a.replace("{round}", str(round_)) for a in cmd["after"]], env=env, capture_output=True,
                       stdin=subprocess.DEVNULL, timeout=60)
    return {"wall_s": round(wall, 4), "cpu_s": round(cpu, 3), "rc": r.returncode,
            "stderr": r.stderr.decode(errors="replace")[-300:] if r.returncode else ""}


HELD = """
import asyncio, json, statistics, sys, time, asyncssh
async def main(host, port, user, key, known, runs):
    start = time.monotonic()
    async with asyncssh.connect(host, port=port, username=user, client_keys=[key], known_hosts=known,
                                config=None, kex_algs=[{curve!r}]) as conn:
        connected = time.monotonic() - start
        walls = []
        for _ in range(runs + 1):
            t = time.monotonic()
            r = await conn.run("true", check=True)
            walls.append(time.monotonic() - t)
    print(json.dumps({{"connect_s": round(connected, 4), "command_s_median": round(statistics.median(walls[1:]), 4),
                      "command_s_min": round(min(walls[1:]), 4), "command_s_max": round(max(walls[1:]), 4)}}))
asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6])))
"""


def held_connection(c: SSHCluster, runs: int) -> dict:
    """One process connects once (curve25519), then runs ``true`` over that connection ``runs``
    times (after one uncounted): the time of each command once the connection is there."""
    h = c.hosts[0]
    r = subprocess.run([str(PY), "-c", HELD.format(curve=CURVE), h.address, str(h.port), c.user, str(c.user_key),
                        str(c.known_hosts), str(runs)], capture_output=True, text=True, env=base_env(), timeout=300)
    if r.returncode:
        raise SystemExit(f"the held asyncssh connection failed: {r.stderr[-500:]}")
    return json.loads(r.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--before", default="main")
    ap.add_argument("--after", default="HEAD")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "startup.json")
    ap.add_argument("--control-master", action="store_true",
                    help="also ssh through a ControlMaster socket, and a command on an open asyncssh connection")
    a = ap.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="fleet-startup-"))
    try:
        measure(a, scratch)
    finally:  # the two snapshots are this run's own
        shutil.rmtree(scratch, ignore_errors=True)


def measure(a: argparse.Namespace, scratch: Path) -> None:
    refs = {}
    snaps = {}
    for label, ref in (("before", a.before), ("after", a.after)):
        commit, path = snapshot(ref, scratch)
        refs[label] = {"ref": ref, "commit": commit, "subject": git("log", "-1", "--format=%s", commit)}
        snaps[label] = path
    with SSHCluster(1) as c:
        curve = c.dir / "ssh_config.curve25519"
        curve.write_text(c.ssh_config.read_text() + f"  Port {c.hosts[0].port}\n  KexAlgorithms {CURVE}\n")
        kex = subprocess.run(["ssh", "-v", "-F", str(curve), "-n", c.hosts[0].address, "true"], capture_output=True,
                             text=True, env=base_env()).stderr
        kex_ssh = (re.search(r"kex: algorithm: (\S+)", kex) or [None, "?"])[1]
        code = ("import logging, sys, asyncssh; logging.basicConfig(level=logging.DEBUG, format='%(message)s'); "
                "asyncssh.set_debug_level(2); from fleet.cli.main import main; "
                f"sys.argv = ['fleet', 'exec', {c.hosts[0].name!r}, '--', 'true']; main()")
        r = subprocess.run([str(PY), "-c", code], capture_output=True, text=True, cwd="/",
                           env={**base_env(), "PYTHONPATH": snaps["after"], **c.env()})
        kex_fleet = (re.search(r"Key exchange alg: (\S+)", r.stderr) or [None, "?"])[1]
        control = Path(tempfile.mkdtemp(prefix="fleet-cm-", dir="/tmp")) if a.control_master else None
        cmds = commands(c, curve, snaps, control)
        rounds: dict[str, list[dict]] = {name: [] for name in cmds}
        for i in range(a.runs + 1):
            for name, cmd in cmds.items():
                result = run_once(cmd, i)
                if result["rc"] != 0:
                    raise SystemExit(f"{name} failed: {result}")
                if i:  # the first round warms caches and is not counted
                    rounds[name].append(result)
        open_connection = held_connection(c, a.runs) if a.control_master else None
        if control is not None:
            subprocess.run(["ssh", "-F", str(curve), "-o", f"ControlPath={control}/kept-%C", "-O", "exit",
                            c.hosts[0].address], capture_output=True, env=base_env(), timeout=60)
    importtime = {label: import_time_ms(path) for label, path in snaps.items()}
    walls = {name: [r["wall_s"] for r in rs] for name, rs in rounds.items()}

    def paired(num: str, den: str) -> float:
        return round(statistics.median(x / y for x, y in zip(walls[num], walls[den])), 3)

    summary = {name: {"wall_s_median": round(statistics.median(w), 4), "wall_s_min": min(w), "wall_s_max": max(w),
                      "cpu_s_median": round(statistics.median(r["cpu_s"] for r in rounds[name]), 3)}
               for name, w in walls.items()}
    ratios = {}
    for label in snaps:
        ratios[f"fleet exec one host ({label}) / ssh host true"] = paired(
            f"fleet exec, one host over SSH ({label})", "ssh host true")
    for what in ("fleet --version", "fleet probe, local", "fleet exec, one host over SSH"):
        ratios[f"{what}: after / before"] = paired(f"{what} (after)", f"{what} (before)")
    doc = {"bench": "startup", "runs": a.runs, "refs": refs, "machine": versions(),
           "key_exchange": {"ssh": kex_ssh, "fleet": kex_fleet}, "importtime_fleet_version": importtime,
           "summary": summary, "paired_ratios": ratios, "rounds": rounds,
           "asyncssh_command_on_an_open_connection": open_connection,
           "commands": {n: " ".join(cmd["argv"]) for n, cmd in cmds.items()}}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"key exchange: ssh {kex_ssh}, fleet {kex_fleet}; importtime {json.dumps(importtime)}")
    print("| command | wall s, median (min–max) | CPU s |\n|---|---|---|")
    for name, s in summary.items():
        print(f"| {name} | {s['wall_s_median']:.3f} ({s['wall_s_min']:.3f}–{s['wall_s_max']:.3f}) | "
              f"{s['cpu_s_median']:.3f} |")
    for name, v in ratios.items():
        print(f"{name}: {v}")
    if open_connection:
        print(f"asyncssh, a command on an open connection: {json.dumps(open_connection)}")


if __name__ == "__main__":
    main()
