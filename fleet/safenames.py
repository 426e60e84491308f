"""The one home for untrusted strings that become names, paths or words of a script.

- Names fleet makes paths, job names and crontab words of (playbooks, schedules):
  1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'.
- Every other value that reaches a batch script or a crontab line (a Slurm
  option, a path from the inventory): no control characters, and written
  through :func:`quote`, the one quoting function. Its words read the same to
  bash and to sbatch's ``#SBATCH`` parser, which also takes '' and "" quotes
  but reads a backslash as an escape even inside them (``sbatch_word``).
"""

from __future__ import annotations

import re
import shlex

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
RULE = "1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")  # C0 (newline, tab, CR, NUL...), DEL and C1


class UnsafeValue(ValueError):
    """A value that cannot go where it was meant to; the message names it and why."""


def is_safe(name: object) -> bool:
    return isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None


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
        raise UnsafeValue(f"{what}: {m.group()!r} in {text!r} would be read differently by sbatch's "
                          f"#SBATCH parser and by bash")
    return quote(text, what)
