"""Scale benchmark: `fleet probe` on 100, 1,000 and 5,000 simulated hosts, served by one process.

The hosts are loopback addresses (127.201.B.C), all served by bench/ssh_farm.py: one asyncssh
process that answers the agent's exec request with a canned probe document. The client is the
real `fleet probe --json` with an inventory, an ssh_config and a strict known_hosts holding one
line per host. Recorded per run, from os.wait4: the client's peak RSS and CPU seconds (user+sys),
and its wall time; the hosts whose state came back; the farm's CPU apart.

    sudo .venv/bin/python bench/scale.py --hosts 100,1000,5000 --runs 2 --fleet-ref HEAD

--fleet-ref measures fleet as committed at a ref (a git archive snapshot); without it, the
working tree. Raw results go to bench/results/scale-<ref or worktree>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.fanout import base_env, git, versions  # noqa: E402
from bench.startup import snapshot  # noqa: E402

PY = REPO / ".venv" / "bin" / "python"
NET = "127.201"


def address(i: int) -> str:
    return f"{NET}.{i // 250}.{i % 250 + 1}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((address(0), 0))
        return s.getsockname()[1]


def keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def canned_reply(env: dict) -> bytes:
    """This machine's own probe document (the real agent, run once), as every host's answer, framed as
    the agent frames it (fleet/agent/wire.py): a bare document is no answer to the client."""
    from fleet.agent.wire import frame

    r = subprocess.run([str(PY), "-m", "fleet", "probe", "--json"], capture_output=True, env=env, cwd="/")
    doc = json.loads(r.stdout)
    return frame("probe", doc["data"]["nodes"][0]["state"]).encode()


def files(d: Path, n: int, port: int, hashed: bool = False) -> dict:
    host_key = keygen(d / "hostkey")
    keygen(d / "userkey")
    (d / "addresses").write_text("".join(address(i) + "\n" for i in range(n)))
    (d / "known_hosts").write_text("".join(f"[{address(i)}]:{port} {host_key}\n" for i in range(n)))
    if hashed:  # as with HashKnownHosts yes (Debian's default): every name an HMAC-SHA1 with its own salt
        subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(d / "known_hosts")], check=True, capture_output=True)
    (d / "ssh_config").write_text(
        f"Host *\n  User {os.environ.get('USER', 'root')}\n  IdentityFile {d / 'userkey'}\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {d / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n  BatchMode yes\n")
    hosts = "".join(f"        n{i:05d}:\n          ansible_host: {address(i)}\n          ansible_port: {port}\n"
                    for i in range(n))
    (d / "inventory.yaml").write_text(f"all:\n  children:\n    farm:\n      hosts:\n{hosts}")
    return {"inventory": d / "inventory.yaml", "ssh_config": d / "ssh_config"}


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_client(paths: dict, env: dict, fanout: int, profile: tuple[str, Path] | None = None) -> dict:
    wrapper = [str(REPO / "bench" / "scale_profile.py"), *profile, "--"] if profile else ["-m", "fleet"]
    argv = [str(PY), *wrapper, "-i", str(paths["inventory"]), "--ssh-config", str(paths["ssh_config"]),
            "-f", str(fanout), "probe", "--json"]
    out = tempfile.TemporaryFile()
    start = time.monotonic()
    proc = subprocess.Popen(argv, env=env, cwd="/", stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    out.seek(0)
    try:
        nodes = json.loads(out.read())["data"]["nodes"]
    except ValueError:
        nodes = []
    errors = sorted({n["error"][:120] for n in nodes if n.get("error")})[:5]
    return {"wall_s": round(wall, 3), "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1), "rc": proc.returncode,
            "ok": sum(1 for n in nodes if n.get("state")), "errors": errors, "stderr": err.decode()[-400:]}


def bench(n: int, runs: int, env: dict, fanout: int, profile: str | None = None, hashed: bool = False) -> dict:
    d = Path(tempfile.mkdtemp(prefix=f"fleet-scale-{n}-"))
    port = free_port()
    paths = files(d, n, port, hashed)
    (d / "reply.json").write_bytes(canned_reply(env))
    farm = subprocess.Popen([str(PY), str(REPO / "bench" / "ssh_farm.py"), "--addresses", str(d / "addresses"),
                             "--port", str(port), "--host-key", str(d / "hostkey"),
                             "--authorized-key", str(d / "userkey.pub"), "--reply", str(d / "reply.json")],
                            stdout=subprocess.PIPE, env=base_env())
    try:
        if farm.stdout.readline().strip() != b"ready":
            raise SystemExit("the SSH farm did not start")
        results = []
        for _ in range(runs):
            farm_before = proc_cpu(farm.pid)
            r = run_client(paths, env, fanout)
            r["farm_cpu_s"] = round(proc_cpu(farm.pid) - farm_before, 2)
            r["cpu_ms_per_host"] = round(1000 * r["cpu_s"] / n, 2)
            results.append(r)
            print(f"{n} hosts: {json.dumps({k: v for k, v in r.items() if k != 'stderr'})}", flush=True)
        if profile:  # one more run, under the profiler, not counted
            report = Path(tempfile.mkdtemp(prefix="fleet-scale-")) / f"{profile}-{n}.txt"  # this run's own
            run_client(paths, env, fanout, (profile, report))
            print(f"{n} hosts: {profile} profile in {report}", flush=True)
    finally:
        farm.terminate()  # the farm this benchmark started, by its pid
        counts = farm.communicate(timeout=60)[0].decode().strip().splitlines()
        subprocess.run(["rm", "-rf", str(d)])
    return {"hosts": n, "fanout": fanout, "hashed_known_hosts": hashed, "runs": results, "farm_counts": counts[-1] if counts else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", default="100,1000,5000")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--fanout", type=int, default=64)
    ap.add_argument("--fleet-ref")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--hashed-known-hosts", action="store_true", help="known_hosts hashed (ssh-keygen -H)")
    ap.add_argument("--profile", choices=("cpu", "memory", "objects"), help="one more run per count under cProfile or "
                    "tracemalloc (bench/scale_profile.py), its report in /tmp")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)  # this process and its children only
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = base_env()
    if a.fleet_ref:
        commit, path = snapshot(a.fleet_ref, Path(tempfile.mkdtemp(prefix="fleet-scale-snap-")))
        env["PYTHONPATH"] = path
        fleet = {"source": f"git archive {a.fleet_ref}", "commit": commit,
                 "subject": git("log", "-1", "--format=%s", commit)}
    else:
        fleet = {"source": "working tree", "head": git("rev-parse", "HEAD"),
                 "uncommitted_fleet_files": git("status", "--porcelain", "--", "fleet").splitlines()}
    doc = {"bench": "scale", "fleet": fleet, "machine": versions(), "nofile_limit": hard,
           "counts": [bench(int(n), a.runs, env, a.fanout, a.profile, a.hashed_known_hosts) for n in a.hosts.split(",")]}
    out = a.out or REPO / "bench" / "results" / f"scale-{(fleet.get('commit') or 'worktree')[:7]}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print("| hosts | wall s | client CPU s | CPU ms/host | peak RSS MB | ok | farm CPU s |\n|---|---|---|---|---|---|---|")
    for c in doc["counts"]:
        for r in c["runs"]:
            print(f"| {c['hosts']} | {r['wall_s']} | {r['cpu_s']} | {r['cpu_ms_per_host']} | {r['peak_rss_mb']} | "
                  f"{r['ok']}/{c['hosts']} | {r['farm_cpu_s']} |")


if __name__ == "__main__":
    main()
