"""``fleet profile`` on lab servers: probe, plan, run the agent, bring the reports home.

Two round trips per node (the probe, then the run) over one connection. The
policy decides; the agent acts on the node; this module only moves plans,
output and reports, and says what happened on each node.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import exitcodes, probe
from .agent.run import RESULT_MARK
from .plan import Plan, ProfileRequest, plan
from .transport import Result

if TYPE_CHECKING:
    from .inventory import Host
    from .transport import Fanout


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class HostRun:
    host: str
    status: str = "pending"          # ok | refused | failed | unreachable | planned
    plan: Plan | None = None
    result: dict | None = None       # the agent's document
    reports: list[dict] = field(default_factory=list)
    error: str | None = None

    def to_json(self) -> dict:
        return {"host": self.host, "status": self.status, "error": self.error,
                "plan": self.plan.to_json() if self.plan else None, "result": self.result, "reports": self.reports}


class LineSink:
    """A host's output, line by line, prefixed when several hosts run; the agent's result line kept apart."""

    def __init__(self, host: str, prefix: bool, write: Callable[[str, str], None]):
        self.host, self.prefix, self.write = host, prefix, write
        self.partial = {"stdout": b"", "stderr": b""}
        self.result: dict | None = None

    def __call__(self, stream: str, chunk: bytes) -> None:
        data = self.partial[stream] + chunk
        *lines, self.partial[stream] = data.split(b"\n")
        for line in lines:
            self.line(stream, line)

    def line(self, stream: str, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace")
        if stream == "stdout" and text.startswith(RESULT_MARK):
            self.result = json.loads(text[len(RESULT_MARK):])
            return
        self.write(stream, f"{self.host}: {text}\n" if self.prefix else text + "\n")

    def flush(self) -> None:
        for stream, rest in self.partial.items():
            if rest:
                self.line(stream, rest)
        self.partial = {"stdout": b"", "stderr": b""}


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


async def bring_home(fan: "Fanout", host: "Host", report: dict, dest: Path) -> dict:
    """Copy one report here and check it against the sha256 the node computed."""
    dest.mkdir(parents=True, exist_ok=True)
    local = dest / os.path.basename(report["path"])
    partial = local.with_name(local.name + ".partial")
    entry = {"remote": report["path"], "local": str(local), "size": report["size"], "sha256": report["sha256"],
             "finished_from_qdstrm": report.get("finished_from_qdstrm", False), "verified": False}
    try:
        await fan.fetch(host, report["path"], str(partial))
        got = await asyncio.to_thread(sha256_of, str(partial))
        if got != report["sha256"]:
            entry["error"] = f"sha256 mismatch: node {report['sha256']}, here {got}; the node's copy is kept"
            partial.unlink(missing_ok=True)
            return entry
        partial.replace(local)
        entry["verified"] = True
    except OSError as e:
        entry["error"] = f"could not bring it home: {e}; the node's copy is kept"
    return entry


async def plan_all(fan: "Fanout", hosts: list["Host"], req: ProfileRequest) -> dict[str, HostRun]:
    """Round trip 1: probe every node and plan (or refuse) the run there."""
    runs = {h.name: HostRun(h.name) for h in hosts}
    for h, r in zip(hosts, await probe.probe(fan, hosts, environment_check=False)):
        run = runs[h.name]
        if r.extra.get("state") is None:
            run.status, run.error = ("unreachable" if not r.reached else "failed"), r.error
            continue
        run.plan = plan(h.name, r.extra["state"], req, h.vars.get("owned_sysctls"))
        run.status = "planned" if run.plan.status == "ok" else "refused"
    return runs


async def run_planned(fan: "Fanout", hosts: list["Host"], runs: dict[str, HostRun], req: ProfileRequest, *,
                      out: Path, write: Callable[[str, str], None] = lambda s, t: None,
                      stop: asyncio.Event | None = None) -> None:
    """Round trip 2: the agent carries out each planned run; the reports come home."""
    todo = [h for h in hosts if runs[h.name].status == "planned"]
    payload = probe.bundle()

    async def one(host: "Host") -> Result:
        run = runs[host.name]
        sink = LineSink(host.name, len(todo) > 1, write)
        r = await fan.run(host, probe.agent_argv(host, {"mode": "profile", "plan": run.plan.to_json()}),
                          input=payload, sink=sink, stop=stop)
        sink.flush()
        run.result = sink.result
        if run.result is None:
            run.status = "unreachable" if not r.reached else "failed"
            run.error = r.error or f"the agent ended (exit {r.exit_status}) without a result: " \
                                   f"{r.stderr.decode(errors='replace').strip()[-300:]}"
            return r
        run.status = {"ok": "ok", "refused": "refused"}.get(run.result["status"], "failed")
        if run.status != "ok":
            run.error = "; ".join(run.result.get("reasons") or []) or run.result["status"]
        for report in run.result.get("reports", []):
            run.reports.append(await bring_home(fan, host, report, out / req.run_id / host.name))
        if any(not rep["verified"] for rep in run.reports):
            run.status, run.error = "failed", "; ".join(rep["error"] for rep in run.reports if not rep["verified"])
        return r

    await fan.each(todo, one)


async def profile(fan: "Fanout", hosts: list["Host"], req: ProfileRequest, *, out: Path, dry_run: bool = False,
                  write: Callable[[str, str], None] = lambda s, t: None,
                  stop: asyncio.Event | None = None) -> list[HostRun]:
    runs = await plan_all(fan, hosts, req)
    if not dry_run:
        await run_planned(fan, hosts, runs, req, out=out, write=write, stop=stop)
    return list(runs.values())


def exit_status(runs: list[HostRun]) -> int:
    statuses = [r.status for r in runs]
    if all(s in ("ok", "planned") for s in statuses):
        return exitcodes.OK
    if all(s == "refused" for s in statuses):
        return exitcodes.REFUSED
    if any(s in ("ok", "planned") for s in statuses):
        return exitcodes.PARTIAL
    return exitcodes.UNREACHABLE if any(s == "unreachable" for s in statuses) else exitcodes.FAILED


def render(run: HostRun) -> str:
    """One host's plan or outcome, for people."""
    lines = [f"{run.host}: {run.status}" + (f": {run.error}" if run.error else "")]
    p = run.plan
    if p and p.status == "ok" and run.status == "planned":
        lines.append(f"  run:      {p.shell()}")
        for name, value in p.sysctls.items():
            lines.append(f"  sysctl:   {name} -> {value} for the run, then restored (owned)")
        if p.gpu_locks:
            lines.append(f"  lock:     GPU counters of {', '.join(p.gpu_locks)}")
        if p.recheck:
            lines.append(f"  check:    GPUs {p.recheck['gpus']} again right before the profiler starts")
        if p.pause_dcgm:
            lines.append("  dcgm:     profiling paused for the run, resumed after")
    elif p and p.status == "refused":
        lines += [f"  because:  {r}" for r in p.reasons]
        if p.remedy:
            lines.append(f"  remedy:   {p.remedy}")
    given_up = (run.result or {}).get("given_up") or (p.given_up if p else ())
    lines += [f"  gave up:  {g}" for g in given_up]
    for note in (run.result or {}).get("notes", []):
        if isinstance(note, dict):  # a .qdstrm the agent finished
            note = f"finished {note['finished']} with {note['by']}"
        lines.append(f"  note:     {note}")
    for rep in run.reports:
        state = "verified" if rep["verified"] else "NOT brought home"
        extra = ", finished from .qdstrm" if rep.get("finished_from_qdstrm") else ""
        lines.append(f"  report:   {rep['local']} ({rep['size']} bytes, sha256 {rep['sha256'][:12]}…, {state}{extra})")
    return "\n".join(lines) + "\n"
