"""The command line: parse, call the library, print. No logic a test would need to reach through it.

Each group of commands has its module here; this one holds the top-level group and its options.
"""

from __future__ import annotations

import os
import sys

import click

from .. import __version__, exitcodes
from .context import Context, fail

# Command name -> (module under fleet.cli, attribute). A command's module, and what it imports
# (asyncio, the inventory readers, asyncssh), loads only when that command runs or --help lists it.
COMMANDS = {
    "inventory": ("hosts", "inventory"),
    "exec": ("hosts", "exec_"),
    "probe": ("hosts", "probe"),
    "doctor": ("hosts", "doctor"),
    "profile": ("profile", "profile"),
    "gather": ("profile", "gather"),
    "repair": ("hosts", "repair"),
    "hosts": ("hosts", "hosts"),
    "reports": ("reports", "reports"),
    "jobs": ("slurm", "jobs"),
    "cancel": ("slurm", "cancel"),
    "slurm": ("slurm_install", "slurm_group"),
    "ray": ("ray_jobs", "ray_group"),
    "run": ("nightly", "run_cmd"),
    "schedule": ("schedule", "schedule"),
    "nightly": ("nightly", "nightly"),
    "team": ("team", "team"),
    "top": ("top", "top"),
}


class _Group(click.Group):
    """The one place an error a user can act on becomes its line, ``fleet: ...``, and exit status:
    a ``FleetError`` (fleet/errors.py) with its own status; the store's errors and an unsafe value
    (which the agent's safenames raises, without fleet's base) with 2, a store that cannot be
    written with 1."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        import importlib

        module, attribute = COMMANDS[name]
        return getattr(importlib.import_module(f"{__package__}.{module}"), attribute)

    def main(self, args=None, prog_name=None, **extra):
        extra.pop("standalone_mode", None)
        try:
            returned = super().main(args, prog_name, standalone_mode=False, **extra)
        except click.UsageError as e:
            fail(usage_line(self, e))
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.Abort:  # Ctrl-C outside a run (a prompt, a probe)
            fail("interrupted", exitcodes.INTERRUPTED)
        if isinstance(returned, int):  # a command that returned its status
            sys.exit(returned)
        sys.exit(exitcodes.OK)  # --help, --version: click's Exit(0)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except Exception as e:
            # Imported only when something failed: the store's module is a cost every command would
            # pay.
            from ..errors import FleetError
            from ..safenames import UnsafeValue

            if isinstance(e, FleetError):
                fail(str(e), e.exit_status)
            if isinstance(e, UnsafeValue):  # safenames travels to the nodes: it keeps its own base
                fail(str(e))
            raise


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="fleet")
@click.option("-i", "--inventory", "inventories", multiple=True, envvar="FLEET_INVENTORY",
              type=click.Path(),
              help="Ansible-style YAML inventory file or directory (repeatable). "
              "Without one, targets are this machine (localhost) or hosts "
              "named [user@]host[:port], reached by SSH.")
@click.option("--ssh-config", envvar="FLEET_SSH_CONFIG",
              help="ssh_config file (default ~/.ssh/config).")
@click.option("--known-hosts", envvar="FLEET_KNOWN_HOSTS",
              help="known_hosts file (default: as ssh_config says).")
@click.option("-f", "--fanout", default=64, show_default=True, type=click.IntRange(1, 4096),
              help="Hosts worked on at once.")
@click.option("--connect-timeout", default=15.0, show_default=True,
              type=click.FloatRange(0, min_open=True),
              envvar="FLEET_CONNECT_TIMEOUT",
              help="Seconds for a host's SSH connection, handshake included.")
@click.option("--catalog", envvar="FLEET_CATALOG", metavar="URL",
              help="The team catalog: postgresql://HOST/DB (no password: libpq reads ~/.pgpass). "
                   "See docs/team-store.md.")
@click.option("--objects", envvar="FLEET_OBJECTS", metavar="s3://BUCKET/PREFIX",
              help="The team store's object storage (credentials and endpoint as boto3 reads "
                   "them).")
@click.option("-v", "--debug", "verbose", count=True,
              help="Show asyncssh's log on stderr (authentication, "
              "key exchange); -vv, -vvv: more of it.")
@click.pass_context
def main(ctx: click.Context, inventories, ssh_config, known_hosts, fanout, connect_timeout, catalog,
         objects, verbose):
    """Profile GPU workloads with Nsight across shared servers and Slurm clusters."""
    for variable, value in (("FLEET_CATALOG", catalog), ("FLEET_OBJECTS", objects)):
        if value:  # the team store's one source for every layer below: fleet/store/team/config.py
            os.environ[variable] = value
    if verbose:
        show_ssh_log(verbose)
    ctx.obj = Context(tuple(inventories), ssh_config, known_hosts, fanout, connect_timeout)


def show_ssh_log(verbose: int) -> None:
    """asyncssh's log on stderr: what was tried to authenticate and why it failed, as ``ssh -v``."""
    import logging

    import asyncssh

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("fleet debug: %(message)s"))
    logging.getLogger("asyncssh").addHandler(handler)
    asyncssh.set_log_level(logging.DEBUG)
    asyncssh.set_debug_level(min(verbose, 3))  # 1: auth and key exchange; 2, 3: packets



def usage_line(group: click.Group, e: click.UsageError) -> str:
    """click's message on one line, with what to do: where a global option goes, where help is."""
    if isinstance(e, click.NoSuchOption) and e.ctx is not None and e.ctx.command is not group:
        spellings = {name for p in group.params for name in (*p.opts, *p.secondary_opts)}
        if e.option_name in spellings:
            where = " ".join(c.info_name for c in _chain(e.ctx)[1:])
            return (f"{e.option_name} is a global option: put it before the command, "
                    f"fleet {e.option_name} ... {where} ...")
    command = " ".join(["fleet", *(c.info_name for c in _chain(e.ctx)[1:])]) if e.ctx else "fleet"
    return f"{e.format_message()} (see {command} --help)"


def _chain(ctx: click.Context) -> list[click.Context]:
    chain = []
    while ctx is not None:
        chain.insert(0, ctx)
        ctx = ctx.parent
    return chain


if __name__ == "__main__":  # pragma: no cover
    main()
