"""``fleet nightly confirm``'s runs: the workload put at version A or B by the playbook's
``checkout`` command (each checkout checked by its ``version`` command), the playbook run as a
normal run in the order A, B, B, A, and the workload put back at the version it was at, whatever
happened. The runs are kept in the store with their reports, but their metrics are no nights of the
history (they are kept under the manifest's ``playbook.confirm``, which neither catalog indexes).
The verdicts:
:mod:`.confirm`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .. import exitcodes
from ..errors import FleetError
from ..safenames import UnsafeValue, quote
from ..visible import visible
from . import confirm as verdicts
from .confirm import ConfirmError, Measured, Target
from .environment import Environment, of_manifest
from .playbook import Playbook
from .lock import playbook_lock
from .run import (history_of, home_script, judge_changes, run_playbook, workload_host,
                  workload_version)

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..store.manifest import RunManifest
    from ..transport import Fanout

CHECKOUT_TIMEOUT = 600   # seconds a checkout may take (it may build the workload)
ANSWER_LIMIT = 64 * 1024


def target_from_history(history, pb: Playbook, run_after: str | None,
                        since: str | None = None) -> Target:
    """The change to confirm, found in the playbook's history as ``fleet nightly report`` judges
    it."""
    runs: dict = {}
    rows = history_of(history, pb, since, runs)
    found = judge_changes(rows, runs, pb.thresholds)
    environments = {run: (info or {}).get("environments", {}) for run, info in runs.items()}
    return verdicts.target_of(found, environments, run_after)


@dataclass
class Confirmation:
    target: Target
    # (side, version, run id), in order
    runs: list[tuple[str, str, str]] = field(default_factory=list)
    measured: dict[tuple[str, str], list[Measured]] = field(default_factory=dict)
    left_at: str | None = None      # the version the workload was put back at
    restore_error: str | None = None
    error: str | None = None        # why the runs stopped before the last


VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+@:/-]{0,127}")


def checked_version(version: str) -> str:
    """A version fit to give the checkout command as its last word, or ConfirmError. Versions come
    from the history (what a node's version command printed) or the command line: one word of a
    tag's, a branch's or a hash's characters, never an option ('-'), never a path out ('..')."""
    if not VERSION.fullmatch(version) or ".." in version:
        raise ConfirmError(visible(f"version {version!r} is not one a checkout command may be "
                                   "given: one word of letters, digits and . _ + @ : / -, not "
                                   "starting with - or ., without '..'"))
    return version


async def put_at(fan: "Fanout", host, pb: Playbook, version: str) -> None:
    """The workload at ``version`` on ``host``, by the playbook's checkout command, and its version
    command then saying so; else ConfirmError."""
    checked_version(version)
    try:  # the version one quoted word of its own: no '~/' of the playbook's words applies to it
        script = home_script(pb.checkout, "checkout", CHECKOUT_TIMEOUT) + " " + quote(version,
                                                                                      "version")
    except UnsafeValue as e:
        raise ConfirmError(f"version {visible(version)!r} cannot be checked out: {e}") from None
    r = await fan.run(host, ["sh", "-c", script], timeout=CHECKOUT_TIMEOUT + 10, limit=ANSWER_LIMIT)
    if r.exit_status != 0:
        said = r.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [r.error
                                                                                 or "no message"]
        raise ConfirmError(visible(f"checkout {version} on {host.name}: exit status "
                                   f"{r.exit_status}: {said[0]}")[:300])
    now = await workload_version(fan, host, pb.version)
    if now["version"] != version:
        raise ConfirmError(visible(f"after checkout {version} on {host.name} the version command "
                                   f"says {now['version'] or now['version_error']}")[:300])


def _measured(m: "RunManifest", side: str) -> dict[tuple[str, str], Measured]:
    """The run's metric values, each with its device's environment."""
    environments = of_manifest(m)
    return {(r.metric, r.device): Measured(side, m.run_id, r.value,
                                           environments.get(r.device, Environment()), r.flags)
            for r in m.playbook_run.confirm_metrics}


async def _put_back(fan: "Fanout", host, pb: Playbook, done: Confirmation, version: str) -> None:
    """The workload back at the version it was at before; a failure is said, never raised over the
    confirmation's own outcome."""
    try:
        await put_at(fan, host, pb, version)
        done.left_at = version
    except ConfirmError as e:
        done.restore_error = (f"{e}: the workload was not put back at {version}; check it out "
                              "yourself")


def needs_checkout(pb: Playbook) -> None:
    """ConfirmError unless the playbook says how to put its workload at a version."""
    if not pb.checkout:
        raise ConfirmError(f"{pb.path}: the playbook has no checkout command, so fleet cannot put "
                           "the workload at a version (add e.g. checkout: [git, -C, ~/proj, "
                           "switch, --detach, --quiet])")


def _one_host(inventory: "Inventory", pb: Playbook, embedded: bool):
    """The one host the workload is checked out on, or ConfirmError: a lab playbook of several hosts
    would run versions fleet did not put there on the others."""
    needs_checkout(pb)
    if not pb.on_slurm and len(inventory.select([pb.target["hosts"]])) > 1:
        raise ConfirmError(f"{pb.path}: its target names several hosts, and the workload is "
                           "checked out on one: confirm a change with a playbook of one host")
    host = workload_host(inventory, pb, embedded=embedded)
    if host is None:
        raise ConfirmError(f"{pb.path}: its target names no host to check the workload out on")
    return host


async def confirm(fan: "Fanout", inventory: "Inventory", pb: Playbook, done: Confirmation, *,
                  embedded: bool,
                  store_root: Path, rounds: int = 1, gpus: tuple[int, ...] | None = None,
                  poll: float = 5.0,
                  on_run: Callable[[str, str, "RunManifest"], None] = lambda side, version,
                  m: None) -> Confirmation:
    """Run the playbook at ``done.target``'s A and B in the order A, B, B, A (``rounds`` times), the
    workload put back at its version afterwards, what happened kept in ``done`` (the caller's, so
    that an interrupted confirmation can still say where the workload was left). A checkout or a run
    that fails ends the runs (``done.error``); the workload is put back all the same
    (``done.restore_error`` where it could not be). ConfirmError: nothing was run or checked out (no
    checkout command, several hosts, a version no checkout command may be given, no version to come
    back to)."""
    # no scheduled run measures the version checked out
    with playbook_lock(store_root, pb.name, "a confirmation"):
        return await _confirm(fan, inventory, pb, done, embedded=embedded, store_root=store_root,
                              rounds=rounds, gpus=gpus, poll=poll, on_run=on_run)


async def _confirm(fan: "Fanout", inventory: "Inventory", pb: Playbook, done: Confirmation, *,
                   embedded: bool,
                   store_root: Path, rounds: int, gpus, poll: float, on_run) -> Confirmation:
    host = _one_host(inventory, pb, embedded)
    checked_version(done.target.before), checked_version(done.target.after)
    start = await workload_version(fan, host, pb.version)
    if start["version"] is None:
        raise ConfirmError(start["version_error"])
    checked_version(start["version"])  # where the workload goes back to: checked before it leaves
    try:
        await _runs(fan, inventory, pb, done, host, embedded=embedded, store_root=store_root,
                    rounds=rounds, gpus=gpus, poll=poll, on_run=on_run)
    # a checkout, a run, Slurm or a value refused: said, the workload put back
    except (FleetError, UnsafeValue) as e:
        done.error = str(e)
    finally:  # also on Ctrl-C: the workload is left as it was found
        await _put_back(fan, host, pb, done, start["version"])
    return done


async def _runs(fan: "Fanout", inventory: "Inventory", pb: Playbook, done: Confirmation, host, *,
                embedded: bool, store_root: Path, rounds: int, gpus, poll: float, on_run) -> None:
    target = done.target
    for n, side in enumerate(verdicts.sides(rounds=rounds)):
        version = target.before if side == "A" else target.after
        await put_at(fan, host, pb, version)
        m = await run_playbook(fan, inventory, pb, embedded=embedded, store_root=store_root,
                               poll=poll, gpus=gpus,
                               confirm={"side": side, "version": version, "order": n,
                                        "of": target.run_after})
        on_run(side, version, m)
        done.runs.append((side, version, m.run_id))
        if exitcodes.for_run(m) != exitcodes.OK:
            raise ConfirmError(f"the {side} run {m.run_id} ({version}) is {m.status}: the "
                               "confirmation stops there")
        for key, value in _measured(m, side).items():
            done.measured.setdefault(key, []).append(value)
