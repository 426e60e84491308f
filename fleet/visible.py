"""What another party set, made safe to show: :func:`visible`.

Kept out of the command line so that the modules that lay out a run's lines (:mod:`fleet.outcome`,
the probe's and doctor's renderings) make each field one line of plain text before the CLI prints
it: a newline in a node's note or in a process's name would otherwise forge a line of fleet's own
(``h02  ok``), and an escape sequence would be obeyed. The CLI's :func:`fleet.cli.terminal.echo`
shows the control characters of everything it prints through the same function.
"""

from __future__ import annotations

import html
import re
from urllib.parse import quote

# C0 (newline and tab included), DEL, C1, and the format characters that reorder or hide text:
# bidirectional overrides and isolates, line and paragraph separators, zero-width joiners and marks.
UNSEEN = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
UNSEEN_BUT_LINES = (
    re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]"))


def _escape(m: re.Match) -> str:
    c = ord(m.group())
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def visible(text, lines: bool = False) -> str:
    """``text`` with every control character shown as its escape (``\\x1b``, ``\\u202e``);
    ``lines``: newlines and tabs kept (a block fleet laid out), else they
    are shown too (a field)."""
    return (UNSEEN_BUT_LINES if lines else UNSEEN).sub(_escape, str(text))


def html_text(text) -> str:
    """``text`` for an HTML page (a cell, an attribute, an SVG label): its control and format
    characters shown as escapes, as on a terminal (a right-to-left override in a kernel's name would
    otherwise reverse what follows it on the page), then HTML-escaped, quotes too."""
    return html.escape(visible(text), quote=True)


def html_href(path: str) -> str:
    """A relative link to ``path`` for an HTML page: every character a URL does not take as it is
    percent-encoded (so the link still leads to that file), then HTML-escaped."""
    return html.escape(quote(str(path), safe="/"), quote=True)
