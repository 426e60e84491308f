"""The node's own word on what fleet may change as root: its root-owned config (as ``fleet slurm
install`` writes it). Its ``owned_sysctls`` are all the agent sets as root reached through sudo,
whatever the caller asked for (the rule: ``policy.sudo_sysctls``).

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
            return None, "the node's config %s is not a regular file of root's that only root can write" % path
        why = files.root_owned_problem(path)
        if why:
            return None, "the node's config %s" % why
        data = f.read(NODE_CONFIG_LIMIT + 1)
    try:
        doc = json.loads(data.decode("utf-8")) if len(data) <= NODE_CONFIG_LIMIT else None
    except (ValueError, RecursionError):  # not JSON, or nested past the stack (the depth json.loads bounds)
        doc = None
    sysctls = doc.get("owned_sysctls", {}) if isinstance(doc, dict) else None
    if not isinstance(sysctls, dict) or not all(isinstance(k, str) and isinstance(v, (int, str))
                                                and not isinstance(v, bool) for k, v in sysctls.items()):
        return None, "the node's config %s is not a JSON object whose owned_sysctls maps names to values" % path
    return sysctls, None
