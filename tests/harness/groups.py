"""How long each group of the suite takes (pytest-xdist's groups, given by tests/conftest.py), so
that the longest start first: a group runs on one worker, and one started last (the minute of
`fleet top` over 16 hosts, say) is the suite's tail while the other workers sit idle. pytest-xdist
otherwise hands groups out by their count of tests, whatever each takes.

The seconds are those of a whole run's JUnit report, each test's time summed by its group:

    scripts/test -q --junitxml=/tmp/suite.xml
    .venv/bin/python -m tests.harness.groups /tmp/suite.xml > tests/group-seconds.json

A group not in the file (a module added since) is weighed by its count of tests, at the seconds a
test of a group that starts servers takes on the whole (UNKNOWN_TEST_S): an estimate, till the file
is made again."""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

FILE = Path(__file__).resolve().parents[1] / "group-seconds.json"
UNKNOWN_TEST_S = 3.0  # about what a test of a module that starts servers takes (2,800 s over 990 such tests)
PURE_TEST_S = 0.05  # a test that starts nothing is a group of its own: these go last, filling the gaps


def measured() -> dict[str, float]:
    """The seconds each group took when the file was made ({} without it)."""
    try:
        return {str(k): float(v) for k, v in json.loads(FILE.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def weights(tests_of: dict[str, int], services: set[str]) -> dict[str, float]:
    """The expected seconds of each group (``tests_of``: its count of tests; ``services``: the
    groups whose tests start servers or programs): measured where the file has it."""
    known = measured()
    return {group: known.get(group, count * (UNKNOWN_TEST_S if group in services else PURE_TEST_S))
            for group, count in tests_of.items()}


def from_junit(report: Path) -> dict[str, int]:
    """Each group's seconds in a JUnit report of the suite: pytest-xdist 3.8 names a test
    ``name@group``; a group that is one test's own (it starts nothing) is left out."""
    seconds: Counter = Counter()
    for case in ET.parse(report).iter("testcase"):
        name = case.get("name") or ""
        group = name.rpartition("@")[2] if "@" in name else ""
        if group and "::" not in group:
            seconds[group] += float(case.get("time") or 0)
    return {group: round(s) for group, s in sorted(seconds.items()) if round(s) > 0}


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m tests.harness.groups JUNIT.xml > tests/group-seconds.json")
    print(json.dumps(from_junit(Path(sys.argv[1])), indent=1, sort_keys=True))
