"""The one home of the rules for names that come from users, inventories, playbooks and jobs
and that fleet turns into paths, job names and crontab words.

Two rules, one the other's subset:

- a *name* (playbooks, schedules): 1 to 64 letters, digits, '.', '_' or '-', not starting with
  '.' or '-'. It also becomes a job name and a crontab word, so it is kept short and plain.
- a *path component* (hosts, sites, run ids, cluster names, report file names): the same
  characters plus ':' (IPv6 addresses and Ansible's ``host:port`` names), up to 253 (the
  longest DNS name), so every real inventory's host names pass. No '/', no leading '.' (so
  never '.' or '..'), no leading '-' (never read as an option), no control characters, never
  empty: joined under a directory, such a name stays one entry inside it.

Shipped to nodes with the agent (standard library, Python 3.8), where the agent checks the
names in its plan again before it writes anything.
"""

from __future__ import annotations

import os
import re

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
RULE = "1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"

PATH_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,252}")
COMPONENT_RULE = "1 to 253 letters, digits, '.', '_', '-' or ':', not starting with '.' or '-'"


class UnsafeName(ValueError):
    """A name that cannot become one entry of a directory; ``str()`` is the one line to show."""


def is_safe(name: object) -> bool:
    return isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None


def is_component(name: object) -> bool:
    return isinstance(name, str) and PATH_COMPONENT.fullmatch(name) is not None


def component_problem(name: object, what: str) -> str | None:
    """Why ``name`` cannot name an entry of a directory (``what`` says what it is), or None."""
    if is_component(name):
        return None
    return "%s %s cannot name a folder or file: it must be %s" % (what, _shown(name), COMPONENT_RULE)


def check_component(name: object, what: str) -> str:
    """``name`` when it is one safe path component, else :class:`UnsafeName`."""
    problem = component_problem(name, what)
    if problem:
        raise UnsafeName(problem)
    return name  # type: ignore[return-value]


def join(directory, *names: object, what: str = "name"):
    """``directory / name / ...`` for names that each must be one safe component: every join of
    an untrusted name goes through here (or checks with :func:`check_component` first)."""
    for name in names:
        check_component(name, what)
    if isinstance(directory, str):
        return os.path.join(directory, *names)  # type: ignore[arg-type]
    return directory.joinpath(*names)


def _shown(name: object) -> str:
    """The name quoted, control characters escaped, cut to a length a one-line error can carry."""
    text = repr(name)
    return text if len(text) <= 80 else text[:77] + "..."
