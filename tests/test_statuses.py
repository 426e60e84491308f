"""One vocabulary of status: the user guide's tables of a host's and a run's statuses are the enums
of fleet/statuses.py, and a host's exit status there is the one exitcodes gives it; the agent's
words are the wire's; every run status the code sets is a RunStatus."""

from __future__ import annotations

import ast
import re

from fleet import exitcodes, outcome
from fleet.agent import wire
from fleet.statuses import HostStatus, RunStatus
from tests.conftest import REPO

GUIDE = (REPO / "docs" / "user-guide.md").read_text()


def table_after(heading: str) -> list[list[str]]:
    """The rows of the first table after ``heading``, each its cells."""
    rest = GUIDE[GUIDE.index(heading):]
    lines = rest[rest.index("\n|"):].lstrip("\n").split("\n\n")[0].splitlines()
    return [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]


def test_the_guides_host_status_table_is_host_status_and_its_exit_statuses_are_exitcodes():
    rows = table_after("`fleet profile` reports a status per node")
    words = [re.fullmatch(r"`([a-z-]+)`", r[0]).group(1) for r in rows]
    assert sorted(words) == sorted(s.value for s in HostStatus)
    assert {w: int(r[-1]) for w, r in zip(words, rows)} == {s.value: exitcodes.FOR_HOST.get(s, exitcodes.FAILED)
                                                            for s in HostStatus}


def test_the_guides_run_status_table_is_run_status():
    rows = table_after("The run itself has one status")
    assert sorted(re.fullmatch(r"`([a-z-]+)`", r[0]).group(1) for r in rows) == sorted(s.value for s in RunStatus)


def test_the_agents_words_read_by_the_outcome_are_the_wires():
    words = {getattr(outcome, n) for n in dir(outcome) if n.startswith("AGENT_")}
    assert words and words <= set(wire.RESULT_STATUSES)


def test_every_run_status_the_controller_sets_is_a_run_status():
    """No bare word assigned to a manifest's status: each is a RunStatus member or a computed one."""
    bare = []
    for path in sorted((REPO / "fleet").rglob("*.py")):
        if "agent" in path.relative_to(REPO / "fleet").parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign):
                continue
            targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for target, value in zip(targets, values):
                if isinstance(target, ast.Attribute) and target.attr == "status" and \
                        getattr(target.value, "id", "") in ("manifest", "m") and isinstance(value, ast.Constant):
                    bare.append(f"{path.relative_to(REPO)}:{node.lineno} {value.value!r}")
    assert bare == []


def test_the_statuses_are_the_words_the_manifests_spell():
    assert outcome.run_status([HostStatus.OK, HostStatus.REFUSED]) == "partial"
    assert outcome.run_status([HostStatus.YIELDED]) is RunStatus.YIELDED
    assert exitcodes.FOR_HOST["workload-failed"] == exitcodes.WORKLOAD_FAILED  # read back from JSON as a word
