"""The one rule for names fleet makes paths, job names and crontab words of (playbooks,
schedules): 1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'."""

from __future__ import annotations

import re

SAFE_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
RULE = "1 to 64 letters, digits, '.', '_' or '-', not starting with '.' or '-'"


def is_safe(name: object) -> bool:
    return isinstance(name, str) and SAFE_NAME.fullmatch(name) is not None
