"""Summaries, ratios and markdown tables of bench/fanout.py's runs."""

from __future__ import annotations

import statistics

from bench.measure import stats

CURVE = "curve25519-sha256"
TOOLS = {
    "fleet": ("fleet exec -f 64", "asyncssh default"),
    "pdsh": ("pdsh -R ssh -f 64", "OpenSSH default"),
    "clush": ("clush -f 64", "OpenSSH default"),
    "xargs": ("xargs -P 64 ssh", "OpenSSH default"),
    "pdsh-c25519": ("pdsh -R ssh -f 64", CURVE),
    "clush-c25519": ("clush -f 64", CURVE),
    "xargs-c25519": ("xargs -P 64 ssh", CURVE),
    "bare-asyncssh": ("bare asyncssh loop, Semaphore(64)", "asyncssh default"),
}
SAME_KEX_PEERS = ["pdsh-c25519", "clush-c25519", "xargs-c25519"]


def summarize(runs: dict[str, list[dict]], n: int) -> dict:
    s = {}
    for tool, rs in runs.items():
        s[tool] = {"wall": stats([r["wall_s"] for r in rs]), "cpu": stats([r["cpu_s"] for r in rs]),
                   "ok": sum(r["ok"] for r in rs), "expected": sum(r["expected"] for r in rs)}
        s[tool]["cpu_per_host_ms"] = s[tool]["cpu"]["median"] / n * 1000
        s[tool]["sshd_cpu"] = stats([r["sshd_cpu_s"] for r in rs])
        s[tool]["other_cpu"] = stats([r["other_cpu_s"] for r in rs])
    return s


def ratios(runs: dict[str, list[dict]], s: dict) -> dict:
    if "fleet" not in runs:
        return {}
    fw = s["fleet"]["wall"]["median"]

    def paired(peer: str) -> float:
        return statistics.median(f["wall_s"] / p["wall_s"] for f, p in zip(runs["fleet"], runs[peer]))

    out: dict = {"wall": {}, "paired_wall": {}}
    for peer in runs:
        if peer != "fleet":
            out["wall"][peer] = fw / s[peer]["wall"]["median"]
            out["paired_wall"][peer] = paired(peer)
    same = [p for p in SAME_KEX_PEERS if p in runs]
    if same:
        best = min(same, key=lambda p: s[p]["wall"]["median"])
        out["fastest_same_kex_peer"] = best
        out["fleet_vs_fastest_same_kex"] = out["wall"][best]
        out["paired_fleet_vs_fastest_same_kex"] = out["paired_wall"][best]
    if "bare-asyncssh" in runs:
        out["cpu_per_host_ms"] = {"fleet": s["fleet"]["cpu_per_host_ms"],
                                  "bare-asyncssh": s["bare-asyncssh"]["cpu_per_host_ms"]}
        out["cpu_fleet_vs_bare"] = s["fleet"]["cpu"]["median"] / s["bare-asyncssh"]["cpu"]["median"]
    goals = {}
    if "pdsh" in runs:
        goals["fleet <= 0.5x pdsh (shipped)"] = out["wall"]["pdsh"] <= 0.5
    if "clush" in runs:
        goals["fleet <= 0.5x clush (shipped)"] = out["wall"]["clush"] <= 0.5
    if same:
        goals["fleet <= 1.0x fastest same-KEX peer"] = out["fleet_vs_fastest_same_kex"] <= 1.0
    if "bare-asyncssh" in runs:
        goals["fleet CPU/host <= bare asyncssh CPU/host"] = out["cpu_fleet_vs_bare"] <= 1.0
    out["goals"] = goals
    return out


def table(n: int, runs: dict, s: dict, r: dict) -> str:
    lines = [f"### {n} hosts", "",
             "| tool | key exchange | wall s, median (min–max) | client CPU s, median (min–max) | CPU ms/host | ok/expected "
             "| sshd CPU s | other CPU s, max |",
             "|---|---|---|---|---|---|---|---|"]
    for tool in runs:
        label, kex = TOOLS[tool]
        w, cpu = s[tool]["wall"], s[tool]["cpu"]
        lines.append(f"| {tool} (`{label}`) | {kex} | {w['median']:.2f} ({w['min']:.2f}–{w['max']:.2f}) | "
                     f"{cpu['median']:.2f} ({cpu['min']:.2f}–{cpu['max']:.2f}) | {s[tool]['cpu_per_host_ms']:.1f} | "
                     f"{s[tool]['ok']}/{s[tool]['expected']} | {s[tool]['sshd_cpu']['median']:.2f} | "
                     f"{s[tool]['other_cpu']['max']:.2f} |")
    if r:
        lines += ["", "| fleet / peer | ratio of medians | paired (median of run-by-run ratios) |", "|---|---|---|"]
        for peer in r["wall"]:
            lines.append(f"| fleet / {peer} | {r['wall'][peer]:.2f} | {r['paired_wall'][peer]:.2f} |")
        if "fastest_same_kex_peer" in r:
            lines += ["", f"Fastest peer at the same key exchange: {r['fastest_same_kex_peer']}; "
                          f"fleet / it = {r['fleet_vs_fastest_same_kex']:.2f} "
                          f"(paired {r['paired_fleet_vs_fastest_same_kex']:.2f})."]
        if "cpu_per_host_ms" in r:
            lines.append(f"Client CPU per host: fleet {r['cpu_per_host_ms']['fleet']:.1f} ms, bare asyncssh "
                         f"{r['cpu_per_host_ms']['bare-asyncssh']:.1f} ms (fleet / bare = {r['cpu_fleet_vs_bare']:.2f}).")
        lines += [""] + [f"- {g}: {'met' if ok else 'NOT met'}" for g, ok in r["goals"].items()]
    return "\n".join(lines) + "\n"
