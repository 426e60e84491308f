"""Which team store, if any: a PostgreSQL catalog and an S3 prefix, named once per site.

Where each is read, the first found winning:
1. ``--catalog`` / ``--objects`` on the command line (global options);
2. ``FLEET_CATALOG`` / ``FLEET_OBJECTS`` in the environment;
3. the site config file: ``FLEET_SITE_CONFIG``, else ``~/.config/fleet/site.toml``, else
   ``/etc/fleet/site.toml``: TOML with the keys ``catalog`` and ``objects``.

Neither names a secret. PostgreSQL's password comes from where libpq reads it (``~/.pgpass``,
``PGSERVICE``'s service file, ``PGPASSFILE``); S3's keys and endpoint from where boto3 reads them
(``AWS_PROFILE``, ``~/.aws/credentials``, ``AWS_ENDPOINT_URL``). A catalog or objects setting
that carries one is refused, so that none is ever written into a manifest, a log or ``--json``.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import FleetError

SITE_FILES = (Path("~/.config/fleet/site.toml"), Path("/etc/fleet/site.toml"))
BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")          # S3's rule for a bucket's name
# one safe word of the key prefix
PREFIX_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")

# Where libpq and boto3 find the servers and each person's credentials: names of files, profiles
# and endpoints, never a secret. A schedule carries these into cron or a batch job, which start
# without the person's shell; PGPASSWORD, AWS_SECRET_ACCESS_KEY and their kin are never among them.
# Those that name a file or a folder: made absolute where the schedule is made, since cron starts
# in another folder.
CREDENTIAL_FILES = ("PGSERVICEFILE", "PGPASSFILE", "PGSYSCONFDIR", "PGSSLROOTCERT", "PGSSLCERT",
                    "PGSSLKEY", "AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CA_BUNDLE")
CREDENTIAL_LOCATIONS = (*CREDENTIAL_FILES, "PGSERVICE", "PGHOST", "PGPORT", "PGUSER", "PGDATABASE",
                        "PGSSLMODE",
                        "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL",
                        "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION")


class TeamConfigError(FleetError):
    """A team store setting fleet cannot use; the message names where it came from."""


@dataclass(frozen=True)
class ObjectsLocation:
    """``s3://BUCKET/PREFIX``: the bucket, and the words of the prefix every key starts with."""
    bucket: str
    prefix: tuple[str, ...]

    def __str__(self) -> str:
        return "s3://" + "/".join((self.bucket, *self.prefix))


@dataclass(frozen=True)
class TeamStore:
    catalog: str               # a libpq connection string or URL, without a password
    objects: ObjectsLocation
    source: str                # where it was read: "--catalog", "FLEET_CATALOG", a file's path


def parse_objects(text: str, source: str) -> ObjectsLocation:
    parts = urlsplit(text)
    if parts.scheme != "s3" or not parts.netloc:
        raise TeamConfigError(f"{source}: objects {text!r} is not s3://BUCKET/PREFIX")
    if "@" in parts.netloc or parts.query or parts.fragment:
        raise TeamConfigError(f"{source}: objects {text!r} carries more than s3://BUCKET/PREFIX "
                              "(credentials come from AWS_PROFILE or "
                              "~/.aws/credentials, never from the setting)")
    if not BUCKET.fullmatch(parts.netloc):
        raise TeamConfigError(f"{source}: {parts.netloc!r} is not an S3 bucket name (3 to 63 "
                              f"lower-case letters, digits, '.' or '-')")
    words = tuple(w for w in parts.path.split("/") if w)
    for word in words:
        if not PREFIX_PART.fullmatch(word):
            raise TeamConfigError(f"{source}: the prefix word {word!r} of {text!r} must be 1 to 64 "
                                  f"letters, digits, '.', '_' or '-', not starting with '.' or '-'")
    return ObjectsLocation(parts.netloc, words)


def check_catalog(text: str, source: str) -> str:
    """A libpq URL (``postgresql://…``) or key=value string, refused when it holds a password."""
    if text.startswith(("postgresql://", "postgres://")):
        parts = urlsplit(text)
        if parts.password is not None or re.search(r"(^|&)password=", parts.query):
            raise TeamConfigError(f"{source}: the catalog URL holds a password; put it in "
                                  "~/.pgpass (or a PGSERVICE service file) "
                                  "instead, where only you can read it")
        return text
    if "=" in text:
        if re.search(r"(^|\s)password\s*=", text):
            raise TeamConfigError(f"{source}: the catalog setting holds a "
                                  "password; put it in ~/.pgpass instead")
        return text
    raise TeamConfigError(f"{source}: catalog {text!r} is neither a postgresql:// URL nor a libpq "
                          f"'key=value' string (e.g. service=fleet)")


def _site_file(environ) -> Path | None:
    named = environ.get("FLEET_SITE_CONFIG")
    if named:
        return Path(named)
    for candidate in SITE_FILES:
        path = candidate.expanduser()
        if path.is_file():
            return path
    return None


def _read_site_file(path: Path) -> dict:
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except FileNotFoundError:
        raise TeamConfigError(f"the site config {path} does not exist "
                              "(FLEET_SITE_CONFIG)") from None
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise TeamConfigError(f"the site config {path} cannot be read: {e}") from None
    unknown = sorted(set(doc) - {"catalog", "objects"})
    if unknown:
        raise TeamConfigError(f"the site config {path}: unknown key(s) {', '.join(unknown)} "
                              f"(it takes catalog and objects)")
    for key in ("catalog", "objects"):
        if key in doc and not isinstance(doc[key], str):
            raise TeamConfigError(f"the site config {path}: {key} must be a string")
    return doc


def _named(catalog: str | None, objects: str | None, environ) -> dict[str, tuple[str | None, str]]:
    """Each setting with where it was found: options, then the environment, then the site file."""
    found = {"catalog": (catalog, "--catalog"), "objects": (objects, "--objects")}
    for key, var in (("catalog", "FLEET_CATALOG"), ("objects", "FLEET_OBJECTS")):
        if found[key][0] is None and environ.get(var):
            found[key] = (environ[var], var)
    if found["catalog"][0] is None or found["objects"][0] is None:
        path = _site_file(environ)
        doc = _read_site_file(path) if path is not None else {}
        for key in ("catalog", "objects"):
            if found[key][0] is None and doc.get(key):
                found[key] = (doc[key], str(path))
    return found


def resolve(catalog: str | None = None, objects: str | None = None,
            environ=None) -> TeamStore | None:
    """The team store these settings name, or None for the embedded store alone. Both are needed:
    one without the other is refused, naming where the one given came from."""
    found = _named(catalog, objects, os.environ if environ is None else environ)
    (cat, cat_source), (obj, obj_source) = found["catalog"], found["objects"]
    if cat is None and obj is None:
        return None
    if cat is None or obj is None:
        have, lack = ("catalog", "objects") if obj is None else ("objects", "catalog")
        where = cat_source if obj is None else obj_source
        raise TeamConfigError(f"a team store needs both a catalog and objects: {have} is set "
                              f"({where}) but {lack} is not (--{lack}, "
                              f"FLEET_{lack.upper()} or the site config file)")
    return TeamStore(check_catalog(cat, cat_source), parse_objects(obj, obj_source), cat_source)
