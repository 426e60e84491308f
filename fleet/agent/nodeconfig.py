"""The node's own word on what fleet may change as root: its root-owned config (as ``fleet slurm
install`` writes it). Its ``owned_sysctls`` are all the agent sets as root reached through sudo,
whatever the caller asked for (the rule: ``policy.sudo_sysctls``). Slurm's Prolog and Epilog
(``fleet/agent/slurmd.py``) read the same file whole, every value of it
checked: :func:`load_config`.

Runs ON THE NODE (standard library only, Python 3.8).
"""

from __future__ import annotations

import json
import os
import stat

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_files as files
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import files

# The node's root-owned config (as `fleet slurm install` writes it): its owned_sysctls are all the
# agent sets as root reached through sudo. FLEET_NODE_CONFIG names another for tests: sudo's
# env_reset drops it unless root's sudoers keeps it, and the file it names must pass the same
# checks (root's, writable by root alone, in folders no other account controls).
NODE_CONFIG = os.environ.get("FLEET_NODE_CONFIG", "/etc/fleet/node.json")
NODE_CONFIG_LIMIT = 1 << 20


def owned_sysctls(path=None):
    """(the owned_sysctls of the node's root-owned config, None) or (None, why it is not used): a
    regular file of root's, writable by root alone, in folders no other account controls, never
    read through a link; a JSON object whose owned_sysctls maps names to values."""
    path = path or NODE_CONFIG
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        return None, "the node's config %s cannot be read (%s)" % (path, e.strerror)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            return (None,
                    "the node's config %s is not a regular file of root's "
                    "that only root can write" % path)
        why = files.root_owned_problem(path)
        if why:
            return None, "the node's config %s" % why
        data = f.read(NODE_CONFIG_LIMIT + 1)
    try:
        doc = json.loads(data.decode("utf-8")) if len(data) <= NODE_CONFIG_LIMIT else None
    # not JSON, or nested past the stack (the depth json.loads bounds)
    except (ValueError, RecursionError):
        doc = None
    sysctls = doc.get("owned_sysctls", {}) if isinstance(doc, dict) else None
    if not isinstance(sysctls, dict) or not all(isinstance(k, str) and isinstance(v, (int, str))
                                                and not isinstance(v, bool)
                                                for k, v in sysctls.items()):
        return (None,
                "the node's config %s is not a JSON object whose "
                "owned_sysctls maps names to values" % path)
    return sysctls, None


# --- the config as slurmd's Prolog and Epilog read it (fleet/agent/slurmd.py):
# trusted once checked ---

DEFAULTS = {"owned_sysctls": {}, "baseline_sysctls": {}, "jobs_dir": "/run/fleet/jobs",
            "state_dir": "/var/lib/fleet",
            "log_file": "/var/log/fleet/slurm.log", "fail_closed": False, "pause_dcgm": False,
            "qdstrm_importer": None, "finish_timeout": 120}


class ConfigError(Exception):
    """The node's fleet config is missing, unsafe or malformed: fleet does nothing."""


def load_config(path):
    """The admin's config at ``path``: a regular file of root's that root alone may write, a JSON
    object, each value of its kind (DEFAULTS for the keys it leaves out).
    ConfigError says why not."""
    config = dict(DEFAULTS, **_read_root_json(path))
    for key, right, said in CONFIG_VALUES:
        if not right(config[key]):
            raise ConfigError("%s: %s %s" % (path, key, said))
    return config


def _read_root_json(path):
    """The JSON object in ``path``, a regular file owned by root and writable by root alone."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as e:
        raise ConfigError("cannot open %s: %s" % (path, e))
    with os.fdopen(fd) as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
            raise ConfigError("%s must be a regular file owned by root and "
                              "writable by root alone" % path)
        try:
            doc = json.load(f)
        # nested past the stack: the depth json.load bounds
        except (ValueError, RecursionError) as e:
            raise ConfigError("%s is not JSON: %s" % (path, e))
    if not isinstance(doc, dict):
        raise ConfigError("%s must hold a JSON object" % path)
    return doc


def _sysctl_map(value):
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, (int, str))
                                           for k, v in value.items())


def _absolute(value):
    return isinstance(value, str) and value.startswith("/")


def _seconds(value):
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= 3600


# Each value of the config, in the order checked: its key, its test, and what it must be.
CONFIG_VALUES = (
    ("owned_sysctls", _sysctl_map, "must map sysctl names to values"),
    ("baseline_sysctls", _sysctl_map, "must map sysctl names to the node's own values"),
    ("jobs_dir", _absolute, "must be an absolute path"),
    ("state_dir", _absolute, "must be an absolute path"),
    ("log_file", _absolute, "must be an absolute path"),
    ("qdstrm_importer", lambda v: v is None or _absolute(v),
     "must be an absolute path, or null to use the "
                                                              "installed one"),
    ("finish_timeout", _seconds, "must be a number of seconds from 1 to 3600"),
)
