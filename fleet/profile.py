"""``fleet profile`` on lab servers: probe, plan, run the agent, bring the reports home.

Two round trips per node (the probe, then the run) over one connection. The
policy decides; the agent acts on the node; this module only moves plans,
output and reports, and says what happened on each node.
"""

from __future__ import annotations

import asyncio
import getpass
import json
import os
import secrets
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from . import containers, exitcodes, probe, store
from .agent.bundle import bundle
from .agent.run import RESULT_MARK
from .collect import fetch_verified
from .plan import Plan, ProfileRequest, plan
from .policy import NO_SAMPLING_FLAGS
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
    state: dict | None = None        # what the probe found
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


async def plan_all(fan: "Fanout", hosts: list["Host"], req: ProfileRequest) -> dict[str, HostRun]:
    """Round trip 1: probe every node and plan (or refuse) the run there."""
    runs = {h.name: HostRun(h.name) for h in hosts}
    for h, r in zip(hosts, await probe.probe(fan, hosts, environment_check=False)):
        run = runs[h.name]
        if r.extra.get("state") is None:
            run.status, run.error = ("unreachable" if not r.reached else "failed"), r.error
            continue
        run.state = r.extra["state"]
        run.plan = plan(h.name, run.state, req, h.vars.get("owned_sysctls"))
        if req.docker_image and run.plan.status == "ok":
            run.plan = in_docker(run.plan, run.state, req, h.vars.get("docker_seccomp_profile"))
        run.status = "planned" if run.plan.status == "ok" else "refused"
        if run.status == "refused":
            run.error = "; ".join(run.plan.reasons)
    return runs


def in_docker(p: Plan, state: dict, req: ProfileRequest, seccomp_profile: str | None) -> Plan:
    """The plan with the profiler and workload inside ``docker run``, with the least privilege
    it needs (fleet/containers.py); CPU sampling is given up without a seccomp profile for it."""
    argv, given_up = list(p.argv), list(p.given_up)
    sampling = p.tool == "nsys" and not set(NO_SAMPLING_FLAGS) <= set(argv)
    if sampling and not seccomp_profile:
        argv[2:2] = NO_SAMPLING_FLAGS
        given_up.append("CPU sampling and context switches: Docker refuses perf_event_open without a "
                        "seccomp profile that allows it (set docker_seccomp_profile in the inventory)")
        sampling = False
    uuids = p.env.get("CUDA_VISIBLE_DEVICES")
    tools = {t: (state.get("tools") or {}).get(t, {}).get("path") for t in ("nsys", "ncu")}
    words = containers.docker_run(
        containers.Container("docker", req.docker_image, containers.nsight_dirs({k: v for k, v in tools.items() if v})),
        p.report_dir, user=f"{state.get('uid')}:{state.get('gid')}", gpus=tuple(uuids.split(",")) if uuids else None,
        cpu_sampling=sampling, counters=bool(p.gpu_locks) or p.tool == "ncu", seccomp_profile=seccomp_profile)
    env = {k: v for k, v in p.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # --gpus chose them
    return replace(p, argv=tuple(words + argv), env=env, given_up=tuple(given_up))


async def bring_home(fan: "Fanout", via: "Host", to_fetch: list[dict], dest_dir: Path, *,
                     gathering=None, read_through: bool = False) -> list[dict]:
    """Reports and summaries named by an agent's result, fetched through ``via`` into
    ``dest_dir`` and checked against the node's sha256."""
    if gathering is not None:
        gathering.expect(sum(r["size"] for r in to_fetch))
    entries = []
    for report in to_fetch:
        dest = dest_dir / os.path.basename(report["path"])
        entry = await fetch_verified(fan, via, report, dest, gathering.advance if gathering else None)
        if read_through:
            entry["read_through"] = via.name
        if "summary" in report:
            entry.update(status="summary", summary=report["summary"])
        entries.append(entry)
    return entries


async def run_planned(fan: "Fanout", hosts: list["Host"], runs: dict[str, HostRun], req: ProfileRequest, *,
                      out: Path, write: Callable[[str, str], None] = lambda s, t: None,
                      stop: asyncio.Event | None = None, gathering=None) -> None:
    """Round trip 2: the agent carries out each planned run; the reports come home."""
    todo = [h for h in hosts if runs[h.name].status == "planned"]
    payload = bundle()
    # Nodes that share a report directory (inventory: shared_report_dir: LABEL) are read
    # through one of them, once, instead of each over its own connection.
    readers: dict[str, "Host"] = {}
    for h in todo:
        label = h.vars.get("shared_report_dir")
        if label:
            readers.setdefault(label, h)

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
        via = readers.get(host.vars.get("shared_report_dir"), host)
        to_fetch = run.result.get("reports", []) + run.result.get("summaries", [])
        run.reports += await bring_home(fan, via, to_fetch, out / host.name, gathering=gathering,
                                        read_through=via is not host)
        if any(not rep["verified"] for rep in run.reports):
            run.status, run.error = "failed", "; ".join(rep["error"] for rep in run.reports if not rep["verified"])
        return r

    await fan.each(todo, one)


async def profile(fan: "Fanout", hosts: list["Host"], req: ProfileRequest, *, store_root: Path, site: str,
                  dry_run: bool = False, write: Callable[[str, str], None] = lambda s, t: None,
                  stop: asyncio.Event | None = None, gathering=None) -> list[HostRun]:
    """Probe, plan, run; the reports and the run's manifest go into the store."""
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    runs = await plan_all(fan, hosts, req)
    if dry_run:
        return list(runs.values())
    directory = store.run_dir(store_root, site, req.run_id)
    # Written before anything runs, so that `fleet gather` can finish the run if fleet dies.
    store.record(store_root, store.write_manifest(directory, manifest_for(req, site, started, list(runs.values()),
                                                                          status="running")))
    await run_planned(fan, hosts, runs, req, out=directory, write=write, stop=stop, gathering=gathering)
    manifest = store.write_manifest(directory, manifest_for(req, site, started, list(runs.values())))
    store.record(store_root, manifest)
    return list(runs.values())


async def gather(fan: "Fanout", hosts: dict[str, "Host"], store_root: Path, run_id: str) -> dict:
    """Bring home what a run left on its nodes (fleet killed, a transfer that failed): the
    agent's result is read from beside the reports, and every report not yet verified fetched."""
    path = store.manifest_of(store_root, run_id)
    manifest = json.loads(path.read_text())
    for entry in manifest["hosts"]:
        host = hosts.get(entry["host"])
        plan_doc = entry.get("plan") or {}
        if host is None or plan_doc.get("status") != "ok" or (
                entry["reports"] and all(r["verified"] for r in entry["reports"])):
            continue
        result = entry.get("result")
        if result is None:  # fleet went away before the agent's last word: it is on the node
            r = await fan.run(host, ["cat", f"{os.path.dirname(plan_doc['output'])}/{host.name}.result.json"])
            if r.exit_status != 0:
                entry["missing_why"] = f"no result on the node yet: {r.stderr.decode(errors='replace').strip()}"
                continue
            result = entry["result"] = json.loads(r.stdout)
        entry["reports"] = [rep for rep in entry["reports"] if rep["verified"]]
        have = {rep["remote"] for rep in entry["reports"]}
        missing = [rep for rep in result.get("reports", []) + result.get("summaries", []) if rep["path"] not in have]
        entry["reports"] += await bring_home(fan, host, missing, path.parent / host.name)
        ok = result.get("status") == "ok" and entry["reports"] and all(r["verified"] for r in entry["reports"])
        entry["status"] = "ok" if ok else entry["status"]
        entry["missing_why"] = None if ok else entry.get("missing_why")
    manifest["status"] = store.run_status(h["status"] for h in manifest["hosts"])
    store.record(store_root, store.write_manifest(path.parent, manifest))
    return manifest


def manifest_for(req: ProfileRequest, site: str, started: str, runs: list[HostRun], status: str | None = None) -> dict:
    """Everything needed to trust and compare a run later."""
    hosts = []
    for r in runs:
        state = r.state or {}
        gpus = [g for g in state.get("gpus") or [] if req.gpus is None or g.get("index") in req.gpus]
        tool = (state.get("tools") or {}).get(req.tool) or {}
        hosts.append({
            "host": r.host, "node": state.get("host"), "status": r.status,
            "missing_why": None if r.status == "ok" else r.error,
            "gpu": ", ".join(sorted({g.get("name") or "?" for g in gpus})) or None,
            "driver": (state.get("nvml") or {}).get("driver"), "tool_version": tool.get("version"),
            "tenants_seen": [str(t) for t in (r.plan.tenants if r.plan else ())],
            "processes_seen": [{"gpu": g["index"], **{k: p.get(k) for k in ("pid", "user", "used_memory", "foreign")}}
                               for g in gpus for p in g.get("processes") or []],
            "given_up": list((r.result or {}).get("given_up") or (r.plan.given_up if r.plan else ())),
            "plan": r.plan.to_json() if r.plan else None, "result": r.result, "reports": r.reports})
    return {**manifest_head(req, site, started), "status": status or store.run_status(r.status for r in runs),
            "hosts": hosts}


def manifest_head(req: ProfileRequest, site: str, started: str) -> dict:
    """What every run's manifest begins with, on lab servers and on Slurm."""
    return {"run_id": req.run_id, "site": site, "day": f"{req.run_id[0:4]}-{req.run_id[4:6]}-{req.run_id[6:8]}",
            "started": started, "user": getpass.getuser(), "request": asdict(req)}


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
    p = run.plan
    refused_by_plan = p is not None and p.status == "refused"
    lines = [f"{run.host}: {run.status}" + (f": {run.error}" if run.error and not refused_by_plan else "")]
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
    elif refused_by_plan:
        lines += [f"  because:  {r}" for r in p.reasons]
        if p.remedy:
            lines.append(f"  remedy:   {p.remedy}")
    given_up = (run.result or {}).get("given_up") or (p.given_up if p else ())
    lines += [f"  gave up:  {g}" for g in given_up]
    for note in (run.result or {}).get("notes", []):
        lines.append(f"  note:     {note}")
    for rep in run.reports:
        state = "verified" if rep["verified"] else f"NOT brought home: {rep.get('error')}"
        extra = ", finished from .qdstrm" if rep["status"] == "finished-from-qdstrm" else ""
        kind = "summary:" if rep["status"] == "summary" else "report: "
        lines.append(f"  {kind}  {rep['stored']} ({rep['size']} bytes, sha256 {rep['sha256'][:12]}…, {state}{extra})")
    return "\n".join(lines) + "\n"
