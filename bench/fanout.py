"""Fan-out benchmark: `fleet exec` against pdsh, clush, xargs+ssh and a bare asyncssh loop.

For each host count N, starts N real sshd hosts on loopback (tests/harness/sshd.py)
once, then runs every tool on the same hosts, interleaved round-robin (one
uncounted warm-up round, then --runs counted rounds). Every tool runs the same
command on every host and must print one line per host.

Measured per run: wall time (time.monotonic around the whole process) and the
client's CPU time (user+sys of the process and every descendant it waited for,
from os.wait4's rusage). The sshd hosts are daemons outside that tree: their
CPU is recorded apart (sshd_cpu_s), and they share the machine's cores with
the client. Also recorded, to spot noise from other work on the machine: its
busy share before each round and, per run, the CPU used besides the client
and the sshd listeners (other_cpu_s; mostly the remote commands).

    sudo .venv/bin/python bench/fanout.py --hosts 16,64,256 --runs 5 --fleet-ref HEAD

--fleet-ref measures fleet as committed at a git ref (a git archive snapshot
put first on its PYTHONPATH); without it, the working tree's fleet.

Raw results go to bench/results/fanout-<N>.json; a markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.sshd import SSHCluster  # noqa: E402
from bench.fanout_report import CURVE, TOOLS, ratios, summarize, table  # noqa: E402
from bench.measure import cpu_stat, sshd_cpu, wait_quiet  # noqa: E402

PY = REPO / ".venv" / "bin" / "python"
FLEET = REPO / ".venv" / "bin" / "fleet"
BARE = REPO / "bench" / "bare_asyncssh.py"
PAYLOAD = "import json,os; print(json.dumps(os.uname()))"
REMOTE = f"python3 -c '{PAYLOAD}'"          # as a remote shell command line
FANOUT = 64
RUN_TIMEOUT = 600.0
FLEET_PATH: str | None = None  # PYTHONPATH entry holding a snapshot of fleet (--fleet-ref)

# name -> (label, key exchange); the order is the order of every round.


# --- hosts ---

def check_sshd_configs(c: SSHCluster) -> None:
    for h in c.hosts:
        text = (h.dir / "sshd_config").read_text()
        if not re.search(r"^MaxStartups 1024$", text, re.M):
            raise SystemExit(f"{h.name}: sshd_config does not set MaxStartups 1024")


def sshd_log_summary(c: SSHCluster) -> dict:
    """Connections sshd dropped or refused during the runs (MaxStartups, errors)."""
    counts = {"drop_maxstartups": 0, "error": 0, "fatal": 0}
    samples: list[str] = []
    for h in c.hosts:
        if not h.log.exists():
            continue
        for line in h.log.read_text(errors="replace").splitlines():
            key = ("drop_maxstartups" if "MaxStartups" in line or "drop connection" in line
                   else "fatal" if "fatal" in line.lower()
                   else "error" if "error" in line.lower() else None)
            if key:
                counts[key] += 1
                if len(samples) < 10:
                    samples.append(f"{h.name}: {line.strip()}")
    counts["samples"] = samples
    return counts


# --- tools ---

def client_files(c: SSHCluster) -> tuple[Path, Path]:
    """ssh_config copies for OpenSSH: the harness's, plus the sshd port (the
    inventory carries it for fleet), and one that also forces curve25519."""
    base = c.ssh_config.read_text() + f"  Port {c.hosts[0].port}\n"
    shipped = c.dir / "ssh_config.openssh"
    curve = c.dir / "ssh_config.curve25519"
    shipped.write_text(base)
    curve.write_text(base + f"  KexAlgorithms {CURVE}\n")
    return shipped, curve


def base_env() -> dict:
    # PYTHONDONTWRITEBYTECODE left in would compile fleet's modules from source on every run (the
    # snapshots have no .pyc, an installed fleet has): 40-50 ms that no user pays.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLEET_", "PDSH_"))
           and k not in ("SSH_AUTH_SOCK", "SSH_AGENT_PID", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env["LC_ALL"] = "C.UTF-8"
    return env


def fleet_env() -> dict:
    env = base_env()
    if FLEET_PATH:
        env["PYTHONPATH"] = FLEET_PATH
    return env


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


def pin_fleet(ref: str | None, scratch: Path) -> dict:
    """Which fleet is measured. With a ref, a snapshot of fleet/ at that commit
    (git archive) is put first on fleet's PYTHONPATH, so edits in the working
    tree during the run do not change what is measured."""
    global FLEET_PATH
    head = git("rev-parse", "HEAD")
    if ref is None:
        dirty = [l[3:] for l in git("status", "--porcelain", "--", "fleet").splitlines()]
        return {"source": "working tree", "head": head, "uncommitted_fleet_files": dirty}
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    snap = scratch / f"fleet-{commit[:12]}"
    snap.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "fleet"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(snap)], input=archive.stdout, check=True)
    FLEET_PATH = str(snap)
    where = subprocess.run([str(PY), "-c", "import fleet; print(fleet.__file__)"], capture_output=True, text=True,
                           env=fleet_env(), cwd="/", check=True).stdout.strip()
    if not where.startswith(str(snap)):
        raise SystemExit(f"the snapshot of fleet is not the one imported ({where})")
    return {"source": f"git archive {ref}", "commit": commit,
            "subject": git("log", "-1", "--format=%s", commit), "head": head}


def commands(c: SSHCluster, shipped: Path, curve: Path) -> dict[str, dict]:
    addrs = [h.address for h in c.hosts]
    wlist = ",".join(addrs)
    env = base_env()
    xargs_in = "".join(a + "\n" for a in addrs).encode()

    def pdsh(cfg: Path) -> dict:
        return {"argv": ["pdsh", "-R", "ssh", "-f", str(FANOUT), "-l", c.user, "-w", wlist, REMOTE],
                "env": {**env, "PDSH_SSH_ARGS_APPEND": f"-F {cfg}"}, "parse": "prefixed"}

    def clush(cfg: Path) -> dict:
        return {"argv": ["clush", "-f", str(FANOUT), "-l", c.user, "-o", f"-F {cfg}", "-w", wlist, REMOTE],
                "env": env, "parse": "prefixed"}

    def xargs(cfg: Path) -> dict:
        return {"argv": ["xargs", "-P", str(FANOUT), "-I{}", "ssh", "-F", str(cfg), "-n", "{}", REMOTE],
                "env": env, "stdin": xargs_in, "parse": "lines"}

    return {
        "fleet": {"argv": [str(FLEET), "-f", str(FANOUT), "exec", "all", "--json", "--", "python3", "-c", PAYLOAD],
                  "env": {**fleet_env(), **c.env()}, "parse": "fleet"},
        "pdsh": pdsh(shipped),
        "clush": clush(shipped),
        "xargs": xargs(shipped),
        "pdsh-c25519": pdsh(curve),
        "clush-c25519": clush(curve),
        "xargs-c25519": xargs(curve),
        "bare-asyncssh": {"argv": [str(PY), str(BARE), "--hosts", wlist, "--port", str(c.hosts[0].port),
                                   "--user", c.user, "--key", str(c.user_key), "--known-hosts", str(c.known_hosts),
                                   "-c", str(FANOUT), "--", REMOTE],
                          "env": env, "parse": "prefixed"},
    }


def printable(cmd: dict) -> str:
    """A shell line for the docs, with the host list shortened."""
    parts = []
    for a in cmd["argv"]:
        if a.count(",") > 2:
            a = "<addr1>,<addr2>,..."
        a = a.replace(str(REPO) + "/", "")
        parts.append(a if re.fullmatch(r"[\w@%+=:,./{}-]+", a) else "'" + a.replace("'", "'\\''") + "'")
    line = " ".join(parts)
    if "PDSH_SSH_ARGS_APPEND" in cmd["env"]:
        line = f"PDSH_SSH_ARGS_APPEND='{cmd['env']['PDSH_SSH_ARGS_APPEND']}' " + line
    if cmd.get("stdin"):
        line = "printf '%s\\n' <addrs> | " + line
    return line


# --- one run ---

def _payload_ok(text: str) -> bool:
    try:
        v = json.loads(text)
    except ValueError:
        return False
    return isinstance(v, list) and len(v) == 5 and v[0] == "Linux"


def count_ok(kind: str, out: str, c: SSHCluster) -> int:
    if kind == "fleet":
        hosts = set()
        for line in out.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and "fleet_json" in r:  # --json wraps each host's result in an envelope
                r = r.get("data") or {}
            if r.get("exit_status") == 0 and not r.get("error") and _payload_ok(r.get("stdout", "").strip()):
                hosts.add(r["host"])
        return len(hosts & {h.name for h in c.hosts})
    if kind == "prefixed":  # "addr: line", as pdsh and clush print
        hosts = set()
        for line in out.splitlines():
            addr, sep, rest = line.partition(": ")
            if sep and _payload_ok(rest.strip()):
                hosts.add(addr.strip())
        return len(hosts & {h.address for h in c.hosts})
    return sum(_payload_ok(line.strip()) for line in out.splitlines())  # xargs: no host prefix


def run_once(cmd: dict, c: SSHCluster) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, tempfile.TemporaryFile() as inp:
        if cmd.get("stdin"):
            inp.write(cmd["stdin"])
            inp.seek(0)
        sshd0 = sshd_cpu(c)
        busy0, steal0 = cpu_stat()
        t0 = time.monotonic()
        p = subprocess.Popen(cmd["argv"], stdin=inp if cmd.get("stdin") else subprocess.DEVNULL,
                             stdout=out, stderr=err, env=cmd["env"], cwd=REPO, start_new_session=True)
        timer = threading.Timer(RUN_TIMEOUT, lambda: os.killpg(p.pid, signal.SIGKILL))
        timer.start()
        try:
            _, status, ru = os.wait4(p.pid, 0)
        finally:
            timer.cancel()
        wall = time.monotonic() - t0
        busy1, steal1 = cpu_stat()
        sshd = sshd_cpu(c) - sshd0
        p.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode("utf-8", "replace")
        stderr = err.read().decode("utf-8", "replace")
    ok = count_ok(cmd["parse"], stdout, c)
    rec = {"wall_s": round(wall, 4), "cpu_s": round(ru.ru_utime + ru.ru_stime, 4),
           "user_s": round(ru.ru_utime, 4), "sys_s": round(ru.ru_stime, 4), "max_rss_kb": ru.ru_maxrss,
           "rc": p.returncode, "ok": ok, "expected": len(c.hosts),
           # the servers' CPU, and what else ran meanwhile: a check on noise from outside the benchmark
           "sshd_cpu_s": round(sshd, 3),
           "other_cpu_s": round(busy1 - busy0 - (ru.ru_utime + ru.ru_stime) - sshd, 3),
           "steal_s": round(steal1 - steal0, 3)}
    if ok != len(c.hosts) or p.returncode != 0:
        rec["stderr_tail"] = stderr[-2000:]
    return rec


# --- key exchange actually negotiated ---

def probe_kex(c: SSHCluster, shipped: Path, curve: Path) -> dict:
    h = c.hosts[0]
    found = {}
    for name, cfg in (("OpenSSH (shipped config)", shipped), (f"OpenSSH (+KexAlgorithms {CURVE})", curve)):
        r = subprocess.run(["ssh", "-v", "-F", str(cfg), "-n", h.address, "true"], capture_output=True, text=True,
                           env=base_env(), timeout=60)
        m = re.search(r"kex: algorithm: (\S+)", r.stderr)
        found[name] = m.group(1) if m else f"? (rc {r.returncode})"
    r = subprocess.run([str(PY), str(BARE), "--show-kex", "--hosts", h.address, "--port", str(h.port),
                        "--user", c.user, "--key", str(c.user_key), "--known-hosts", str(c.known_hosts), "true"],
                       capture_output=True, text=True, env=base_env(), timeout=60)
    m = re.search(r"Key exchange alg: (\S+)", r.stderr)
    found["bare asyncssh"] = m.group(1) if m else f"? (rc {r.returncode})"
    code = ("import logging, sys, asyncssh; logging.basicConfig(level=logging.DEBUG, format='%(message)s'); "
            "asyncssh.set_debug_level(2); from fleet.cli.main import main; "
            f"sys.argv = ['fleet', 'exec', {h.name!r}, '--', 'true']; main()")
    r = subprocess.run([str(PY), "-c", code], capture_output=True, text=True, env={**fleet_env(), **c.env()},
                       cwd="/", timeout=60)  # not the repository: "" on sys.path would shadow the snapshot
    m = re.search(r"Key exchange alg: (\S+)", r.stderr)
    found["fleet"] = m.group(1) if m else f"? (rc {r.returncode})"
    return found


def versions() -> dict:
    def sh(*argv: str) -> str:
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=fleet_env(), cwd="/")
            return (r.stdout + r.stderr).strip().splitlines()[0]
        except (OSError, IndexError, subprocess.TimeoutExpired):
            return "?"

    cpu = "?"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"nproc": len(os.sched_getaffinity(0)), "cpu_model": cpu, "kernel": platform.release(),
            "os": sh("sh", "-c", ". /etc/os-release && echo $PRETTY_NAME"),
            "openssh": sh("ssh", "-V"), "pdsh": sh("pdsh", "-V"), "clush": sh("clush", "--version"),
            "asyncssh": sh(str(PY), "-c", "import asyncssh; print(asyncssh.__version__)"),
            "python": sh(str(PY), "--version"), "fleet": sh(str(FLEET), "--version")}


# --- main ---

def bench(n: int, runs: int, warmup: int, tools: list[str], out_dir: Path, meta: dict, quiet: float) -> None:
    c = SSHCluster(n)
    try:
        t0 = time.monotonic()
        c.start()
        print(f"[bench] {n} sshd up on {c.hosts[0].address}..{c.hosts[-1].address}:{c.hosts[0].port} "
              f"in {time.monotonic() - t0:.1f} s", flush=True)
        check_sshd_configs(c)
        shipped, curve = client_files(c)
        cmds = {t: cmd for t, cmd in commands(c, shipped, curve).items() if t in tools}
        kex = probe_kex(c, shipped, curve)
        print(f"[bench] key exchange negotiated: {kex}", flush=True)
        results: dict[str, list[dict]] = {t: [] for t in cmds}
        warm: dict[str, list[dict]] = {t: [] for t in cmds}
        busy_before: list[float] = []
        for rnd in range(warmup + runs):
            counted = rnd >= warmup
            busy_before.append(wait_quiet(quiet))
            if busy_before[-1] > 0.10:
                print(f"[bench] machine {busy_before[-1]:.0%} busy with other work before round {rnd}", flush=True)
            for tool, cmd in cmds.items():
                rec = run_once(cmd, c)
                (results if counted else warm)[tool].append(rec)
                tag = f"run {rnd - warmup + 1}" if counted else "warm-up"
                flag = "" if rec["ok"] == n and rec["rc"] == 0 else f"  <-- ok {rec['ok']}/{n} rc {rec['rc']}"
                print(f"[bench] N={n} {tag:8} {tool:14} wall {rec['wall_s']:7.2f} s  cpu {rec['cpu_s']:7.2f} s  "
                      f"sshd {rec['sshd_cpu_s']:6.2f} s  other {rec['other_cpu_s']:5.2f} s  steal {rec['steal_s']:4.2f} s"
                      f"{flag}", flush=True)
        s = summarize(results, n)
        r = ratios(results, s)
        md = table(n, results, s, r)
        print(md, flush=True)
        doc = {"hosts": n, "runs": runs, "warmup_rounds": warmup, "order": list(cmds), "fanout": FANOUT,
               "remote_command": REMOTE, "machine": meta, "kex_negotiated": kex,
               "commands": {t: printable(cmd) for t, cmd in cmds.items()},
               "sshd_options": {"MaxStartups": "1024", "MaxSessions": "64", "LogLevel": "VERBOSE"},
               "summary": s, "ratios": r, "runs_raw": results, "warmup_raw": warm,
               "busy_before_rounds": busy_before,
               "sshd_log": sshd_log_summary(c), "table_md": md,
               "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / f"fanout-{n}.json").write_text(json.dumps(doc, indent=1) + "\n")
        print(f"[bench] sshd log: {doc['sshd_log']}", flush=True)
    finally:
        c.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hosts", default="16,64,256", help="comma-separated host counts")
    p.add_argument("--runs", type=int, default=5, help="counted rounds per host count")
    p.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    p.add_argument("--tools", default=",".join(TOOLS), help=f"subset of {','.join(TOOLS)}")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--fleet-ref", help="measure fleet as committed at this git ref (default: the working tree)")
    p.add_argument("--wait-quiet", type=float, default=60.0,
                   help="before each round, wait up to this many seconds for other work on the machine to stop")
    a = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: sshd's privilege separation (sudo .venv/bin/python bench/fanout.py)")
    tools = [t for t in TOOLS if t in a.tools.split(",")]
    scratch = Path(tempfile.mkdtemp(prefix="fleet-bench-"))
    try:
        pinned = pin_fleet(a.fleet_ref, scratch)
        meta = {**versions(), "fleet_measured": pinned}
        print(f"[bench] {meta}", flush=True)
        for n in (int(x) for x in a.hosts.split(",")):
            bench(n, a.runs, a.warmup, tools, a.out, meta, a.wait_quiet)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
