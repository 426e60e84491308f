"""The shape of the code, held: the controller takes only the wire (and what travels) from the
agent, lab/ and slurm/ are peers that import neither each other nor the command line, and no
module imports its way back to itself."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO

FLEET = REPO / "fleet"
# The controller's own use of the agent package: the wire (framing and shapes of every answer) and
# its typed messages (an answer read into types), the bundle (what travels to the nodes, built
# here), the one rule for private folders and files, which the store keeps on this machine as the
# agent keeps it on the node, and the rules for a SQLite file fleet did not write, which the node's
# summaries and the controller's reader of exports hold it to alike. (The names of a run's files,
# shipped and pure, are fleet/rundir.py, beside the plan: no part of the agent's.)
CONTROLLER_MAY_IMPORT = {"fleet.agent.wire", "fleet.agent.messages", "fleet.agent.bundle", "fleet.agent.files",
                         "fleet.agent.sqlitefile"}
# `fleet slurm prolog|epilog|taskprolog`: slurmd runs the hooks through the installed entry point,
# on the node; that command is the agent itself, run in-process.
NODE_ENTRY_POINTS = {("fleet/cli/slurm_install.py", "fleet.agent.slurmd")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every fleet module ``path`` imports, anywhere in it (function-level imports too)."""
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("fleet")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").startswith("fleet"):
                target = node.module
            else:
                continue
            for alias in node.names:  # `from . import wire` names a module; `from .x import y` a member
                candidate = f"{target}.{alias.name}"
                found.add(candidate if (FLEET.parent / (candidate.replace(".", "/") + ".py")).exists()
                          or (FLEET.parent / candidate.replace(".", "/")).is_dir() else target)
    return found


def controller_modules() -> list[Path]:
    return [p for p in sorted(FLEET.rglob("*.py")) if "agent" not in p.relative_to(FLEET).parts]


def test_the_controller_imports_only_the_wire_the_bundle_the_private_files_rule_and_the_run_names_from_the_agent():
    wrong = []
    for path in controller_modules():
        rel = str(path.relative_to(REPO))
        for name in imports_of(path):
            if name.startswith("fleet.agent.") and name not in CONTROLLER_MAY_IMPORT \
                    and (rel, name) not in NODE_ENTRY_POINTS:
                wrong.append(f"{rel} imports {name}")
    assert wrong == []


def test_lab_and_slurm_import_neither_each_other_nor_the_command_line():
    wrong = []
    for package, others in (("lab", ("fleet.slurm", "fleet.cli")), ("slurm", ("fleet.lab", "fleet.cli"))):
        for path in sorted((FLEET / package).rglob("*.py")):
            wrong += [f"{path.relative_to(REPO)} imports {n}" for n in imports_of(path) if n.startswith(others)]
    assert wrong == []


def test_the_layering_test_sees_imports():
    """It would pass on nothing: it must at least find what lab/profile.py really imports."""
    names = imports_of(FLEET / "lab" / "profile.py")
    assert {"fleet.agent.wire", "fleet.outcome", "fleet.agentcall", "fleet.collection.bring"} <= names


# --- no import circles ---

# Circles other work is taking apart now: each entry is one whole circle (its modules, as one
# strongly connected set), so a circle that grows, or a new one, still fails. Remove an entry
# once its circle is gone; the list is to end empty.
CIRCLES_BEING_UNDONE: set = set()


def import_graph() -> dict[str, set[str]]:
    """fleet module -> the fleet modules it imports. Every import counts, those inside functions
    and under TYPE_CHECKING too: an import moved into a function to get past a circle leaves the
    two modules needing each other all the same (neither can be read, tested or shipped alone),
    which is what a circle costs. A package's ``__init__`` is the module its name imports;
    importing a submodule is not counted as importing its package (every package would be a
    circle with its own ``__init__``)."""
    modules = {module_name(p): p for p in sorted(FLEET.rglob("*.py"))}
    return {name: {n for n in imports_of(path) if n in modules and n != name} for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The strongly connected sets of more than one module (Tarjan's algorithm, without recursion)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    members = set()
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        members.add(m)
                        if m == node:
                            break
                    if len(members) > 1:
                        found.append(frozenset(members))
    return found


def test_no_module_imports_its_way_back_to_itself():
    found = circles(import_graph())
    assert sorted(sorted(c) for c in found if c not in CIRCLES_BEING_UNDONE) == []


def test_the_circle_finder_finds_circles_and_nothing_else():
    """It would pass on nothing: a circle of three, one of two beside it, and a chain."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"e"}, "e": {"d"}, "f": {"a"}, "g": set()}
    assert sorted(map(sorted, circles(graph))) == [["a", "b", "c"], ["d", "e"]]
    assert {"fleet.inventory.adhoc", "fleet.inventory.patterns"} <= import_graph()["fleet.inventory.model"]
    assert set(CIRCLES_BEING_UNDONE) <= set(circles(import_graph())), "a circle undone: remove it from the list"


# --- no function past about 60 lines, no file past about 400 ---

FUNCTION_LINES, FILE_LINES = 60, 400
# In files other work is changing now: split there, then removed from here. The list is to end empty.
LONG_FUNCTIONS_BEING_SPLIT: set = set()
# Files have no such list: every file of fleet is held to FILE_LINES, and one that grows past it is
# split by concern in the change that grows it.


def long_functions() -> list[tuple[str, str, int]]:
    """(file, function, lines) for each function of fleet over FUNCTION_LINES: from its ``def``
    to its last line (decorators, such as a command's options, are not its body); a nested
    function counts on its own as well as within the one around it."""
    out = []
    for path in sorted(FLEET.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > FUNCTION_LINES:
                    out.append((str(path.relative_to(REPO)), node.name, lines))
    return out


def test_no_function_is_longer_than_about_60_lines():
    assert [f for f in long_functions() if f[:2] not in LONG_FUNCTIONS_BEING_SPLIT] == []


def long_files(limit: int = FILE_LINES) -> list[tuple[str, int]]:
    """(file, lines) for each file of fleet over ``limit`` lines."""
    return [(str(p.relative_to(REPO)), n) for p in sorted(FLEET.rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > limit]


def test_no_file_is_longer_than_about_400_lines():
    assert long_files() == []


def test_the_length_checks_see_functions_and_files():
    """They would pass on nothing: a function found is measured, allowed ones are real, and files'
    lines are counted (many a module is past a quarter of the limit)."""
    found = {(f, name): lines for f, name, lines in long_functions()}
    assert all(key in found for key in LONG_FUNCTIONS_BEING_SPLIT), found
    assert len(long_files(FILE_LINES // 4)) > 10


def test_the_architecture_docs_package_list_names_every_package_and_module_of_fleet():
    """docs/architecture.md's map of fleet/ is the tree: a package or module added is on it, one gone is off it."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    block = doc[doc.index("## The packages"):].split("```")[1]
    named = set()
    for line in block.splitlines()[1:]:
        if line.startswith("  ") and not line.startswith("   "):  # a line of the map, not its description's next line
            lead = re.match(r"\s*((?:[a-z_]+(?:\.py|/),?\s+)+)", line + " ").group(1)
            named |= {re.sub(r"(\.py|/)$", "", n) for n in re.findall(r"[a-z_]+(?:\.py|/)", lead)}
    actual = {p.stem if p.is_file() else p.name for p in FLEET.iterdir()
              if (p.suffix == ".py" and p.stem not in ("__init__", "__main__")) or (p / "__init__.py").exists()}
    assert named == actual


# --- the layers: no import runs back up ---

def layers() -> dict[str, int]:
    """docs/architecture.md's layer table: each top-level package or module of fleet -> its layer."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    table = doc[doc.index("## The layers"):].split("\n## ")[0]
    found: dict[str, int] = {}
    for row in re.findall(r"^\| (\d) [^|]+\|[^|]+\| ([^|]+) \|$", table, re.M):
        for name in re.findall(r"`([a-z_]+)(?:\.py|/)`", row[1]):
            assert name not in found, f"{name} is on two layers"
            found[name] = int(row[0])
    return found


def unit_of(module: str) -> str:
    """The top-level package or module a module of fleet belongs to (``fleet`` itself: __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layer_of: dict[str, int]) -> list[str]:
    return sorted(f"{a} (layer {layer_of[unit_of(a)]}) imports {b} (layer {layer_of[unit_of(b)]})"
                  for a, imported in graph.items() for b in imported
                  if layer_of[unit_of(b)] > layer_of[unit_of(a)])


def test_every_package_and_module_of_fleet_is_on_one_layer():
    top = {p.stem if p.is_file() else p.name for p in FLEET.iterdir()
           if p.suffix == ".py" or (p / "__init__.py").exists()}
    assert set(layers()) == top


def test_no_import_runs_back_up_the_layers():
    """Function-level and TYPE_CHECKING imports count too: a module that needs one above it is
    above it, however the import is placed."""
    assert upward_imports(import_graph(), layers()) == []


def test_the_layer_check_finds_an_import_that_runs_back_up():
    """It would pass on nothing: the store importing the nightly report, the plan a part of the agent."""
    graph = {"fleet.store.read": {"fleet.nightly.environment"}, "fleet.plan": {"fleet.agent.rundir"},
             "fleet.lab.profile": {"fleet.store.manifest", "fleet.plan"}}
    assert upward_imports(graph, layers()) == [
        "fleet.plan (layer 1) imports fleet.agent.rundir (layer 2)",
        "fleet.store.read (layer 3) imports fleet.nightly.environment (layer 6)"]


def test_every_file_the_newcomers_tour_names_exists():
    """docs/architecture.md's tour names files to open: each one is there, and it names the doors."""
    doc = (REPO / "docs" / "architecture.md").read_text()
    tour = doc[doc.index("## A newcomer's tour"):].split("\n## ")[0]
    named = set(re.findall(r"`(fleet/[\w/]+\.py)", tour))
    assert len(named) > 30 and [n for n in sorted(named) if not (REPO / n).is_file()] == []
    doors = ["fleet/placement/__init__.py", "fleet/wrapping/__init__.py", "fleet/collection/__init__.py",
             "fleet/policy/permissions.py", "fleet/policy/neighbours.py", "fleet/run.py"]
    assert set(doors) <= named
