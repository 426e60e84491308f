"""The shape of the code, held: the controller takes only the wire (and what travels) from the
agent, lab/ and slurm/ are peers that import neither each other nor the command line, and no
module imports its way back to itself."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

FLEET = REPO / "fleet"
# The controller's own use of the agent package: the wire (framing and shapes of every answer), the
# bundle (what travels to the nodes, built here), and the one rule for private folders and files,
# which the store keeps on this machine as the agent keeps it on the node.
CONTROLLER_MAY_IMPORT = {"fleet.agent.wire", "fleet.agent.bundle", "fleet.agent.files"}
# `fleet slurm prolog|epilog|taskprolog`: slurmd runs the hooks through the installed entry point,
# on the node; that command is the agent itself, run in-process.
NODE_ENTRY_POINTS = {("fleet/cli/slurm.py", "fleet.agent.slurmd")}


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


def test_the_controller_imports_only_the_wire_the_bundle_and_the_private_files_rule_from_the_agent():
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
    assert {"fleet.agent.wire", "fleet.outcome", "fleet.agentcall", "fleet.store.bring"} <= names
