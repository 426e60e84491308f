"""One vocabulary of status: the user guide's tables of a host's and a run's statuses are the enums
of fleet/statuses.py, and a host's exit status there is the one exitcodes gives it; the agent's
words are the wire's; every run status the code sets is a RunStatus."""

from __future__ import annotations

import ast
import json
import re

from fleet import exitcodes, outcome
from fleet.agent import wire
from fleet.agent.messages import AgentStatus, ProfileResult
from fleet.statuses import HostStatus, RunStatus
from tests.conftest import REPO

GUIDE = (REPO / "docs" / "user-guide.md").read_text()
# A report's own status (complete, missing, summary...) is another vocabulary: only these are a host's or a run's.
STATUS_WORDS = {s.value for s in HostStatus} | {s.value for s in RunStatus}


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


def test_the_agents_words_read_into_types_are_the_wires():
    assert [s.value for s in AgentStatus] == list(wire.RESULT_STATUSES)
    assert ProfileResult.read({"status": "ok"}).status is AgentStatus.OK
    assert ProfileResult.read({"status": "done"}).status is None  # a word this fleet does not know: read as none


def _bare_statuses(tree) -> list[tuple[int, str]]:
    """Where a status is set as a bare word: assigned to ``X.status``, given as ``status=``, or as a
    HostEntry's second argument. (Comparisons are left out: a plan's and a report's own statuses,
    other vocabularies, share words with a host's.)"""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            found += [(node.lineno, v.value) for t, v in zip(targets, values)
                      if isinstance(t, ast.Attribute) and t.attr == "status" and isinstance(v, ast.Constant)]
        elif isinstance(node, ast.Call):
            found += [(node.lineno, k.value.value) for k in node.keywords
                      if k.arg == "status" and isinstance(k.value, ast.Constant) and isinstance(k.value.value, str)]
            if getattr(node.func, "id", "") == "HostEntry" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                found.append((node.lineno, node.args[1].value))
    return found


def test_every_status_the_controller_sets_is_spelled_by_the_enums():
    """No bare word for a host's or a run's status outside fleet/statuses.py (the agent, which speaks
    the wire's words, and a report's own status aside)."""
    bare = []
    for path in sorted((REPO / "fleet").rglob("*.py")):
        if "agent" in path.relative_to(REPO / "fleet").parts or path.name == "statuses.py":
            continue
        words = [(line, w) for line, w in _bare_statuses(ast.parse(path.read_text())) if w in STATUS_WORDS]
        bare += [f"{path.relative_to(REPO)}:{line} {w!r}" for line, w in words]
    assert bare == []


def test_the_bare_status_finder_finds_each_way_of_spelling_one():
    tree = ast.parse('m.status, m.error = "complete", None\nHostEntry("h", "ok")\nRunManifest(status="failed")\n'
                     'replace(entry, status="missing")\nm.status = RunStatus.FAILED\n')
    assert [w for _, w in _bare_statuses(tree)] == ["complete", "ok", "failed", "missing"]


def test_the_statuses_are_the_words_the_manifests_spell():
    assert outcome.run_status([HostStatus.OK, HostStatus.REFUSED]) == "partial"
    assert outcome.run_status([HostStatus.YIELDED]) is RunStatus.YIELDED
    assert exitcodes.FOR_HOST["workload-failed"] == exitcodes.WORKLOAD_FAILED  # read back from JSON as a word


# A run of each status as fleet ends one, the hosts' statuses it ends with, and whether the command
# waited for it (--no-wait did not): what exitcodes.for_run is asked for each row of the guide.
RUNS_OF_EACH_STATUS = {
    RunStatus.RUNNING: ((HostStatus.OK, HostStatus.PENDING), True),
    RunStatus.SUBMITTED: ((), False),
    RunStatus.COMPLETE: ((HostStatus.OK, HostStatus.OK), True),
    RunStatus.PARTIAL: ((HostStatus.OK, HostStatus.FAILED), True),
    RunStatus.YIELDED: ((HostStatus.YIELDED, HostStatus.YIELDED), True),
    RunStatus.WORKLOAD_FAILED: ((HostStatus.WORKLOAD_FAILED,), True),
    RunStatus.CANCELLED: ((HostStatus.OK,), True),
    RunStatus.DRY_RUN: ((HostStatus.PLANNED,), True),
}


def test_the_exit_status_the_guides_run_table_gives_each_run_status_is_exitcodes():
    """Each row that names one exit status ("exit N") is what exitcodes.for_run gives a run of that
    status; the one row that gives none (failed: the highest of its hosts') names none."""
    from fleet.store.manifest import HostEntry, RunManifest

    said = {re.fullmatch(r"`([a-z-]+)`", r[0]).group(1): re.findall(r"exit (\d+)", r[1])
            for r in table_after("The run itself has one status")}
    assert said.pop(RunStatus.FAILED.value) == []
    given = {}
    for status, (hosts, waited) in RUNS_OF_EACH_STATUS.items():
        manifest = RunManifest(run_id="r", status=status,
                               hosts=[HostEntry(host=f"h{i}", status=s) for i, s in enumerate(hosts)])
        given[status.value] = [str(exitcodes.for_run(manifest, waited=waited))]
    assert said == given


def test_the_guides_exit_status_table_is_exitcodes():
    """Every number of the table is one of exitcodes' statuses, and every status is in the table."""
    rows = table_after("## Exit statuses")
    said = {int(r[0]) for r in rows}
    constants = {v for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    assert said == constants


CHOOSING = (ast.If, ast.IfExp, ast.Compare, ast.Dict, ast.Assign, ast.AugAssign, ast.BoolOp, ast.Match)


def _status_choices(tree) -> list[tuple[int, str]]:
    """Where an exit status is chosen rather than given: an exitcodes status inside a condition (an
    ``if``, ``X if ... else``, a comparison), a mapping or an assignment, and any number given to
    ``sys.exit`` as it is. ``fail(why, exitcodes.FAILED)`` gives one; so does a command that ends
    with ``sys.exit(exitcodes.OK)`` whatever happened."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}

    def chosen(node) -> bool:
        parent = parents.get(node)
        if isinstance(parent, ast.Call) and getattr(parent.func, "id", None) == "fail":
            return False
        while parent is not None and not isinstance(parent, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(parent, CHOOSING):
                return True
            parent = parents.get(parent)
        return False

    found = []
    for node in ast.walk(tree):
        status = (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                  and node.value.id == "exitcodes" and node.attr.isupper())
        number = (isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.exit" and node.args
                  and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, int))
        if status and chosen(node) or number:
            found.append((node.lineno, ast.unparse(parents.get(node, node))[:80]))
    return found


def test_the_command_line_chooses_no_exit_status():
    """The CLI parses and prints: which status a command ends with is exitcodes' rule (for_run,
    for_doctor, for_parts...), never a choice made in fleet/cli."""
    found = {str(p.relative_to(REPO)): _status_choices(ast.parse(p.read_text()))
             for p in (REPO / "fleet" / "cli").glob("*.py")}
    assert {p: f for p, f in found.items() if f} == {}
    planted = ("code = exitcodes.OK\nsys.exit(exitcodes.FAILED if bad else exitcodes.OK)\n"
               "if bad:\n    fail('x', exitcodes.USAGE)\n    sys.exit(exitcodes.FAILED)\n"
               "sys.exit(3)\nsys.exit(exitcodes.OK)\n")
    assert sorted(line for line, _ in _status_choices(ast.parse(planted))) == [1, 2, 2, 5, 6]


def test_the_exit_status_of_each_command_that_is_not_a_run():
    class R:
        def __init__(self, reached=True, ok=True):
            self.reached, self.ok = reached, ok
    assert exitcodes.for_doctor([R()], "refused", strict=False) == exitcodes.OK
    assert exitcodes.for_doctor([R()], "refused", strict=True) == exitcodes.REFUSED
    assert exitcodes.for_doctor([R()], "degraded", strict=True) == exitcodes.DEGRADED
    assert exitcodes.for_doctor([R(), R(reached=False)], "refused", strict=True) == exitcodes.UNREACHABLE
    # when several apply, the highest wins, whatever order the hosts came in
    assert exitcodes.for_host_keys(["error", "changed"]) == exitcodes.for_host_keys(["changed", "error"]) == 3
    assert exitcodes.for_host_keys(["known", "new"]) == exitcodes.OK
    assert exitcodes.for_parts([False, True]) == exitcodes.FAILED and exitcodes.for_parts([]) == exitcodes.OK
    assert exitcodes.for_nightly_report(unexplained=True, regressions=True) == exitcodes.UNEXPLAINED
    assert exitcodes.for_nightly_report(unexplained=False, regressions=True) == exitcodes.REGRESSION
    assert exitcodes.for_confirm(failed=True, held=True) == exitcodes.FAILED
    assert exitcodes.for_confirm(failed=False, held=False) == exitcodes.NOT_CONFIRMED


def _said_as_words(tree) -> list[tuple[int, str]]:
    """Where the agent sets a result's status as a bare word: ``X["status"] = "..."``, a dict's
    ``"status": "..."`` or ``dict(..., status="...")``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            found += [(node.lineno, node.value.value) for t in node.targets
                      if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                      and t.slice.value == "status" and isinstance(node.value, ast.Constant)]
        elif isinstance(node, ast.Dict):
            found += [(node.lineno, v.value) for k, v in zip(node.keys, node.values)
                      if isinstance(k, ast.Constant) and k.value == "status" and isinstance(v, ast.Constant)]
        elif isinstance(node, ast.Call):
            found += [(node.lineno, k.value.value) for k in node.keywords
                      if k.arg == "status" and isinstance(k.value, ast.Constant)]
    return found


def test_the_agent_sets_its_results_status_by_the_wires_enum():
    """The node's words for its run are wire.AgentStatus's, set by name: a word misspelt on the node
    would fail the controller's check of the answer's shape, after the run."""
    bare = [f"{path.relative_to(REPO)}:{line} {w!r}"
            for path in sorted((REPO / "fleet" / "agent").glob("*.py"))
            for line, w in _said_as_words(ast.parse(path.read_text())) if w in wire.RESULT_STATUSES]
    assert bare == []
    planted = 'r["status"] = "ok"\nr = {"status": "refused"}\nd = dict(c, status="error")\nr["status"] = S.OK\n'
    assert [w for _, w in _said_as_words(ast.parse(planted))] == ["ok", "refused", "error"]
    assert str(wire.AgentStatus.NO_REPORT) == f"{wire.AgentStatus.NO_REPORT}" == "no-report"
    assert json.dumps({"status": wire.AgentStatus.OK}) == '{"status": "ok"}'
