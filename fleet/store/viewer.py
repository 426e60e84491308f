"""``fleet reports open``: a run's reports in Nsight's own viewer (nsys-ui, ncu-ui) where one is
installed here, else the command that would open them."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import _inside
from .manifest import RunManifest
from .stats import StatsError, choose_columns

VIEWERS = {"nsys": "nsys-ui", "ncu": "ncu-ui"}
# a report whole in the store (not a summary, not missing)
VIEWABLE = ("complete", "finished-from-qdstrm")


@dataclass
class Opening:
    viewer: str                   # the program's name
    reports: list[Path]
    path: str | None              # where it was found on PATH; None: not installed here
    pid: int | None = None        # the viewer started (detached)

    @property
    def command(self) -> list[str]:
        return [self.path or self.viewer, *map(str, self.reports)]

    def shell_line(self) -> str:
        return shlex.join(self.command)


def reports_to_open(store: Path, manifest: RunManifest, which: str | None = None) -> list[Path]:
    """The run's reports (of HOST or RANK ``which``) that are whole in this store."""
    found = [Path(r.stored) for h in choose_columns(manifest, which) for r in h.reports
             if r.status in VIEWABLE and r.verified and r.stored and _inside(store, Path(r.stored))]
    if not found:
        where = f" of {which}" if which else ""
        raise StatsError(f"run {manifest.run_id} has no report{where} in the store to open")
    return found


def open_reports(store: Path, manifest: RunManifest, which: str | None = None, *,
                 launch: bool = True) -> Opening:
    """Start the tool's viewer on the reports, detached (its own session, no terminal: closing
    this shell leaves it open), when it is on PATH; else the Opening says what to run."""
    tool = manifest.asked.tool or "nsys"
    viewer = VIEWERS.get(tool, "nsys-ui")
    opening = Opening(viewer, reports_to_open(store, manifest, which), shutil.which(viewer))
    if opening.path and launch:
        proc = subprocess.Popen(opening.command, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        opening.pid = proc.pid
    return opening
