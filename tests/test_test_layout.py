"""How the tests are laid out: no test module imports another. Importing a test module runs its
module-level setup and registers its fixtures in the importer, so files that borrow each other's
helpers start each other's labs and break when one is edited. What several modules share lives in
tests/harness/ (helpers; fixtures registered by tests/conftest.py)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def is_test_module(module: str) -> bool:
    """Whether a dotted module name is a test module of this folder (tests.test_x, test_x)."""
    parts = module.split(".")
    return parts[-1].startswith("test_") and (parts[:-1] in ([], ["tests"]))


def imported_test_modules(source: str) -> list[str]:
    """The test modules a source imports, however spelled: `import tests.test_x`, `from tests
    import test_x`, `from tests.test_x import y`, `from . import test_x`, `from .test_x import y`,
    at the top or inside a function."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if is_test_module(a.name)]
        elif isinstance(node, ast.ImportFrom):
            base = ("tests" if node.level else "") if node.module is None else \
                (f"tests.{node.module}" if node.level else node.module)
            if is_test_module(base):
                found.append(base)
            elif base in ("tests", ""):
                found += [f"tests.{a.name}" for a in node.names if a.name.startswith("test_")]
    return found


def test_the_finder_sees_every_spelling_of_a_test_module_import():
    source = ("import tests.test_a\nfrom tests import test_b, harness\nfrom tests.test_c import x\n"
              "from . import test_d\nfrom .test_e import y\ndef f():\n    from tests.test_f import z\n"
              "import tests.harness.lab\nfrom tests.harness.lab import fleet\nfrom tests.conftest import REPO\n"
              "from fleet.agent import test_like\n")
    assert sorted(imported_test_modules(source)) == [f"tests.test_{c}" for c in "abcdef"]


def test_no_test_module_or_harness_module_imports_a_test_module():
    found = [f"{path.relative_to(TESTS.parent)}: {name}"
             for path in sorted(TESTS.glob("test_*.py")) + sorted((TESTS / "harness").glob("*.py"))
             + [TESTS / "conftest.py"]
             for name in imported_test_modules(path.read_text())]
    assert found == [], "shared helpers belong in tests/harness/, shared fixtures in tests/conftest.py"


def test_each_test_has_one_worker_group_and_every_user_of_the_machine_s_sysctl_shares_one(request):
    """The suite runs on several workers, a group to each (scripts/test: pytest-xdist, --dist
    loadgroup). Every test collected in this run has exactly one group: its module's for a test that
    starts servers (its module's fixtures started once, on one worker), its own for a test that
    starts nothing, or, for every test that sets or reads kernel.perf_event_paranoid (through the
    kernel_lab, the prolog's paranoid_3, the docs' reader, or in its own code), the one they share:
    were it another, two workers would set the machine's sysctl under each other."""
    from tests.conftest import SYSCTL_GROUP

    users = {"kernel_lab", "paranoid_3", "reader"}  # a `lab` has a value of its own (tests/harness/sysctl.py)
    for item in request.session.items:
        groups = [m.args[0] for m in item.iter_markers("xdist_group")]
        assert len(groups) == 1, (item.nodeid, groups)
        own = inspect.getsource(item.function) if getattr(item, "function", None) else ""
        if users & set(item.fixturenames) or "PARANOID." in own or "perf_event_paranoid(" in own:
            assert groups == [SYSCTL_GROUP], item.nodeid
        elif groups == [SYSCTL_GROUP]:  # found touching it another way (tests/conftest.py): the group is right
            continue
        elif item.get_closest_marker("services") is not None:
            assert groups == [item.path.relative_to(TESTS).as_posix()], item.nodeid
        else:  # under loadgroup, xdist has added "@GROUP" to the id the group was made from
            assert item.nodeid in (groups[0], f"{groups[0]}@{groups[0]}"), (item.nodeid, groups)
    assert request.node in request.session.items  # this test saw itself: the session's items are this run's
    if getattr(request.config.option, "loadgroup", False):  # a worker of scripts/test's run: xdist reads the id
        assert all(item.nodeid.endswith("@" + next(item.iter_markers("xdist_group")).args[0])
                   for item in request.session.items), [i.nodeid for i in request.session.items[:3]]


def test_the_groups_are_handed_out_longest_first_and_a_group_keeps_its_own_order(request):
    """A group runs on one worker; one started last is the suite's tail. The session's items are in
    the order pytest-xdist hands their groups out (its own reordering by count of tests turned off):
    by the seconds each group took in a whole run (tests/group-seconds.json), longest first, a
    group's tests together and in their module's order."""
    from tests.harness import groups

    order = [next(item.iter_markers("xdist_group")).args[0] for item in request.session.items]
    firsts = list(dict.fromkeys(order))
    assert len(firsts) == len(set(order)) and order == sorted(order, key=firsts.index), "a group's tests apart"
    tests_of = {g: order.count(g) for g in firsts}
    services = {g for g in firsts if "::" not in g}
    seconds = groups.weights(tests_of, services)
    assert [seconds[g] for g in firsts] == sorted((seconds[g] for g in firsts), reverse=True)
    if getattr(request.config.option, "loadgroup", False):
        assert request.config.option.loadscopereorder is False  # else xdist would sort by count of tests
    for group in firsts:  # a module's tests in a group run in the order they are written
        lines = [(i.path, i.function.__code__.co_firstlineno) for i in request.session.items
                 if next(i.iter_markers("xdist_group")).args[0] == group and getattr(i, "function", None)]
        assert all(a <= b for a, b in zip(lines, lines[1:]) if a[0] == b[0]), group


def test_a_junit_report_gives_each_shared_group_its_seconds_and_leaves_a_test_s_own_out(tmp_path):
    from tests.harness import groups

    report = tmp_path / "suite.xml"
    report.write_text('<testsuites><testsuite>'
                      '<testcase classname="tests.test_a" name="test_x@test_a.py" time="10.4"/>'
                      '<testcase classname="tests.test_a" name="test_y@test_a.py" time="2.2"/>'
                      '<testcase classname="tests.test_b" name="test_z@perf_event_paranoid" time="7"/>'
                      '<testcase classname="tests.test_c" name="test_p@tests/test_c.py::test_p" time="0.1"/>'
                      '</testsuite></testsuites>')
    assert groups.from_junit(report) == {"perf_event_paranoid": 7, "test_a.py": 13}
    weights = groups.weights({"test_a.py": 2, "test_new.py": 4, "tests/test_c.py::test_p": 1}, {"test_a.py", "test_new.py"})
    assert weights["test_new.py"] == 4 * groups.UNKNOWN_TEST_S and weights["tests/test_c.py::test_p"] == groups.PURE_TEST_S
