"""What fleet/store and fleet/transport may write with: only the checked helpers (O_NOFOLLOW, a new
name renamed into place, folders checked), never a bare open/mkdir/replace."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

UNCHECKED = [(re.compile(r"""\bopen\([^)]*,\s*["'](w|wb|ab|w\+|r\+)["']"""), 'open(..., "w")'),
             (re.compile(r"exist_ok\s*=\s*True|\.mkdir\(|\bos\.makedirs\("), "mkdir(exist_ok=True)"),
             (re.compile(r"\bos\.(replace|rename)\(|\bshutil\.copy"), "a bare os.replace or copy"),
             (re.compile(r"\.write_(text|bytes)\("), "Path.write_text")]


# The checked helpers themselves (with fleet/agent/files.py, outside these folders).
NOT_THE_STORES = {"fleet/store/private.py"}


def unchecked_writes() -> list[str]:
    """Every line of fleet/store and fleet/transport that writes other than through the checked helpers."""
    found = []
    for path in sorted((REPO / "fleet" / "store").glob("*.py")) + sorted((REPO / "fleet" / "transport").glob("*.py")):
        if str(path.relative_to(REPO)) in NOT_THE_STORES:
            continue
        for n, line in enumerate(path.read_text().splitlines(), 1):
            found += [f"{path.relative_to(REPO)}:{n}: {what}: {line.strip()}"
                      for pattern, what in UNCHECKED if pattern.search(line)]
    return found
