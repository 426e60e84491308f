"""``fleet gather`` of a lab run: what a run left on its nodes (fleet killed, a transfer that
failed) brought home. The agent's result is read from beside the reports on the node, checked as
a fresh answer is, and every report not yet verified in the store is fetched and verified."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .. import agentcall, completeness, outcome, safenames, store
from ..agent import wire
from ..collection.bring import bring_home
from ..plan import Plan
from ..rundir import RunDir
from ..store.manifest import HostEntry, RunManifest
from . import leftrunning
from .profile import removing
from .ranks import with_missing_ranks

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout

GATHER_TIMEOUT = 60.0  # reading one small result file


async def gather(fan: "Fanout", hosts: dict[str, "Host"], store_root: Path,
                 run_id: str) -> RunManifest:
    """Bring home what a run left on its nodes (fleet killed, a transfer that failed): the
    agent's result is read from beside the reports, and every report not yet verified fetched."""
    path = store.manifest_of(store_root, run_id)
    manifest = store.read_manifest(path)
    for entry in manifest.hosts:
        host, plan = hosts.get(entry.host), entry.planned
        if host is None or plan is None or not _left_something(entry, plan):
            continue
        node_dir = os.path.dirname(plan.output)
        if entry.result is None:
            await _result_on_node(fan, host, entry, node_dir)
        if entry.answer is None:
            continue
        entry.reports = [rep for rep in entry.reports if rep.verified]
        have = {rep.remote for rep in entry.reports}
        missing = wire.named_files(entry.result, besides=have)
        into = safenames.join(path.parent, host.name, what="host name")
        entry.reports += await bring_home(fan, host, missing, into, node_dir=node_dir,
                                          remove_for=removing(host),
                                          output=plan.output)
        entry.status, entry.missing_why = outcome.of_result(
            entry.answer, entry.reports, tool=plan.tool,
            allow_own=completeness.allows_own(plan))
    manifest.hosts = with_missing_ranks(manifest.hosts)
    manifest.status = outcome.run_status(h.status for h in manifest.hosts)
    leftrunning.mark(store.save(store_root, manifest), manifest)
    return manifest


def _left_something(entry: HostEntry, plan: Plan) -> bool:
    """Whether a host ran (its plan was ok) and has something not yet home: its result or a
    report."""
    return plan.status == "ok" and not (entry.reports and all(r.verified for r in entry.reports))


async def _result_on_node(fan: "Fanout", host: "Host", entry: HostEntry, node_dir: str) -> None:
    """The agent's result where fleet went away before its last word: read from beside the reports
    into ``entry``, or why not in ``entry.missing_why``."""
    r = await fan.run(host, ["cat", "--", RunDir(node_dir).result(host.name)],
                      timeout=GATHER_TIMEOUT)
    if r.exit_status != 0:
        entry.missing_why = ("no result on the node yet: "
                             f"{r.error or r.stderr.decode(errors='replace').strip()}")
        return
    try:
        entry.result = agentcall.read_answer(r.stdout.decode(errors="replace"), "profile")
    except wire.WireError as e:
        entry.missing_why = f"the result on the node is not readable yet: {e}"
