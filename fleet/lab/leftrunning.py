"""Workloads left running on lab servers (``--window --detach``, Ctrl-C's "leave it running"):
which runs of the store left one, whether each still runs, and ending them.

A run that left one is marked in the store (``left-running`` beside its manifest), so that
``fleet jobs`` looks at those runs alone, not at every manifest. Whether a workload still runs is
one look a host: each pid's start time (clock ticks since boot) and the boot's id, against what the
agent recorded as it left (wire.RUNNING): a pid the kernel gave to a later process is not the
workload. What a node answers is checked line by line against that shape, never followed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .. import store
from ..store import private
from ..store.errors import CatalogError, UnsafeStore
from ..store.layout import MANIFEST

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..store.manifest import HostEntry, RunManifest
    from ..transport import Fanout

MARK = "left-running"
LOOK_TIMEOUT = 20.0  # seconds one host's look may take
# Each pid given, as "PID STARTTIME" while it exists (its 20th field past the command's ")"), after
# the boot's id, after a line of its own (what a shell's start-up files print comes
# before it, and is not read).
MARKER = "fleet-left-running-look"
LOOK = ('echo ' + MARKER + '; cat /proc/sys/kernel/random/boot_id; for p; do '
        's=$(sed "s/.*) //" "/proc/$p/stat" 2>/dev/null | cut -d" " -f20) && [ -n "$s" ] && echo '
        '"$p $s"; done; exit 0')
BOOT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
PID_LINE = re.compile(r"([0-9]{1,10}) ([0-9]{1,20})")


@dataclass
class LeftRunning:
    """One host's workload a run left running, and what a look at the host found."""
    run_id: str
    host: str
    pids: list[int]
    started: list[int | None]
    boot: str | None
    output: str | None
    session: int | None = None  # its processes' session (nsys's): fleet top marks them by it
    # fleet cancel: the pids that got its SIGTERM
    signalled: list[int] = field(default_factory=list)
    state: str = "unknown"     # running | ended | unknown (the host did not answer)
    why: str | None = None     # why unknown

    def to_json(self) -> dict:
        return {"run_id": self.run_id, "host": self.host, "pids": self.pids, "state": self.state,
                "output": self.output, "why": self.why, "signalled": self.signalled}


def mark(directory: Path, manifest: "RunManifest") -> None:
    """The run marked as one that left a workload running, where one of its hosts did."""
    if any(of_entry(manifest.run_id, h) for h in manifest.hosts):
        private.write_file(directory / MARK, manifest.run_id + "\n")


def of_entry(run_id: str, entry: "HostEntry") -> LeftRunning | None:
    """What a host's result says it left running, where its shape holds (wire.RUNNING), or None."""
    answer = entry.answer
    running = (answer.workload.running if answer is not None and answer.workload is not None
               else None)
    pids = _pids(list(running.pids)) if running is not None else None
    if not pids or len(running.started) != len(pids):
        return None
    return LeftRunning(run_id, entry.host, pids,
                       [s if _whole(s) else None for s in running.started],
                       running.boot if running.boot is not None and BOOT.fullmatch(running.boot)
                       else None,
                       running.output, running.session if _whole(running.session)
                       and running.session > 0 else None)


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _pids(value) -> list[int]:
    """A record's pids, each a whole number above 0, or [] where one is not."""
    if not isinstance(value, list) or not all(_whole(p) and p > 0 for p in value):
        return []
    return value


def marked(store_root: Path, on_skipped=lambda why: None) -> list[tuple[Path, "RunManifest"]]:
    """(folder, manifest) of every run marked as having left a workload running."""
    found = []
    for mark_path in sorted(store_root.glob(f"*/*/*/{MARK}")):
        try:
            found.append((mark_path.parent, store.read_manifest(mark_path.parent / MANIFEST)))
        except UnsafeStore:
            raise
        except CatalogError as e:
            on_skipped(f"skipped a run whose manifest cannot be read: {e}")
    return found


def in_store(store_root: Path, run_ids: tuple[str, ...] = (),
             on_skipped=lambda why: None) -> list[tuple[Path, list[LeftRunning]]]:
    """(folder, what its hosts left running) of each marked run, or of those named among them."""
    found = []
    for folder, manifest in marked(store_root, on_skipped):
        if run_ids and manifest.run_id not in run_ids:
            continue
        items = [item for h in manifest.hosts if (item := of_entry(manifest.run_id, h)) is not None]
        if items:
            found.append((folder, items))
    return found


def by_session(store_root: Path) -> dict[tuple[str, int], str]:
    """(host, session) -> run id of every workload the store's runs left running, for fleet top to
    mark its processes (a label only: what fleet jobs and fleet cancel act on is
    checked by start time)."""
    try:
        found = in_store(store_root)
    except (UnsafeStore, OSError):
        return {}
    return {(item.host, item.session): item.run_id for _, items in found for item in items
            if item.session}


def read_look(answer: str, left: LeftRunning) -> str:
    """running or ended, by a host's answer to LOOK; ValueError for one not of its shape."""
    lines = answer.splitlines()
    lines = lines[len(lines) - lines[::-1].index(MARKER):] if MARKER in lines else []
    if not lines or not BOOT.fullmatch(lines[0].strip()):
        raise ValueError("no boot id in the answer")
    now = {}
    for line in lines[1:]:
        m = PID_LINE.fullmatch(line.strip())
        if not m:
            raise ValueError(f"a line not of the look's shape: {line[:80]!r}")
        now[int(m.group(1))] = int(m.group(2))
    same_boot = left.boot is not None and lines[0].strip() == left.boot
    alive = [pid for pid, began in zip(left.pids, left.started)
             if same_boot and began is not None and now.get(pid) == began]
    return "running" if alive else "ended"


async def look(fan: "Fanout", inventory: "Inventory", left: list[LeftRunning]) -> None:
    """Each one's state, by one look at its host (in parallel, each bounded)."""
    import asyncio

    # the inventory resolved once, not once a workload
    hosts = {h.name: h for h in inventory.select()}

    async def one(item: LeftRunning) -> None:
        host = hosts.get(item.host)
        if host is None:  # a host the inventory no longer has: not looked at
            item.why = "not in the inventory now"
            return
        r = await fan.run(host, ["sh", "-c", LOOK, "sh", *map(str, item.pids)],
                          timeout=LOOK_TIMEOUT)
        if not r.ok:
            item.why = r.error or f"the look exited {r.exit_status}"
            return
        try:
            item.state = read_look(r.stdout.decode(errors="replace"), item)
        except ValueError as e:
            item.why = f"an answer fleet does not read: {e}"

    await asyncio.gather(*(one(item) for item in left))


# Each pid given with its start time, after the boot's id: SIGTERM to those that are still that
# process, to its process group where it leads one (nsys's, the workload's), as the agent's own stop
# does; each pid signalled said back.
END = ('[ "$(cat /proc/sys/kernel/random/boot_id)" = "$1" ] || exit 0; shift; while [ $# -gt 1 ]; '
       'do p=$1; want=$2; shift 2; f=$(sed "s/.*) //" "/proc/$p/stat" 2>/dev/null); '
       's=$(echo "$f" | cut -d" " -f20); g=$(echo "$f" | cut -d" " -f3); '
       'if [ -n "$s" ] && [ "$s" = "$want" ]; then '
       'if [ "$g" = "$p" ]; then kill -s TERM -- "-$p" 2>/dev/null && echo "$p"; '
       'else kill -s TERM "$p" 2>/dev/null && echo "$p"; fi; fi; done; exit 0')


async def end(fan: "Fanout", inventory: "Inventory", left: list[LeftRunning]) -> None:
    """SIGTERM to each one still running, where it is still that process (its boot and start
    time): ``signalled`` the pids that got it (none: each had ended already); its state "ended"."""
    import asyncio

    # the inventory resolved once, not once a workload
    hosts = {h.name: h for h in inventory.select()}

    async def one(item: LeftRunning) -> None:
        host = hosts.get(item.host)
        pairs = [str(w) for pid, began in zip(item.pids, item.started) if began is not None
                 for w in (pid, began)]
        if host is None or item.boot is None or not pairs:
            item.why = ("not in the inventory now" if host is None
                        else "its record cannot tell it from a later process")
            return
        r = await fan.run(host, ["sh", "-c", END, "sh", item.boot, *pairs], timeout=LOOK_TIMEOUT)
        if not r.ok:
            item.why = r.error or f"the stop exited {r.exit_status}"
            return
        said = r.stdout.decode(errors="replace").split()
        item.signalled = [pid for pid in item.pids if str(pid) in said]
        item.state = "ended"

    await asyncio.gather(*(one(item) for item in left))


def unmark_ended(folder: Path, items: list[LeftRunning]) -> None:
    """A run none of whose workloads still runs is no longer marked (fleet jobs skips it then)."""
    if items and all(item.state == "ended" for item in items):
        try:
            (folder / MARK).unlink()
        except FileNotFoundError:
            pass
