"""A one-call lab run's manifest, saved again as the hosts' plans are made from their probe answers:
each node runs its plan as soon as it has made it, and `fleet gather` finds a host's reports by its
plan, should fleet die while the nodes run."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Callable

from .. import since_started, store
from ..store.manifest import HostEntry, RunManifest


class PlansSaved:
    """A one-call run's manifest, saved again as the hosts' plans are made here (each node runs its
    plan as soon as it has made it), at most every SAVE_EVERY seconds: a thousand hosts' plans
    cost a few saves, not a thousand. Its phases say when the last plan was made."""

    SAVE_EVERY = 0.5

    def __init__(self, store_root: Path, manifest: RunManifest,
                 entries: Callable[[], list[HostEntry]]):
        self.store_root, self.manifest, self.entries = store_root, manifest, entries
        self.last = float("-inf")
        self.pending: asyncio.TimerHandle | None = None

    def planned(self) -> None:
        self.manifest.phases["probed"] = since_started()
        if self.pending is not None:
            return
        wait = self.last + self.SAVE_EVERY - asyncio.get_running_loop().time()
        if wait <= 0:
            self.save()
        else:
            self.pending = asyncio.get_running_loop().call_later(wait, self.save)

    def save(self) -> None:
        self.pending, self.last = None, asyncio.get_running_loop().time()
        self.manifest.hosts = self.entries()
        store.save(self.store_root, self.manifest)

    def close(self) -> None:
        """No save after the run's own last one."""
        if self.pending is not None:
            self.pending.cancel()
            self.pending = None
