"""A run is one object: what was asked, what each host was to do, what happened, what was kept.

A :class:`Run` holds the request (:class:`fleet.request.ProfileRequest`), and once it has run its
manifest (:class:`fleet.store.manifest.RunManifest`), which holds each host's plan, each host's
outcome and every report brought home. One kind of run per path, each with one entry point,
:meth:`Run.go`:

* :class:`LabRun`: lab servers over SSH (fleet/lab/profile.py: probe, plan, run, bring home);
* :class:`SlurmRun`: one batch job (fleet/slurm/run.py: prepare, submit, watch, gather);
* :class:`RayRun`: a Ray cluster already running (fleet/ray/submit.py: submit, wait, bring home).

``go`` opens the run's pool of connections, carries the run out on its path, and closes the pool;
the run's exit status is its own (:meth:`Run.exit_status`). The command line builds a run, hands
it what only a terminal has (a stop request from its signals, a progress bar, where the workload's
output goes), and prints what came of it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from . import exitcodes
from .transport import Fanout

if TYPE_CHECKING:
    from .ray import submit as ray_submit
    from .inventory import Host
    from .placement.free import FreeGpus
    from .request import ProfileRequest
    from .slurm.cluster import Cluster
    from .slurm.options import CheckedJobSpec
    from .store.manifest import RunManifest
    from .transport.settings import SSHSettings


@dataclass
class Run:
    """One run, from its request to its manifest in the store."""
    request: "ProfileRequest"
    store_root: Path
    site: str | None
    manifest: "RunManifest | None" = field(default=None, init=False)

    async def go(self, settings: "SSHSettings", concurrency: int, *,
                 stop: Callable[[], asyncio.Event | None] = lambda: None,
                 **terminal: Any) -> "RunManifest":
        """The run carried out over a pool of connections of its own, opened and closed here.
        ``stop`` makes the stop request inside the run's event loop (a terminal's signals);
        ``terminal`` is what the path shows as it goes (see each kind's ``_on_path``)."""
        requested = stop()  # first: a Ctrl-C while the pool opens is heard too
        async with Fanout(settings, concurrency=concurrency) as fan:
            return await self.on(fan, requested, **terminal)

    async def on(self, fan: Fanout, stop: asyncio.Event | None = None,
                 **terminal: Any) -> "RunManifest":
        """The run carried out over a pool its caller holds (nightly: one pool for the night's
        playbooks, and what it asks of their hosts after each run)."""
        self.manifest = await self._on_path(fan, stop, **terminal)
        return self.manifest

    async def _on_path(self, fan: Fanout, stop: asyncio.Event | None,
                       **terminal: Any) -> "RunManifest":
        raise NotImplementedError

    def exit_status(self) -> int:
        """What the command that ran it exits with (fleet/exitcodes.py: for_run)."""
        return exitcodes.for_run(self.manifest)


@dataclass
class LabRun(Run):
    """A run on lab servers over SSH: each host probed, planned, run and its
    reports brought home."""
    hosts: list["Host"] = field(default_factory=list)
    dry_run: bool = False
    finish_timeout: float | None = None
    free: "FreeGpus | None" = None   # --gpu free [--count N]

    async def _on_path(self, fan: Fanout, stop: asyncio.Event | None, *,
                       write: Callable[[str, str], None] = lambda s, t: None,
                       gathering=None) -> "RunManifest":
        from .lab import profile as lab_profile  # each path's modules load only for a run on it
        return await lab_profile.profile(fan, self.hosts, self.request, store_root=self.store_root,
                                         site=self.site,
                                         dry_run=self.dry_run, write=write, stop=stop,
                                         gathering=gathering,
                                         finish_timeout=self.finish_timeout, free=self.free)


@dataclass
class SlurmRun(Run):
    """A run as one Slurm batch job, through the cluster's login node."""
    cluster: "Cluster | None" = None
    spec: "CheckedJobSpec | None" = None
    dry_run: bool = False
    wait: bool = True               # False: --no-wait, the job submitted and left to run
    poll: float = 5.0
    keep_pending: bool = False

    async def _on_path(self, fan: Fanout, stop: asyncio.Event | None, *, gathering=None,
                       on_state: Callable = lambda s: None,
                       on_python: Callable = lambda s: None) -> "RunManifest":
        from .slurm import run as slurm_run
        return await slurm_run.profile(fan, self.cluster, self.request, self.spec,
                                       store_root=self.store_root,
                                       site=self.site, dry_run=self.dry_run, wait=self.wait,
                                       poll=self.poll,
                                       stop=stop, on_state=on_state, gathering=gathering,
                                       keep_pending=self.keep_pending, on_python=on_python)

    def exit_status(self) -> int:
        return exitcodes.for_run(self.manifest, waited=self.wait)


@dataclass
class RayRun(Run):
    """A run of a Ray program on a cluster already running: submitted, waited for, its workers'
    reports brought home from the head."""
    head: "Host | None" = None
    job: "ray_submit.RayJob | None" = None

    async def _on_path(self, fan: Fanout, stop: asyncio.Event | None,
                       **terminal: Any) -> "RunManifest":
        from .ray import submit as ray_submit
        return await ray_submit.profile(fan, self.head, self.job, self.request,
                                        store_root=self.store_root, site=self.site)
