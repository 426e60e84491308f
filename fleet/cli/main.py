"""The command line: parse, call the library, print. No logic a test would need to reach through it.

Each group of commands has its module here; this one holds the top-level group and its options.
"""

from __future__ import annotations

import click

from .. import __version__, exitcodes
from ..inventory import InventoryError, TargetError
from .context import Context, fail
from .hosts import doctor, exec_, hosts, inventory, probe, repair
from .nightly import nightly, run_cmd, schedule
from .profile import gather, profile
from .reports import reports
from .slurm import cancel, jobs, slurm_group


class _Group(click.Group):
    """Turns inventory, target, store and unsafe-value errors into one clear line and exit status 2,
    and a store that cannot be written into one line and exit status 1."""

    def invoke(self, ctx: click.Context):
        from ..safenames import UnsafeValue
        from ..store import CatalogError, StoreWriteError

        try:
            return super().invoke(ctx)
        except (InventoryError, TargetError, CatalogError, UnsafeValue) as e:
            fail(str(e))
        except StoreWriteError as e:
            fail(str(e), exitcodes.FAILED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleet")
@click.option("-i", "--inventory", "inventories", multiple=True, envvar="FLEET_INVENTORY",
              type=click.Path(), help="Ansible-style YAML inventory file or directory (repeatable). "
              "Without one, fleet works on this machine alone.")
@click.option("--ssh-config", envvar="FLEET_SSH_CONFIG", help="ssh_config file (default ~/.ssh/config).")
@click.option("--known-hosts", envvar="FLEET_KNOWN_HOSTS", help="known_hosts file (default: as ssh_config says).")
@click.option("-f", "--fanout", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Hosts worked on at once.")
@click.pass_context
def main(ctx: click.Context, inventories, ssh_config, known_hosts, fanout):
    """Profile GPU workloads with Nsight across shared servers and Slurm clusters."""
    ctx.obj = Context(tuple(inventories), ssh_config, known_hosts, fanout)


for command in (inventory, exec_, probe, doctor, profile, gather, repair, hosts, reports, jobs, cancel, slurm_group,
                run_cmd, schedule, nightly):
    main.add_command(command)

if __name__ == "__main__":  # pragma: no cover
    main()
