"""What every command shares: the global options' Context, and the options many commands take."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

# fail: one line on stderr, ``fleet: ...``, escaped, and the exit status
from .terminal import fail  # noqa: F401

if TYPE_CHECKING:
    from ..inventory import Inventory
    from ..store.manifest import RunManifest

exclude_option = click.option("-x", "--exclude", multiple=True,
                              help="Hosts, groups or ranges to leave out.")
store_option = click.option("--store", "store_root", type=click.Path(), envvar="FLEET_STORE",
                            help="Report store (default ~/.local/share/fleet/store): "
                                 "SITE/DAY/RUN-ID/HOST/.")


class Context:
    """The global options (inventory, SSH settings, fan-out), read once per command."""

    def __init__(self, inventories: tuple[str, ...], ssh_config: str | None,
                 known_hosts: str | None, fanout: int, connect_timeout: float | None = None):
        self.inventories, self.fanout = inventories, fanout
        self._ssh = (ssh_config, known_hosts, connect_timeout)
        self._inventory: "Inventory | None" = None

    @property
    def inventory(self) -> "Inventory":
        if self._inventory is None:
            from ..inventory import load, local_inventory

            self._inventory = load(self.inventories) if self.inventories else local_inventory()
        return self._inventory

    def select(self, targets: str | None, exclude: tuple[str, ...]):
        return self.inventory.select([targets] if targets else [], exclude)

    def ssh_settings(self):
        from ..transport.settings import SSHSettings

        return SSHSettings.from_env(*self._ssh)

    def fanout_for_run(self):
        """A pool of this command's connections, for a look that runs its own event loop (fleet
        top)."""
        from ..transport import Fanout

        return Fanout(self.ssh_settings(), concurrency=self.fanout)

    def over_pool(self, work):
        """What ``work(fan)`` (a coroutine function) returns, over a pool of this command's
        connections opened and closed around it (fleet.transport.over_pool)."""
        from ..transport import over_pool

        return over_pool(self.ssh_settings(), self.fanout, work)




def push_when_done(store_root, manifest, as_json: bool = False) -> None:
    """A finished run pushed to the team store, when one is named (fleet/store/team/read.py); what
    happened said in one line (on stderr under --json, whose stdout is one document)."""
    from ..store.team.read import after_save, push

    if manifest.status in push.NOT_YET:
        return
    from .. import store

    root = store.root(store_root)
    try:
        path = store.manifest_of(root, manifest.run_id)
    except LookupError:
        return
    line = after_save(root, path, manifest.status)
    if line:
        from .terminal import echo

        echo(line if line.startswith("team store:") else f"fleet: {line}",
                   err=as_json or not line.startswith("team store:"))


def stored_run(store_root: str | None, run_id: str) -> "RunManifest":
    """The run RUN_ID in the store (``--store``, else the default), or a one-line failure that
    says why it is not there."""
    from .. import store

    try:
        return store.load_run(store.root(store_root), run_id)
    except LookupError as e:
        fail(str(e))
