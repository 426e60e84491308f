"""Small functions because each does one thing: no function of fleet is more complex than
COMPLEXITY, radon's cyclomatic complexity (what ``radon cc`` reports for it: its branches, loops,
boolean operators and comprehensions, plus one). A long chain of checks is a table or a function per
check; a function doing three things is three functions."""

from __future__ import annotations

import pytest
from radon.complexity import cc_visit
from radon.visitors import Class

from tests.conftest import REPO

FLEET = REPO / "fleet"
COMPLEXITY = 15
# Functions other work is splitting now, as (file, name): each is removed from here once it is at
# COMPLEXITY or under. The list is to end empty.
BEING_SPLIT: set = set()


def measured(source: str) -> list[tuple[str, int]]:
    """(name, complexity) of each function and method in ``source``, as ``radon cc`` lists them."""
    return [(block.fullname, block.complexity) for block in cc_visit(source) if not isinstance(block, Class)]


def too_complex() -> list[tuple[str, str, int]]:
    return [(str(path.relative_to(REPO)), name, complexity)
            for path in sorted(FLEET.rglob("*.py"))
            for name, complexity in measured(path.read_text()) if complexity > COMPLEXITY]


def test_no_function_is_more_complex_than_15():
    assert [f for f in too_complex() if f[:2] not in BEING_SPLIT] == []


def test_the_complexity_check_measures_what_radon_cc_does():
    """It would pass on nothing: a function of sixteen branches is found, a method too."""
    branches = "".join(f"    if x == {i}:\n        return {i}\n" for i in range(15))
    source = f"def chain(x):\n{branches}    return -1\n\nclass A:\n    def m(self, x):\n" + \
        branches.replace("\n    ", "\n        ").replace("    if", "        if", 1) + "        return -1\n"
    assert measured(source) == [("chain", 16), ("A.m", 16)]
    assert all(any(n == name for n, _ in measured((REPO / f).read_text())) for f, name in BEING_SPLIT)


@pytest.mark.parametrize("name", ["outcome.py", "completeness.py"])
def test_the_outcome_and_the_classes_are_read_from_fields(name):
    """The two that read a node's answer read its typed fields: nothing in them looks into its dict."""
    assert ".get(\"status\")" not in (FLEET / name).read_text() and "result.get(" not in (FLEET / name).read_text()


WIDTH = 100


def too_long(source: str) -> list[int]:
    """The numbers of ``source``'s lines longer than WIDTH characters (counted as characters, not bytes)."""
    return [n for n, line in enumerate(source.split("\n"), 1) if len(line) > WIDTH]


def test_no_line_is_longer_than_100():
    """A longer line is wrapped: a string into adjacent literals, code at its brackets, a comment onto the next."""
    assert [f"{path.relative_to(REPO)}:{n}" for path in sorted(FLEET.rglob("*.py"))
            for n in too_long(path.read_text())] == []


def test_the_width_check_sees_long_lines():
    """It would pass on nothing: a line of 101 characters is found, one of 100 is not, wherever it stands."""
    assert too_long("x" * 100 + "\n" + "y" * 101 + "\n" + "é" * 101) == [2, 3]
    assert too_long("z" * 101) == [1] and too_long("") == []
