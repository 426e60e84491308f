"""``fleet team``: the team store's own commands (the site admin's ``migrate``, and ``status``)."""

from __future__ import annotations

import click

from .output import echo_json, json_option
from .terminal import echo


def team_store_or_fail():
    """The team store the options, environment or site file name; a one-line
    failure where none is."""
    from ..store.team.config import resolve
    from .context import fail

    team = resolve()
    if team is None:
        fail("no team store is named: give --catalog and --objects, FLEET_CATALOG and "
             "FLEET_OBJECTS, or a site config file (docs/team-store.md)")
    return team


@click.group()
def team():
    """The team store: report files in S3, a shared catalog in PostgreSQL (docs/team-store.md)."""


@team.command()
@json_option
def migrate(as_json):
    """Bring the team catalog's schema to this fleet's version (the site's admin,
    as the schema's owner)."""
    from ..store.team import catalog

    before, after = catalog.migrate(team_store_or_fail())
    if as_json:
        return echo_json({"from": before, "to": after})
    echo(f"team catalog: schema version {before} -> {after}" if before != after
               else f"team catalog: schema version {after}, nothing to do")


@team.command()
@json_option
def status(as_json):
    """Which team store this command would use, whether it answers, and as whom."""
    from ..store.team import catalog

    t = team_store_or_fail()
    with catalog.connected(t) as conn:
        catalog.check_version(conn)
        me = catalog.whoami(conn)
    doc = {"objects": str(t.objects), "named_by": t.source, "role": me,
           "schema": catalog.schema.VERSION}
    if as_json:
        return echo_json(doc)
    echo(f"team store: objects {doc['objects']}, catalog as {me} (schema "
         f"{doc['schema']}; named by {t.source})")
