"""``fleet profile`` on lab servers: probe, plan, run the agent, bring the reports home.

Two round trips per node (the probe, then the run) over one connection. The
policy decides; the agent acts on the node; this module only moves plans,
output and reports, and says what happened on each node.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import containers, safenames, store
from . import probe
from ..agent import node
from ..agent.bundle import bundle
from ..agent.run import RESULT_MARK, results_in
from ..store.collect import fetch_verified, is_summary
from ..store.manifest import HostEntry, ReportEntry, RunManifest, run_status
from ..plan import Plan, ProfileRequest, plan
from ..policy import NO_SAMPLING_FLAGS, docker_privileges
from ..transport import Result

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


@dataclass
class HostRun:
    host: str
    status: str = "pending"          # ok | refused | failed | unreachable | planned
    plan: Plan | None = None
    state: dict | None = None        # what the probe found
    result: dict | None = None       # the agent's document
    reports: list[ReportEntry] = field(default_factory=list)
    error: str | None = None


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
            self.result = (results_in(text) or [None])[0]
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
    # The inventory refuses such names when it is read; a host made some other way is kept off
    # the nodes here, since its name becomes the report's, the result's and the store's paths.
    unsafe = {h.name: why for h in hosts if (why := safenames.component_problem(h.name, "host name"))}
    for name, why in unsafe.items():
        runs[name].status, runs[name].error = "failed", why
    hosts = [h for h in hosts if h.name not in unsafe]
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
    the policy grants it (sampling given up where Docker cannot allow it)."""
    sampling = not set(NO_SAMPLING_FLAGS) <= set(p.command.fleet_flags)
    granted = docker_privileges(p.tool, req.uses_counters, sampling, seccomp_profile)
    if granted.given_up:
        p = p.without_sampling(granted.given_up)
    uuids = p.env.get("CUDA_VISIBLE_DEVICES")
    tools = {t: (state.get("tools") or {}).get(t, {}).get("path") for t in ("nsys", "ncu")}
    wrapper = containers.docker_run(
        containers.Container("docker", req.docker_image, containers.nsight_dirs({k: v for k, v in tools.items() if v})),
        p.report_dir, user=f"{state.get('uid')}:{state.get('gid')}", gpus=tuple(uuids.split(",")) if uuids else None,
        privileges=granted)
    env = {k: v for k, v in p.env.items() if k != "CUDA_VISIBLE_DEVICES"}  # --gpus chose them
    return replace(p, command=replace(p.command, wrapper=tuple(wrapper)), env=env)


async def bring_home(fan: "Fanout", via: "Host", to_fetch: list[dict], dest_dir: Path, *,
                     gathering=None, read_through: bool = False) -> list[ReportEntry]:
    """Reports and summaries named by an agent's result, fetched through ``via`` into
    ``dest_dir`` and checked against the node's sha256."""
    if gathering is not None:
        gathering.expect(sum(r["size"] for r in to_fetch))
    entries = []
    for report in to_fetch:
        name = os.path.basename(str(report.get("path")))
        problem = safenames.component_problem(name, "the report's file name")
        if problem:  # named by the node (or, on Slurm, by a file the job could write): kept off the store
            entries.append(ReportEntry(remote=str(report.get("path")), error=problem))
            continue
        dest = dest_dir / name
        entry = await fetch_verified(fan, via, report, dest, gathering.advance if gathering else None)
        if read_through:
            entry["read_through"] = via.name
        if "summary" in report:  # an extra made of a report: a CSV summary, or its SQLite export
            entry.update(status="export" if report.get("kind") == "export" else "summary",
                         summary=report["summary"])
        entries.append(ReportEntry.from_json(entry))
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
        run.status = {"ok": "ok", "refused": "refused"}.get(run.result.get("status"), "failed")
        if run.status != "ok":
            run.error = "; ".join(run.result.get("reasons") or []) or str(run.result.get("status"))
        elif not run.result.get("reports"):  # "ok" with nothing to bring home has not done its job
            run.status, run.error = "failed", "the agent said ok but named no report"
        via = readers.get(host.vars.get("shared_report_dir"), host)
        to_fetch = run.result.get("reports", []) + run.result.get("summaries", [])
        run.reports += await bring_home(fan, via, to_fetch, safenames.join(out, host.name, what="host name"),
                                        gathering=gathering, read_through=via is not host)
        lost = [rep for rep in run.reports if not rep.verified and not is_summary(rep)]
        if lost:  # a summary that did not come home is recorded in its entry, and fails nothing
            run.status, run.error = "failed", "; ".join(rep.error or "" for rep in lost)
        return r

    await fan.each(todo, one)


async def profile(fan: "Fanout", hosts: list["Host"], req: ProfileRequest, *, store_root: Path, site: str,
                  dry_run: bool = False, write: Callable[[str, str], None] = lambda s, t: None,
                  stop: asyncio.Event | None = None, gathering=None) -> RunManifest:
    """Probe, plan, run; the reports and the run's manifest go into the store. The manifest back
    (for ``dry_run``, one with every host's plan, in the store nowhere)."""
    store.run_dir(store_root, site, req.run_id)  # a site that is no folder name stops here, before any node
    manifest = RunManifest.begin(req, site)
    runs = list((await plan_all(fan, hosts, req)).values())
    manifest.hosts = [entry_for(req, r) for r in runs]
    if dry_run:
        manifest.status = "dry-run"
        return manifest
    # Written before anything runs, so that `fleet gather` can finish the run if fleet dies.
    directory = store.save(store_root, manifest)
    await run_planned(fan, hosts, {r.host: r for r in runs}, req, out=directory, write=write, stop=stop,
                      gathering=gathering)
    manifest.hosts = [entry_for(req, r) for r in runs]
    manifest.status = run_status(r.status for r in runs)
    store.save(store_root, manifest)
    return manifest


async def gather(fan: "Fanout", hosts: dict[str, "Host"], store_root: Path, run_id: str) -> RunManifest:
    """Bring home what a run left on its nodes (fleet killed, a transfer that failed): the
    agent's result is read from beside the reports, and every report not yet verified fetched."""
    path = store.manifest_of(store_root, run_id)
    manifest = store.read_manifest(path)
    for entry in manifest.hosts:
        host = hosts.get(entry.host)
        plan_doc = entry.plan or {}
        if host is None or plan_doc.get("status") != "ok" or (
                entry.reports and all(r.verified for r in entry.reports)):
            continue
        result = entry.result
        if result is None:  # fleet went away before the agent's last word: it is on the node
            r = await fan.run(host, ["cat", f"{os.path.dirname(plan_doc['output'])}/{host.name}.result.json"])
            if r.exit_status != 0:
                entry.missing_why = f"no result on the node yet: {r.stderr.decode(errors='replace').strip()}"
                continue
            found = results_in(r.stdout.decode(errors="replace"))
            if not found:
                entry.missing_why = "the result on the node is not readable yet"
                continue
            result = entry.result = found[-1]
        entry.reports = [rep for rep in entry.reports if rep.verified]
        have = {rep.remote for rep in entry.reports}
        missing = [rep for rep in result.get("reports", []) + result.get("summaries", []) if rep["path"] not in have]
        entry.reports += await bring_home(fan, host, missing,
                                          safenames.join(path.parent, host.name, what="host name"))
        reports = [r for r in entry.reports if not is_summary(r)]
        ok = result.get("status") == "ok" and reports and all(r.verified for r in reports)
        entry.status = "ok" if ok else entry.status
        entry.missing_why = None if ok else entry.missing_why
    manifest.status = run_status(h.status for h in manifest.hosts)
    store.save(store_root, manifest)
    return manifest


def entry_for(req: ProfileRequest, run: HostRun) -> HostEntry:
    """A lab host's manifest entry: its node's facts from the state the probe found."""
    return HostEntry.from_facts(
        run.host, run.status, node.facts(run.state, req.gpus, req.tool) if run.state else None,
        missing_why=run.error, tenants_seen=[str(t) for t in (run.plan.tenants if run.plan else ())],
        given_up=(run.result or {}).get("given_up") or (run.plan.given_up if run.plan else ()),
        plan=run.plan.to_json() if run.plan else None, result=run.result, reports=run.reports)


def json_doc(manifest: RunManifest) -> dict:
    """``fleet profile --json``: the manifest, each host with ``error`` as this output always had it."""
    doc = manifest.to_json()
    for h in doc["hosts"]:
        h["error"] = h["missing_why"]
    return doc


def render(entry: HostEntry) -> str:
    """One host's plan or outcome, for people."""
    p = Plan.from_json(entry.plan) if entry.plan else None
    refused_by_plan = p is not None and p.status == "refused"
    lines = [f"{entry.host}: {entry.status}" + (f": {entry.missing_why}" if entry.missing_why and not refused_by_plan
                                                else "")]
    if p and p.status == "ok" and entry.status == "planned":
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
    lines += [f"  gave up:  {g}" for g in entry.given_up]
    for note in (entry.result or {}).get("notes", []):
        lines.append(f"  note:     {note}")
    for rep in entry.reports:
        state = "verified" if rep.verified else f"NOT brought home: {rep.error}"
        extra = ", finished from .qdstrm" if rep.status == "finished-from-qdstrm" else ""
        extra += ", empty: nothing of its kind was recorded" if is_summary(rep) and rep.size == 0 else ""
        kind = {"summary": "summary:", "export": "export: "}.get(rep.status, "report: ")
        lines.append(f"  {kind}  {rep.stored} ({rep.size} bytes, sha256 {(rep.sha256 or '')[:12]}…, {state}{extra})")
    return "\n".join(lines) + "\n"
