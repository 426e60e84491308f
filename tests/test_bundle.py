"""The shipping boundary (fleet/agent/bundle.py): what travels to the nodes runs there.

A node has a ``python3`` of 3.8 or newer and nothing else: every shipped
module may import only the standard library, ``pynvml`` and other shipped
modules (the standard library as this Python names it: one added after 3.8,
like ``tomllib``, is vermin's to catch), and fleet's own must not use anything
newer than Python 3.8. The lists come from ``bundle.shipped()``, what the agent's
modes import, so a module that starts to travel is held to both; every other module of
the agent's package but the bundle itself is held to Python 3.8 too (it is written to
the node's rules, as the wire's typed messages are before the node builds them). pynvml is third-party: only its imports are ours
to check.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
import importlib.util
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from fleet.agent import asroot, bundle, owned, wire

SOURCES = {name: bundle.source_path(name) for name in bundle.shipped()}
AGENT_PACKAGE = {"fleet_agent_" + p.stem: p for p in sorted((Path(bundle.__file__).parent).glob("*.py"))
                 if p.stem not in ("__init__", "bundle")}
FLEETS_OWN = {**{name: path for name, path in SOURCES.items() if name.startswith("fleet_")}, **AGENT_PACKAGE}
ALLOWED = set(sys.stdlib_module_names) | set(bundle.shipped())
NODE_PYTHON = "/usr/bin/python3"


def is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def imports(tree: ast.Module, module: str):
    """(line, what) for every import anywhere in the module, relative ones made absolute
    (``from . import node`` in fleet.agent.run is fleet.agent.node)."""
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            yield from ((n.lineno, a.name) for a in n.names)
        elif isinstance(n, ast.ImportFrom) and n.level == 0:
            yield n.lineno, n.module
        elif isinstance(n, ast.ImportFrom):
            package = module.rsplit(".", n.level)[0]
            if n.module:  # `from ..wrapping import windows` imports the module fleet.wrapping.windows
                base = f"{package}.{n.module}"
                yield from ((n.lineno, f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base) for a in n.names)
            else:
                yield from ((n.lineno, f"{package}.{a.name}") for a in n.names)
        elif (isinstance(n, ast.Call) and n.args and isinstance(n.args[0], ast.Constant)
              and ast.unparse(n.func) in ("__import__", "importlib.import_module")):
            yield n.lineno, n.args[0].value


def foreign_imports(name: str) -> list[str]:
    module = bundle.shipped()[name]
    tree = ast.parse(SOURCES[name].read_text(encoding="utf-8"))
    wrong = []
    for line, imported in imports(tree, module):
        if imported.startswith("fleet."):  # the installed package's fallback: only to what is shipped too
            ok = imported in bundle.shipped().values()
        else:
            ok = imported.split(".")[0] in ALLOWED
        if not ok:
            wrong.append(f"{SOURCES[name]}:{line}: imports {imported}")
    return wrong


@pytest.mark.parametrize("name", sorted(bundle.shipped()))
def test_a_shipped_module_imports_only_the_standard_library_and_what_is_shipped(name):
    assert foreign_imports(name) == []


def test_what_travels_is_what_the_modes_import_by_flat_name():
    """Found in the sources, never listed: each mode's module and what it imports, transitively."""
    shipped = bundle.shipped()
    assert set(bundle.MODES.values()) <= set(shipped) and shipped["fleet_agent_run"] == "fleet.agent.run"
    assert {"fleet_agent_profiler", "fleet_agent_wire", "fleet_rundir", "fleet_plan", "pynvml"} <= set(shipped)
    assert all("_" not in module for module in shipped.values())  # a flat name reads back as one module
    assert bundle._flat_imports("try:\n    import fleet_agent_x as x\nexcept ImportError:\n    from . import x\n"
                                "from fleet_policy_y import *\nimport os\n") == {"fleet_agent_x", "fleet_policy_y"}
    assert "fleet_agent_bundle" not in shipped  # the controller's: it builds what travels


def test_every_mode_is_served_by_a_shipped_module_with_a_main():
    for mode, name in bundle.MODES.items():
        tree = ast.parse(SOURCES[name].read_text(encoding="utf-8"))
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), (mode, name)
    module, attribute = bundle.HAND_OVER
    assert module in bundle.shipped() and getattr(asroot, attribute, "missing") is None


def vermin() -> str:
    beside = Path(sys.executable).with_name("vermin")  # the test extra installs it into fleet's environment
    found = str(beside) if beside.exists() else shutil.which("vermin")
    assert found, "vermin is missing: pip install -e '.[test]'"
    return found


def test_fleets_shipped_modules_need_no_python_newer_than_3_8():
    """vermin knows the version each library module, function, method and syntax needs, which
    ``ast.parse(feature_version=(3, 8))`` does not (it accepts ``"x".removeprefix("a")``). Annotations are
    not evaluated (every shipped module has ``from __future__ import annotations``, checked below). Its
    union-types feature stays off: its guesses flag ``os.O_RDONLY | os.O_NOFOLLOW`` and class-level
    annotations, so the next test looks for evaluated type unions itself."""
    out = subprocess.run([vermin(), "--no-config-file", "--target=3.8-", "--violations", "--no-tips",
                          "--no-eval-annotations", "-vv", *map(str, FLEETS_OWN.values())],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def postpones_annotations(tree: ast.Module) -> bool:
    return any(isinstance(n, ast.ImportFrom) and n.module == "__future__"
               and any(a.name == "annotations" for a in n.names) for n in tree.body)


def evaluated_type_expressions(tree: ast.Module):
    """``X | Y`` and ``list[int]`` on types, evaluated at run time (3.10 and 3.9): annotations are
    left out when the module postpones them, so they are never evaluated on the node."""
    classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}
    builtin_types = {name for name, value in vars(builtins).items() if isinstance(value, type)}

    def a_type(n):
        return ((isinstance(n, ast.Constant) and n.value is None)
                or (isinstance(n, ast.Name) and n.id in builtin_types | classes)
                or (isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr) and (a_type(n.left) or a_type(n.right))))

    skipped = set()  # ids of annotations never evaluated, and of what is inside an expression already named
    if postpones_annotations(tree):
        for n in ast.walk(tree):
            for a in (getattr(n, "annotation", None), getattr(n, "returns", None)):
                if a is not None:
                    skipped.update(map(id, ast.walk(a)))
    for n in ast.walk(tree):  # breadth first: an expression comes before its parts
        if id(n) in skipped:
            continue
        if ((isinstance(n, ast.BinOp) and isinstance(n.op, ast.BitOr) and a_type(n.left) and a_type(n.right))
                or (isinstance(n, ast.Subscript) and isinstance(n.value, ast.Name) and n.value.id in builtin_types)):
            skipped.update(map(id, ast.walk(n)))
            yield n.lineno, ast.unparse(n)


@pytest.mark.parametrize("name", sorted(FLEETS_OWN))
def test_fleets_shipped_modules_evaluate_no_type_unions_or_builtin_generics(name):
    tree = ast.parse(FLEETS_OWN[name].read_text(encoding="utf-8"))
    assert postpones_annotations(tree), f"{FLEETS_OWN[name]} must have `from __future__ import annotations`: its annotations run on Python 3.8"
    assert [f"{FLEETS_OWN[name]}:{line}: {text}" for line, text in evaluated_type_expressions(tree)] == []


# --- the agent's own bytes, handed to the sudo re-run by the loader (asroot.SHIPPED_AS) ---

# It answers as the agent it was asked to run would: one "repair" answer of the wire.
SUDO_STAND_IN = """#!/usr/bin/python3
import hashlib, json, sys
body = {"value": {"argv": sys.argv[1:], "stdin_sha256": hashlib.sha256(sys.stdin.buffer.read()).hexdigest()}}
print(MARK + json.dumps({"wire": 1, "kind": "repair", "body": body}))
""".replace("MARK", repr(wire.MARK))


@pytest.fixture
def as_nobody():
    """Run a command as an account that is not root, with a stand-in ``sudo`` first on its PATH that
    reports what it was given instead of running it."""
    directory = Path(tempfile.mkdtemp(prefix="fleet-bundle-"))
    try:
        directory.chmod(0o755)
        (directory / "sudo").write_text(SUDO_STAND_IN)
        (directory / "sudo").chmod(0o755)
        nobody = pwd.getpwnam("nobody")
        env = {"PATH": f"{directory}:/usr/bin:/bin"}

        def run(argv, **kw):
            out = subprocess.run(argv, env=env, cwd="/", capture_output=True, timeout=60, user=nobody.pw_uid,
                                 group=nobody.pw_gid, extra_groups=[], **kw)
            return wire.read(out.stdout.decode(), "repair"), out

        yield directory, run
    finally:
        shutil.rmtree(directory)


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the agent as another account")
def test_the_agent_from_stdin_re_runs_itself_under_sudo_with_its_own_bytes(as_nobody):
    _, run = as_nobody
    args = {"mode": "owned", "op": "repair"}
    doc, out = run([NODE_PYTHON, "-c", bundle.BOOTSTRAP, json.dumps(args)], input=bundle.bundle())
    assert doc.get("value") == {"argv": ["-n", NODE_PYTHON, "-c", bundle.BOOTSTRAP, json.dumps(args)],
                                "stdin_sha256": hashlib.sha256(bundle.bundle()).hexdigest()}, out


@pytest.mark.skipif(os.geteuid() != 0, reason="runs the agent as another account")
def test_the_agent_from_a_file_says_it_cannot_re_run_itself_under_sudo(as_nobody):
    directory, run = as_nobody
    (directory / "fleet-agent.py").write_text(bundle.script())
    doc, out = run([NODE_PYTHON, str(directory / "fleet-agent.py"), json.dumps({"mode": "owned", "op": "repair"})])
    assert doc.get("error") == "changing node state needs root, and this agent cannot re-run itself under sudo", out


def test_the_installed_package_does_the_step_itself_as_root(tmp_path):
    """Imported from the package (not shipped) nothing is handed over; as root nothing is needed."""
    assert asroot.SHIPPED_AS is None
    if os.geteuid() != 0:
        with pytest.raises(owned.OwnedError, match="cannot re-run itself under sudo"):
            asroot.privileged("repair", state_dir=str(tmp_path))
    else:
        assert asroot.privileged("repair", state_dir=str(tmp_path)) == {"restored": {}, "dcgm_resumed": False,
                                                                        "held": {}}
