"""The one way a string reaches the user's terminal: :func:`visible`.

Much of what fleet prints was set by someone else: a process name another user of a lab server
chose (``prctl``), a GPU's bus id in an export the job wrote, a note in a node's answer, a
kernel's name. A control character in it would be obeyed by the terminal (an OSC sequence sets the
window's title or, OSC 52, the clipboard; a CSI moves the cursor, clears the screen, hides what
follows). So every line fleet writes for a person goes through :func:`echo` or :func:`fail`, which
show each control character as its escape (``\\x1b``), never as itself.

Kept apart from :mod:`.output` so that the one-line error path loads nothing but click.

Not filtered: ``--json`` (JSON escapes control characters itself), and the output of the
command the user ran (``fleet exec``, a profiled workload's own lines), which fleet relays as it
came, as ssh does.
"""

from __future__ import annotations

import re

import click

from .. import exitcodes

# C0 (newline and tab included), DEL, C1, and the format characters that reorder or hide text:
# bidirectional overrides and isolates, line and paragraph separators, zero-width joiners and marks.
UNSEEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
UNSEEN_BUT_LINES = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text, lines: bool = False) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``, ``\\u202e``);
    ``lines``: newlines and tabs kept (a block fleet laid out), else they are shown too (a field)."""
    return (UNSEEN_BUT_LINES if lines else UNSEEN).sub(_escape, str(text))


def echo(message="", err: bool = False, nl: bool = True) -> None:
    """``click.echo`` for what fleet writes for a person: laid-out lines, nothing obeyed."""
    click.echo(visible(message, lines=True), err=err, nl=nl)


def fail(message, code: int = exitcodes.USAGE) -> None:
    """End a command with one line on stderr, ``fleet: message``, and ``code``; the message is
    one line whatever it holds."""
    exitcodes.fail(visible(message), code)
