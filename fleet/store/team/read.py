"""The team store from the commands' side: runs and reports listed, shown, pulled, shared, removed,
and the embedded store's runs pushed. Each call opens its own connection, as its person's role."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ... import safenames
from .. import layout, private
from ..manifest import RunManifest
from . import catalog, objects, push
from .catalog import TeamError, TeamUnavailable
from .config import TeamStore


def reports(team: TeamStore, **filters) -> list[dict]:
    with catalog.connected(team) as conn:
        catalog.check_version(conn)
        return catalog.reports(conn, **filters)


def report_table(team: TeamStore, **filters) -> list[tuple]:
    """``reports`` as the listing's rows of text (catalog.TABLE_COLUMNS)."""
    with catalog.connected(team) as conn:
        catalog.check_version(conn)
        return catalog.report_table(conn, **filters)


def manifest(team: TeamStore, run_id: str) -> tuple[str, RunManifest, list[str]]:
    """(owner, manifest, groups it is shared with) of a run this person may see."""
    layout.check_run_id(run_id)
    with catalog.connected(team) as conn:
        catalog.check_version(conn)
        owner, doc = catalog.manifest(conn, run_id)
        groups = catalog.shares(conn, run_id)
    return owner, RunManifest.from_json(doc), groups


def share(team: TeamStore, run_id: str, group: str) -> list[str]:
    layout.check_run_id(run_id)
    safenames.check_component(group, "the group")
    with catalog.connected(team) as conn:
        catalog.check_version(conn)
        if not catalog.group_exists(conn, group):
            raise TeamError(f"no group {group!r} in the team catalog")
        catalog.share(conn, run_id, group)
        return catalog.shares(conn, run_id)


def remove(team: TeamStore, run_id: str) -> int:
    """The run's rows gone (its owner's, or an admin's doing), then its objects: the count back.
    Objects of another person's run (an admin removing it) are left to the admin's S3 tools."""
    layout.check_run_id(run_id)
    with catalog.connected(team) as conn:
        catalog.check_version(conn)
        owner, _ = catalog.manifest(conn, run_id)
        keys = catalog.remove(conn, run_id)
        me = catalog.whoami(conn)
    if owner == me and keys:
        objects.delete(objects.client(), team.objects.bucket, sorted(set(keys)))
    return len(keys)


@dataclass
class Pulled:
    host: str
    name: str
    target: Path | None = None
    problem: str | None = None


def pull(team: TeamStore, run_id: str, dest: Path) -> list[Pulled]:
    """Every catalogued file of the run into DEST/HOST/NAME, each through an address the catalog
    signed for this person, checked against its sha256 before it takes its name."""
    layout.check_run_id(run_id)
    with catalog.connected(team) as conn:
        catalog.check_version(conn)
        catalog.manifest(conn, run_id)  # LookupError for a run this person may not see
        rows = [r for r in catalog.reports(conn) if r["run_id"] == run_id and r["object_key"]]
        urls = {r["object_key"]: catalog.object_url(conn, run_id, r["object_key"]) for r in rows}
    private.check_store(dest)
    pulled = []
    for r in rows:
        host, name = r["host"], r["name"]
        try:
            folder = safenames.join(dest, host, what="host name")
            target = safenames.join(folder, name, what="report name")
        except safenames.UnsafeName as e:
            pulled.append(Pulled(host, name, problem=str(e)))
            continue
        private.check_folder(folder, dest)
        try:
            objects.download(urls[r["object_key"]], target, r["sha256"])
            pulled.append(Pulled(host, name, target))
        except TeamError as e:
            pulled.append(Pulled(host, name, problem=str(e)))
    return pulled


@dataclass
class PushReport:
    pushed: list[push.Pushed] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)   # (run id, why)


def push_runs(team: TeamStore, store_root: Path, run_ids: list[str] | None,
              on_run: Callable[[str, "push.Pushed | None", str | None], None] = lambda r, p,
              e: None) -> PushReport:
    """The runs named (or every finished run of the embedded store) pushed, each on its own: one
    that fails is said and the others go on; one the catalog is unreachable for stops the rest."""
    ids = run_ids if run_ids else finished_runs(store_root)
    report = PushReport()
    s3 = objects.LazyClient()  # one S3 client and one catalog connection for every run of the push
    try:
        with catalog.connected(team) as conn:
            for run_id in ids:
                if not _push_one(team, store_root, run_id, s3, conn, report, on_run):
                    break
    # not reached at all: the first run says so (later, each run has said its own)
    except TeamUnavailable as e:
        if ids and not (report.failed or report.pushed):
            report.failed.append((ids[0], str(e)))
            on_run(ids[0], None, str(e))
    return report


def _push_one(team: TeamStore, store_root: Path, run_id: str, s3, conn, report: PushReport,
              on_run: Callable[[str, "push.Pushed | None", str | None], None]) -> bool:
    """One run pushed, or its failure said; False where the catalog is gone and the push stops."""
    try:
        done = push.push_run(team, store_root, layout.check_run_id(run_id), s3=s3, conn=conn)
    except TeamUnavailable as e:
        report.failed.append((run_id, str(e)))
        on_run(run_id, None, str(e))
        return False
    except (TeamError, LookupError, ValueError, OSError) as e:
        report.failed.append((run_id, str(e)))
        on_run(run_id, None, str(e))
        return True
    report.pushed.append(done)
    on_run(run_id, done, None)
    return True


def finished_runs(store_root: Path) -> list[str]:
    """Every run of the embedded store that has finished, oldest first (by
    id: the time it began)."""
    from ..manifest_io import read_manifest

    if not store_root.exists():
        return []
    private.check_store(store_root)
    ids = []
    for path in layout.manifests(store_root):
        try:
            if read_manifest(path).status not in push.NOT_YET:
                ids.append(path.parent.name)
        except (ValueError, OSError):
            continue
    return sorted(ids)


def after_save(store_root: Path, manifest_path: Path, status: str) -> str | None:
    """Once a run has finished: pushed to the team store, when one is named. What happened back, as
    one line (None without a team store). Never raises: the run is saved
    whatever the team store says."""
    from .config import resolve

    if status in push.NOT_YET or os.environ.get("FLEET_NO_PUSH"):
        return None
    try:
        team = resolve()
        if team is None:
            return None
        done = push.push_run(team, store_root, manifest_path.parent.name)
    except (TeamError, LookupError, ValueError, OSError) as e:
        return (f"not pushed to the team store ({e}); `fleet reports push "
                f"{manifest_path.parent.name}` sends it later")
    if done.unchanged:
        return "team store: pushed (unchanged)"
    return f"team store: pushed ({done.sent} file(s) sent, {done.already_there} already there)"


class TeamHistory:
    """The nightly report's runs from the team catalog (:class:`fleet.nightly.run.EmbeddedHistory`'s
    twin): every metric of a playbook that this person may see, their own
    runs and the shared ones."""

    def __init__(self, team: TeamStore):
        self.team = team

    def metric_history(self, playbook: str, since: str | None) -> list[dict]:
        with catalog.connected(self.team) as conn:
            catalog.check_version(conn)
            rows = catalog.metric_history(conn, playbook, since)
        return [dict(r, flags=r["flags"] if isinstance(r["flags"], list) else []) for r in rows]

    def run_place(self, run_id: str) -> tuple[dict, RunManifest] | None:
        """Where a run of the team store is (its owner's objects; no report on this machine) and its
        manifest; None where it cannot be read."""
        try:
            owner, m, _ = manifest(self.team, run_id)
        except (LookupError, ValueError):
            return None
        return {"dir": f"{self.team.objects} (team store, {owner}'s run {run_id})",
                "reports": []}, m

    def compare(self, a: str, b: str) -> list[dict]:
        from ..queries import kernel_changes

        totals: dict[str, dict[str, int]] = {}
        with catalog.connected(self.team) as conn:
            for run in (a, b):
                for name, total in conn.execute("SELECT name, SUM(total_ns) FROM fleet.kernels "
                                                "WHERE run_id = %s GROUP BY name", (run,)):
                    totals.setdefault(name, {})[run] = int(total)
        return kernel_changes(totals, a, b)


CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "fleet" / "team-runs"


def materialize(team: TeamStore, run_ids: list[str], cache: Path | None = None) -> Path:
    """The runs named, copied from the team store into a private store of their own (``CACHE``, laid
    out and catalogued as the embedded store is), so that ``reports stats``, ``compare``, ``ranks``
    and ``open`` read a team run exactly as they read one of the embedded store. Each file comes
    through an address the catalog signed, checked against its sha256; one already there at its size
    is kept. The cache's root back."""
    from ..catalog import record
    from ..manifest_io import write_manifest

    root = cache or CACHE
    private.check_store(root)
    for run_id in run_ids:
        layout.check_run_id(run_id)
        with catalog.connected(team) as conn:
            catalog.check_version(conn)
            _, doc = catalog.manifest(conn, run_id)
            rows = [r for r in catalog.reports(conn) if r["run_id"] == run_id and r["object_key"]]
            urls = {r["object_key"]: catalog.object_url(conn, run_id, r["object_key"])
                    for r in rows}
        m = RunManifest.from_json(doc)
        directory = layout.run_dir(root, m.site, m.run_id)
        private.check_folder(directory, root)
        by_name = {(r["host"], r["name"]): r for r in rows}
        for host in m.hosts:
            for rep in host.reports:
                row = by_name.get((host.host, Path(rep.stored or rep.remote).name))
                where = layout.here(directory / layout.MANIFEST, rep.stored)
                if row is not None and where is not None:
                    _cached(Path(where), row, urls[row["object_key"]], root)
        record(root, write_manifest(directory, m, root))
    return root


def _cached(target: Path, row: dict, url: str, root: Path) -> None:
    """One file of a run in the cache, where the run's manifest says it is below its folder."""
    private.check_folder(target.parent, root)
    if not (target.is_file() and not target.is_symlink() and target.stat().st_size == row["size"]):
        objects.download(url, target, row["sha256"])
