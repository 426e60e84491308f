"""The commands of docs/inventory.md, run as a reader would run them (tests/harness/docs.py): the
host patterns it shows select what it says, and its refusals read as it shows them."""

from __future__ import annotations

import pytest

import os
import sys
from pathlib import Path

from tests.conftest import REPO
from tests.harness import docs

DOC = REPO / "docs" / "inventory.md"


@pytest.mark.services  # runs the doc's fleet commands
def test_every_command_of_the_inventory_doc_runs(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    env = {"HOME": str(home), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "NO_COLOR": "1",
           "COLUMNS": "100", "TERM": "dumb", "LC_ALL": "C.UTF-8", "FLEET_SSH_CONFIG": os.devnull}
    shell = docs.Shell(work, env, home)
    blocks = [b for b in docs.read_blocks(DOC) if b.runs]
    problems = []
    for b in blocks:
        for r in shell.run(b):
            if why := r.problem():
                problems.append(f"{DOC.name}:{r.command.line}: $ {r.command.text}\n  {why}:\n" + "\n".join(r.output))
    assert not problems, "\n\n".join(problems)
    commands = [c for b in blocks if b.tag == "console" for c in b.commands]
    assert len(commands) >= 5 and any(c.status == 2 for c in commands)
