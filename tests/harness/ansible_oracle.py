"""The Ansible oracle's answers, asked once per test session.

The inventory tests compare fleet with the real ``ansible-inventory`` and ``ansible`` (ansible-core,
a test dependency). The same question (the same tool and arguments, on a source with the same
contents, of the same ansible-core) has the same answer, so it is asked once a session and kept in
memory: never stored between sessions, so every answer a test compares with came from the real
tool in this session.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from importlib.metadata import version
from pathlib import Path
from typing import Callable

_ANSWERS: dict[tuple, str] = {}


@lru_cache(maxsize=1)
def ansible_version() -> str:
    return version("ansible-core")


def contents(source: Path) -> str:
    """sha256 of all Ansible reads for ``source``: a directory's every file (name and bytes), or a
    file and those of the directory it is in (the group_vars and host_vars beside it)."""
    root = source if source.is_dir() else source.parent
    digest = hashlib.sha256(str(source.relative_to(root)).encode() + b"\0")
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def asked_once(tool: Path, source: Path, args: tuple[str, ...], ask: Callable[[], str]) -> str:
    """What ``ask()`` (which runs ``tool`` on ``source`` with ``args`` and returns its output) said,
    asked the first time this session the question comes."""
    key = (str(tool), ansible_version(), contents(source), args)
    if key not in _ANSWERS:
        _ANSWERS[key] = ask()
    return _ANSWERS[key]
