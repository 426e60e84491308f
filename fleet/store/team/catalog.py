"""The team catalog: PostgreSQL through psycopg 3, as the person's own role.

Every statement runs under the schema's row-level security (:mod:`.schema`): what a query here
returns is what that person may see, and fleet adds no rule of its own on top. Every wait is
bounded:
the connection (``connect_timeout``), each statement (``statement_timeout``) and each lock
(``lock_timeout``). Every failure is one :class:`TeamError` line.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from typing import Iterator

from ... import exitcodes
from ...errors import FleetError
from . import schema
from .config import TeamStore

CONNECT_TIMEOUT_S = 10
STATEMENT_TIMEOUT_MS = 60_000
LOCK_TIMEOUT_MS = 20_000


class TeamError(FleetError):
    """The team store refused or failed; the message says what and what to do."""
    exit_status = exitcodes.FAILED


class TeamUnavailable(TeamError):
    """The catalog or the object store did not answer (down, unreachable, a cut connection)."""


def _psycopg():
    try:
        import psycopg
    except ImportError:
        raise TeamError("the team store needs psycopg: pip install 'fleet[team]'") from None
    return psycopg


@contextmanager
def connected(team: TeamStore) -> Iterator:
    """A connection as the person's own role (libpq reads the password from ~/.pgpass,
    PGSERVICE...); a failure to connect or a cut mid-way is TeamUnavailable, a refusal
    TeamError, each one line."""
    psycopg = _psycopg()
    try:
        conn = psycopg.connect(team.catalog, connect_timeout=CONNECT_TIMEOUT_S,
                               application_name="fleet",
                               # jit off: compiling took 0.2 s of a 0.9 s listing of 100,000 runs,
                               # and the catalog's queries are all short
                               options=f"-c statement_timeout={STATEMENT_TIMEOUT_MS} "
                                       f"-c lock_timeout={LOCK_TIMEOUT_MS} -c jit=off")
    except psycopg.OperationalError as e:
        raise TeamUnavailable(f"the team catalog cannot be reached: {_first_line(e)}") from None
    try:
        with unit(conn):  # committed at the end, or rolled back and said in one line
            yield conn
    finally:
        conn.close()


@contextmanager
def unit(conn) -> Iterator:
    """One run's work on a connection kept for several (a push of many runs): committed at its end;
    a refusal rolled back and said as TeamError, the connection left for the next run; a connection
    lost, TeamUnavailable."""
    psycopg = _psycopg()
    try:
        yield conn
        conn.commit()
    except psycopg.OperationalError as e:
        raise TeamUnavailable(f"the team catalog went away: {_first_line(e)}") from None
    except psycopg.Error as e:
        _roll_back(conn)
        raise TeamError(f"the team catalog refused: {_first_line(e)}") from None
    except BaseException:
        _roll_back(conn)
        raise


def _roll_back(conn) -> None:
    psycopg = _psycopg()
    try:
        conn.rollback()
    except psycopg.Error as e:
        raise TeamUnavailable(f"the team catalog went away: {_first_line(e)}") from None


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def version(conn) -> int | None:
    """The catalog's schema version, or None where fleet's schema is not there yet."""
    row = conn.execute("SELECT to_regclass('fleet.schema_version') IS NOT NULL").fetchone()
    if not row[0]:
        return None
    return conn.execute("SELECT version FROM fleet.schema_version").fetchone()[0]


def check_version(conn) -> None:
    found = version(conn)
    if found is None or found < schema.VERSION:
        raise TeamError(f"the team catalog is at schema version {found or 0}, this fleet needs "
                        f"{schema.VERSION}: the site's admin runs `fleet team migrate`")
    if found > schema.VERSION:
        raise TeamError(f"the team catalog is at schema version {found}, newer than this fleet's "
                        f"({schema.VERSION}): upgrade fleet")


def migrate(team: TeamStore) -> tuple[int, int]:
    """Apply the migrations this catalog lacks, in one transaction each (the admin's command):
    (version before, version after). A catalog newer than this fleet is refused."""
    with connected(team) as conn:
        before = version(conn)
        current = 0 if before is None else before
        if current > schema.VERSION:
            check_version(conn)
        for number in range(current + 1, schema.VERSION + 1):
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('fleet.migrate'))")
                if (version(conn) or 0) >= number:  # another admin's fleet did it meanwhile
                    continue
                conn.execute(schema.MIGRATIONS[number - 1])
                conn.execute("UPDATE fleet.schema_version SET version = %s", (number,))
        return current, schema.VERSION


def whoami(conn) -> str:
    return conn.execute("SELECT current_user").fetchone()[0]


def pushed_digest(conn, run_id: str) -> tuple[str, str] | None:
    """(owner, manifest digest) of a run already in the catalog and visible to this person."""
    row = conn.execute("SELECT owner, manifest_sha256 FROM fleet.runs WHERE run_id = %s",
                       (run_id,)).fetchone()
    return None if row is None else (row[0], row[1])


def publish(conn, run: dict, reports: list[tuple], kernels: list[tuple],
            metrics: list[tuple]) -> None:
    """One run and all its rows, in one transaction: either every row of it is there, or none is.
    A run id that another person's run holds is refused by the policies (one line)."""
    with conn.transaction():
        conn.execute(
            "INSERT INTO fleet.runs "
            "(run_id, site, day, started, tool, command, status, manifest, manifest_sha256, "
            "pushed_from) VALUES (%(run_id)s, %(site)s, %(day)s, %(started)s, %(tool)s, "
            "%(command)s, %(status)s, %(manifest)s, %(manifest_sha256)s, %(pushed_from)s) "
            "ON CONFLICT (run_id) DO UPDATE SET site = EXCLUDED.site, day = EXCLUDED.day, started "
            "= EXCLUDED.started, tool = EXCLUDED.tool, command = EXCLUDED.command, status = "
            "EXCLUDED.status, manifest = EXCLUDED.manifest, manifest_sha256 = "
            "EXCLUDED.manifest_sha256, pushed_from = EXCLUDED.pushed_from, pushed_at = now()", run)
        for table in ("reports", "kernels", "metrics"):
            conn.execute(f"DELETE FROM fleet.{table} WHERE run_id = %s", (run["run_id"],))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO fleet.reports (run_id, host, name, tool, status, sha256, "
                            "size, gpu, driver, tool_version, started, object_key) VALUES "
                            "(%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s)", reports)
            cur.executemany("INSERT INTO fleet.kernels (run_id, host, name, total_ns, instances) "
                            "VALUES (%s,%s,%s,%s,%s)", kernels)
            cur.executemany("INSERT INTO fleet.metrics (run_id, playbook, metric, device, value, "
                            "flags, started) VALUES (%s,%s,%s,%s,%s,%s,%s)", metrics)


LIST_COLUMNS = ("run_id", "owner", "host", "name", "tool", "status", "sha256", "size", "gpu",
                "driver", "tool_version", "started", "object_key")


# The columns of ``fleet reports ls``'s table, made text in PostgreSQL: 100,000 rows reach the
# terminal without a timestamp parsed or a dict built for each (the listing's whole cost otherwise).
TABLE_COLUMNS = ("p.run_id", "r.owner", "p.host", "coalesce(p.tool, '')", "p.status",
                 "left(coalesce(p.sha256, ''), 12)", "p.name")


def _filtered(columns, host, since, tool, status, user, shared) -> tuple[str, list]:
    """The listing's query over ``columns`` and its arguments: each filter a bound parameter."""
    where, args = [], []
    for column, value in (("p.host", host), ("p.tool", tool), ("p.status", status),
                          ("r.owner", user)):
        if value:
            where.append(f"{column} = %s")
            args.append(value)
    if since:
        where.append("p.started >= %s")
        args.append(since)
    if shared:
        where.append("EXISTS (SELECT 1 FROM fleet.run_shares s WHERE s.run_id = r.run_id)")
    sql = (f"SELECT {', '.join(columns)} FROM fleet.reports p JOIN fleet.runs r ON r.run_id = "
           "p.run_id"
           + (" WHERE " + " AND ".join(where) if where else "")
           + " ORDER BY p.started, p.host, p.name")
    return sql, args


def reports(conn, *, host=None, since=None, tool=None, status=None, user=None,
            shared=False) -> list[dict]:
    """The reports this person may see, oldest first; ``shared``: only runs shared with a group."""
    sql, args = _filtered([f"p.{c}" if c != "owner" else "r.owner" for c in LIST_COLUMNS],
                          host, since, tool, status, user, shared)
    return [dict(zip(LIST_COLUMNS, row)) for row in conn.execute(sql, args)]


def report_table(conn, *, host=None, since=None, tool=None, status=None, user=None,
                 shared=False) -> list[tuple]:
    """The same reports as :func:`reports`, as rows of text: TABLE_COLUMNS."""
    sql, args = _filtered(TABLE_COLUMNS, host, since, tool, status, user, shared)
    return conn.execute(sql, args).fetchall()


def manifest(conn, run_id: str) -> tuple[str, dict]:
    """(owner, manifest document) of a run this person may see; LookupError else."""
    row = conn.execute("SELECT owner, manifest FROM fleet.runs WHERE run_id = %s",
                       (run_id,)).fetchone()
    if row is None:
        raise LookupError(f"no run {run_id!r} in the team store that you may see")
    return row[0], row[1]


def shares(conn, run_id: str) -> list[str]:
    return [r[0]
            for r in conn.execute("SELECT grp FROM fleet.run_shares WHERE run_id = %s ORDER BY grp",
                                  (run_id,))]


def share(conn, run_id: str, group: str) -> None:
    owner, _ = manifest(conn, run_id)
    if owner != whoami(conn):
        raise TeamError(f"run {run_id} is {owner}'s: only its owner shares it")
    if not conn.execute("SELECT pg_has_role(current_user, %s, 'MEMBER')", (group,)).fetchone()[0]:
        raise TeamError(f"you are not a member of the group {group!r}: a run is "
                        "shared only with your own groups")
    with conn.transaction():
        conn.execute("INSERT INTO fleet.run_shares (run_id, grp) VALUES "
                     "(%s, %s) ON CONFLICT DO NOTHING",
                     (run_id, group))


def group_exists(conn, group: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                        (group,)).fetchone() is not None


def remove(conn, run_id: str) -> list[str]:
    """Delete a run this person owns (or may delete, as fleet_admin): its object keys back."""
    keys = [r[0] for r in conn.execute("SELECT object_key FROM fleet.reports WHERE run_id = %s AND "
                                       "object_key IS NOT NULL", (run_id,))]
    with conn.transaction():
        gone = conn.execute("DELETE FROM fleet.runs WHERE run_id = %s", (run_id,)).rowcount
    if not gone:
        owner, _ = manifest(conn, run_id)
        raise TeamError(f"run {run_id} is {owner}'s: only its owner (or an admin) removes it")
    return keys


def metric_history(conn, playbook: str, since: str | None = None) -> list[dict]:
    rows = conn.execute("SELECT run_id, playbook, metric, device, value, flags, started FROM "
                        "fleet.metrics WHERE playbook = %s AND started >= %s ORDER BY started, "
                        "run_id", (playbook, since or ""))
    names = ("run_id", "playbook", "metric", "device", "value", "flags", "started")
    return [dict(zip(names, r)) for r in rows]


def object_url(conn, run_id: str, key: str) -> str:
    """A short-lived address of one catalogued object, signed by the catalog for this person
    (``fleet.object_url`` checks that they may read the run)."""
    return conn.execute("SELECT fleet.object_url(%s, %s)", (run_id, key)).fetchone()[0]


def as_json(value) -> str:
    return json.dumps(value, default=str)
