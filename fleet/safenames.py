"""The one home of the rules for untrusted strings (from users, inventories, playbooks and jobs)
that fleet turns into paths, job names, crontab words and words of a batch script.

- a *name* (playbooks, schedules): 1 to 64 letters, digits, '.', '_' or '-', not starting with
  '.' or '-'. It also becomes a job name and a crontab word, so it is kept short and plain.
- a *path component* (hosts, sites, run ids, cluster names, report file names): the same
  characters plus ':' (IPv6 addresses and Ansible's ``host:port`` names), up to 253 (the
  longest DNS name), so every real inventory's host names pass. No '/', no leading '.' (so
  never '.' or '..'), no leading '-' (never read as an option), no control characters, never
  empty: joined under a directory, such a name stays one entry inside it.
- a *count* (the ranks a launcher's command line says it starts): a whole number from 1 to a
  bound, as an int or a word of decimal digits (:func:`count_problem`); the node checks its plan's
  count by the same rule.
- every other value that reaches a batch script or a crontab line (a Slurm option, a path
  from the inventory): no control characters, and written through :func:`quote`, the one
  quoting function. Its words read the same to bash and to sbatch's ``#SBATCH`` parser, which
  also takes '' and "" quotes but reads a backslash as an escape even inside them
  (``sbatch_word``).

Shipped to nodes with the agent (standard library, Python 3.8), where the agent checks the
names in its plan again before it writes anything.
"""


from __future__ import annotations

import os
import re
import shlex

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
RULE = "1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 (newline, tab, CR, NUL...), DEL and C1


class UnsafeValue(ValueError):
    """A value that cannot go where it was meant to; the message names it and why."""


PATH_COMPONENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:-]{0,252}")
COMPONENT_RULE = "1 to 253 letters, digits, '.', '_', '-' or ':', not starting with '.' or '-'"


class UnsafeName(UnsafeValue):
    """A name that cannot become one entry of a directory; ``str()`` is the one line to show."""


def is_safe(name: object) -> bool:
    return isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None


def is_component(name: object) -> bool:
    return isinstance(name, str) and PATH_COMPONENT.fullmatch(name) is not None


def component_problem(name: object, what: str) -> str | None:
    """Why ``name`` cannot name an entry of a directory (``what`` says what it is), or None."""
    if is_component(name):
        return None
    return "%s %s cannot name a folder or file: it must be %s" % (what, _shown(name),
                                                                  COMPONENT_RULE)


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


def count_problem(value: object, what: str, most: int) -> str | None:
    """Why ``value`` is not a count from 1 to ``most`` (an int, or a word of ASCII decimal digits as
    a user types one: no sign, no space), or None."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        return "%s %s: it must be a whole number from 1 to %d" % (what, _shown(value), most)
    return None


def check_text(value: object, what: str) -> str:
    """``value`` as one line of text, or UnsafeValue: a newline would start a new #SBATCH line,
    shell command or crontab entry."""
    text = str(value)
    if m := CONTROL.search(text):
        kind = "a newline" if m.group() in "\r\n" else f"control character {m.group()!r}"
        raise UnsafeValue(f"{what}: {kind} in {text!r} (a value is one line of printable text)")
    return text


def quote(value: object, what: str = "a value", *, lines: bool = False) -> str:
    """The one way a value reaches a batch script or a crontab line: one shell word. Control
    characters are refused, except newlines and tabs where ``lines`` (the words of the user's
    command, kept byte for byte inside single quotes, where bash takes them as they are)."""
    text = str(value)
    if lines:
        if "\0" in text:
            raise UnsafeValue(f"{what}: a NUL byte cannot be passed in {text!r}")
    else:
        check_text(text, what)
    return shlex.quote(text)


def sbatch_word(value: object, what: str) -> str:
    """``quote`` for an ``#SBATCH`` line: sbatch reads a backslash as an escape even inside quotes,
    and takes ' and " as quotes, so a value holding either is refused rather than read two ways."""
    text = check_text(value, what)
    if m := re.search(r"[\\'\"]", text):
        raise UnsafeValue(f"{what}: {m.group()!r} in {text!r} would be read differently by "
                          f"sbatch's #SBATCH parser and by bash")
    return quote(text, what)
