"""The live look: `fleet top` against the way people look at many GPU servers today, gpustat over
ssh, once per refresh, per host, side by side on the same real sshd hosts.

The hosts' GPUs are the simulated NVML replaying an H200's recorded answers (one idle H200 and
one beside a tenant's SGEMM loop, tests/fixtures/gpm-h200), so both tools read the same NVML
through the real pynvml. Measured, per host count:

- first screen: from the command's start to a full table of every host. fleet: the first line of
  every host from `fleet top --json` (a stream's first sample); the peer: one round of
  `xargs -P N ssh HOST gpustat --json`.
- a stream at 1 Hz for --seconds: the client's CPU (user+sys, every process of it, from rusage)
  and peak RSS; fleet: `fleet top --json --interval 1 --count S` (one SSH session a host for the
  whole stream); the peer: a round of `xargs -P N ssh HOST gpustat --json` started each second,
  each round a new SSH connection per host (as `watch` over ssh does).

    sudo .venv/bin/python bench/top.py --hosts 16,64,256 --seconds 30 --out bench/results/top-COMMIT.json

gpustat is the bench's own (installed from PyPI into a scratch folder), not fleet's dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness import fakenvml  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402
from bench.fanout import base_env, client_files  # noqa: E402

PY = REPO / ".venv" / "bin" / "python"
PEER = {"dir": None}  # where gpustat is installed for the hosts' own python3 (readable by their user)


def install_gpustat() -> str:
    """gpustat and its dependencies in a folder every account may read, for the hosts' python3."""
    import tempfile

    target = tempfile.mkdtemp(prefix="fleet-bench-gpustat-")
    subprocess.run([str(PY), "-m", "pip", "install", "-q", "--target", target, "gpustat"], check=True)
    subprocess.run(["chmod", "-R", "a+rX", target], check=True)
    PEER["dir"] = target
    return subprocess.run(["/usr/bin/python3", "-c", "import gpustat; print(gpustat.__version__)"],
                          env={"PYTHONPATH": target}, capture_output=True, text=True).stdout.strip()


def hosts_up(n: int) -> SSHCluster:
    c = SSHCluster(n)
    lib = fakenvml.build(c.dir / "fakenvml")
    for i, h in enumerate(c.hosts):
        path = c.dir / f"scenario-{h.name}.txt"
        fakenvml.write_scenario(path, {"gpus": [{**fakenvml.gpm_recorded("gemm" if i % 2 else "idle")},
                                                {**fakenvml.gpm_recorded("idle")}]})
        path.chmod(0o644)
        h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in fakenvml.env(lib, path).items())
    c.start()
    return c


def rusage_children() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss


def fleet_first_screen(c: SSHCluster, env: dict) -> dict:
    """Seconds to the first line of every host, and the whole stream of --count 3 at 1 Hz."""
    start = time.monotonic()
    proc = subprocess.Popen([str(PY), "-m", "fleet", "top", "--json", "--interval", "1", "--count", "3", "all"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    seen, first = set(), None
    for line in proc.stdout:
        seen.add(json.loads(line)["data"]["host"])
        if first is None and len(seen) == len(c.hosts):
            first = time.monotonic() - start
    proc.wait()
    return {"first_screen_s": round(first, 3) if first else None, "hosts_seen": len(seen), "exit": proc.returncode}


def peer_round(c: SSHCluster, ssh_config: Path) -> tuple[float, int]:
    names = "\n".join(h.address for h in c.hosts)  # the inventory names them; ssh reaches them by address
    start = time.monotonic()
    r = subprocess.run(["xargs", "-P", str(len(c.hosts)), "-I{}", "ssh", "-F", str(ssh_config), "{}",
                        f"PYTHONPATH={PEER['dir']} /usr/bin/python3 -m gpustat --json"], input=names,
                       capture_output=True, text=True)
    return time.monotonic() - start, r.stdout.count('"hostname"')


def fleet_stream(env: dict, seconds: int) -> dict:
    """`fleet top --json` at 1 Hz for ``seconds`` samples: its CPU and peak RSS from its own rusage."""
    start = time.monotonic()
    proc = subprocess.Popen([str(PY), "-m", "fleet", "top", "--json", "--interval", "1", "--count", str(seconds),
                             "all"], env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    lines = sum(1 for _ in proc.stdout)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - start
    cpu = usage.ru_utime + usage.ru_stime
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "cpu_share_of_a_core": round(cpu / wall, 3),
            "samples": lines, "max_rss_mb": round(usage.ru_maxrss / 1024, 1), "exit": proc.returncode}


def peer_stream(c: SSHCluster, ssh_config: Path, seconds: int) -> dict:
    """A round each second for ``seconds`` seconds (a late round starts the next at once), or
    fewer rounds where they take longer: the stream stops starting rounds after ``seconds``."""
    cpu0, _ = rusage_children()
    start, rounds, answers, late = time.monotonic(), 0, 0, 0
    for i in range(seconds):
        if time.monotonic() - start >= seconds:
            break
        took, got = peer_round(c, ssh_config)
        rounds, answers = rounds + 1, answers + got
        late += took > 1.0
        time.sleep(max(0.0, start + (i + 1) - time.monotonic()))
    cpu1, _ = rusage_children()
    wall = time.monotonic() - start
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu1 - cpu0, 2), "cpu_share_of_a_core": round((cpu1 - cpu0) / wall, 3),
            "rounds": rounds, "answers": answers, "rounds_over_1s": late}


def one_count(n: int, seconds: int) -> dict:
    c = hosts_up(n)
    try:
        env = {**base_env(), **c.env()}
        ssh_config, _ = client_files(c)
        subprocess.run([str(PY), "-m", "fleet", "hosts", "trust", "all", "--yes"], env=env, capture_output=True)
        peer_round(c, ssh_config)  # warm-up, uncounted: host keys read, page cache warm
        first_fleet = [fleet_first_screen(c, env) for _ in range(3)]
        first_peer = [peer_round(c, ssh_config) for _ in range(3)]
        out = {"hosts": n, "first_screen": {"fleet": first_fleet,
                                            "gpustat_over_ssh": [{"round_s": round(t, 3), "answers": a}
                                                                 for t, a in first_peer]}}
        out["stream"] = {"fleet": fleet_stream(env, seconds), "gpustat_over_ssh": peer_stream(c, ssh_config, seconds)}
        return out
    finally:
        c.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", default="16,64")
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if shutil.which("xargs") is None or shutil.which("ssh") is None:
        raise SystemExit("the peer needs xargs and OpenSSH's ssh")
    gpustat = install_gpustat()
    try:
        run_counts(a, gpustat)
    finally:  # the peer's install is this run's own
        shutil.rmtree(PEER["dir"], ignore_errors=True)


def run_counts(a: argparse.Namespace, gpustat: str) -> None:
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    doc = {"commit": commit, "machine": {"cores": os.cpu_count(), "python": platform.python_version()},
           "gpustat": gpustat,
           "command": " ".join(sys.argv), "results": []}
    for n in a.hosts.split(","):  # written after each host count: a long run keeps what it measured
        doc["results"].append(one_count(int(n), a.seconds))
        if a.out:
            a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
