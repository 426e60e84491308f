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

import click

from .. import exitcodes
from ..visible import visible


def echo(message="", err: bool = False, nl: bool = True) -> None:
    """``click.echo`` for what fleet writes for a person: laid-out lines, nothing obeyed."""
    click.echo(visible(message, lines=True), err=err, nl=nl)


def say(line="", err: bool = False) -> None:
    """One line for a person, whatever its fields hold: a newline another party put in a host's
    name or a node's reason is shown (``\\x0a``), never a line of fleet's own."""
    click.echo(visible(line), err=err)


def fail(message, code: int = exitcodes.USAGE) -> None:
    """End a command with one line on stderr, ``fleet: message``, and ``code``; the message is
    one line whatever it holds."""
    exitcodes.fail(visible(message), code)
