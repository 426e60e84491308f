"""Fixtures that start real services: OpenSSH servers on loopback (root needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest

# The harness's helpers assert as the tests do: rewritten like test modules, so a failure says what it saw.
pytest.register_assert_rewrite("tests.harness")

from tests.harness import fakenvml, groups  # noqa: E402
from tests.harness.sshd import SSHCluster  # noqa: E402

# Fixtures several test modules use, each module that asks getting its own (module scope): the lab
# servers, the test Slurm cluster, a node's prolog files. Registered here so that no test module
# imports another (tests/test_test_layout.py).
pytest_plugins = ["tests.harness.lab", "tests.harness.hpc", "tests.harness.prolog"]

REPO = Path(__file__).resolve().parents[1]
RECORDED = REPO / "tests" / "fixtures" / "nsys-2025.3-h200"  # what the real nsys wrote on an H200


def recorded_kernels() -> list[str]:
    """The kernel names of the recorded ``nsys stats`` kernel summary, most time first: the
    kernels the stand-in nsys replays."""
    from fleet.store import kernel_rows
    return [name for name, _, _ in kernel_rows(RECORDED / "with-nvtx_cuda_gpu_kern_sum.csv")]
PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")


@contextmanager
def perf_event_paranoid(value: str):
    """kernel.perf_event_paranoid at ``value`` for some tests, and the value found put back
    however they end (a failure, an error in set-up, Ctrl-C). Why it is changed at all: fleet's
    owned-sysctl handling is tested against the real one. It is the kernel's, one for the whole
    machine: no namespace holds a copy of it, so the tests cannot keep it to themselves, only put
    it back. Two runs of the suite on one machine must therefore not overlap (run them one after
    the other, e.g. under `flock`); the tests' other state (ports, sshd, files, processes) is
    their own."""
    original = PARANOID.read_text().strip()
    try:
        PARANOID.write_text(value)
        yield original
    finally:
        PARANOID.write_text(original)


def announce(config: pytest.Config, line: str) -> None:
    """Say on the terminal which service a fixture started, even under capture."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if capture is None or reporter is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(f"[fleet tests] {line}")


@pytest.fixture(scope="session")
def cluster(pytestconfig):
    """Four real sshd hosts with strict known_hosts, shared by the tests that only read."""
    with SSHCluster(4) as c:
        announce(pytestconfig, f"started {len(c.hosts)} sshd on {c.hosts[0].address}..{c.hosts[-1].address}"
                               f":{c.hosts[0].port} (user {c.user})")
        yield c
    announce(pytestconfig, "stopped the sshd hosts")


@pytest.fixture(scope="session", autouse=True)
def _gpu_locks_of_this_run():
    """The GPU counter locks of the agents this run starts, in a folder of its own (FLEET_LOCK_DIR,
    which agents started from this process inherit): the node's is /var/lock, one for the machine,
    where the suite's workers (pytest-xdist), or another run, would hold each other's simulated
    GPUs, whose UUIDs are alike. Every account may lock there (1777), as in /var/lock."""
    import shutil
    import tempfile

    folder = tempfile.mkdtemp(prefix="fleet-tests-gpu-locks-")
    os.chmod(folder, 0o1777)
    os.environ["FLEET_LOCK_DIR"] = folder
    yield
    shutil.rmtree(folder, ignore_errors=True)


# Tests that start a process every probe on the machine sees (the agent looks for MPS and DCGM daemons by
# name, machine-wide): on several workers they run alone, while no other test runs (:func:`_machine_turns`).
ALONE_WORDS = ('"nvidia-cuda-mps-control"', '"nv-hostengine"')
_SEEN: dict = {}  # the sources read, for each test's turn (as the markers read them)


@pytest.fixture(autouse=True)
def _machine_turns(request, tmp_path_factory):
    """On several workers (pytest-xdist), every test that starts something takes a shared turn on
    the machine, and a test of ALONE_WORDS an exclusive one: its fake MPS or DCGM daemon would
    otherwise be every other worker's probe's too. A gate taken first keeps a test that waits to
    be alone from waiting behind an endless stream of shared turns. One process: no locks."""
    if "PYTEST_XDIST_WORKER" not in os.environ or request.node.get_closest_marker("services") is None:
        yield
        return
    import fcntl

    shared_dir = tmp_path_factory.getbasetemp().parent  # this run's, the same for every worker
    alone = any(w in source for source in _sources(request.node, _SEEN) for w in ALONE_WORDS)
    gate, turn = (os.open(shared_dir / name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                  for name in ("machine-gate.lock", "machine-turn.lock"))
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(turn, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        if not alone:
            fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(turn)
        os.close(gate)


def run_fleet(*args: str, env: dict | None = None, input: str | None = None, timeout: float = 120,
              prefix: tuple[str, ...] = ()):
    """The real command line, as a user would run it (``prefix``: started through it, e.g. nsenter),
    with no FLEET_ setting of the developer's but this run's GPU locks folder."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_") or k == "FLEET_LOCK_DIR"}
    full_env.update(env or {})
    return subprocess.run([*prefix, sys.executable, "-m", "fleet", *args], env=full_env, input=input,
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def fleet_json(text: str, command: str | None = None):
    """The data of fleet's --json envelope, checked: its version and, if given, the command."""
    doc = json.loads(text)
    assert set(doc) == {"fleet_json", "command", "data"} and doc["fleet_json"] == 1, doc
    assert command is None or doc["command"] == command, doc["command"]
    return doc["data"]


def fleet_json_lines(text: str, command: str | None = None) -> list:
    """The data of each line of a streaming command's --json output (one envelope per line)."""
    return [fleet_json(line, command) for line in text.splitlines() if line.strip()]


# The simulated NVML, built once per test module, and a scenario file for it.

@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    return fakenvml.build(tmp_path_factory.mktemp("fakenvml-lib"))


@pytest.fixture
def scenario(tmp_path):
    return tmp_path / "scenario.txt"


# --- markers: `pytest -m "not services"` runs the pure checks alone, in under a minute ---

# What a test needs of the machine beyond Python: servers it starts (OpenSSH, a Slurm cluster,
# Chromium, cron), programs it runs (fleet's own command line, the agent as a process, the
# profilers' stand-ins, ansible-inventory, gcc for the simulated NVML), or the machine-wide sysctl
# it changes (kernel.perf_event_paranoid: runs must not overlap).
SERVICE_WORDS = ("SSHCluster(", "SlurmCluster(", "screenshot(", "CHROMIUM", "subprocess", "Popen", "run_fleet",
                 "unshare", "fakenvml.build", "lib_dir", "spawn(", "_agent(", "asyncio.run(", "ansible_list(",
                 "importer(", "perf_event_paranoid(", "PARANOID.write_text(", "Sysctl(")


# What needs root: accounts made and used, files given to other accounts, the machine-wide sysctl,
# sudoers, namespaces, and the servers (sshd and slurmd run as root).
ROOT_WORDS = ("SSHCluster(", "SlurmCluster(", "ensure_user(", "TENANT_USER", "TEST_USER", "chown", "PARANOID.",
              "perf_event_paranoid(", "Sysctl(", "sudoers", "unshare", "nsenter", "setuid",
              "skipif(os.geteuid() != 0")
TESTS = Path(__file__).resolve().parent


def _source(obj) -> str:
    import inspect

    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return ""


_DEFINITIONS: dict = {}  # a module's file -> (its lines, its functions' nodes by their first line)


def _definition(func) -> tuple:
    """(the source of ``func``, its parsed node or None): cut from its module's file, which is read
    and parsed once (inspect.getsource and a parse of each function's own text took most of the
    collection's time); a function not found there (a lambda, a file gone) through inspect."""
    import ast
    import inspect

    code = getattr(inspect.unwrap(func), "__code__", None) if callable(func) else None
    if code is None:
        return _source(func), None
    if code.co_filename not in _DEFINITIONS:
        try:
            text = Path(code.co_filename).read_text()
            tree = ast.parse(text)
        except (OSError, SyntaxError, ValueError):
            text, tree = "", ast.Module(body=[], type_ignores=[])
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        # a function's code starts at its first decorator's line, as its node's decorators do
        _DEFINITIONS[code.co_filename] = (text.splitlines(keepends=True),
                                          {min([n.lineno, *(d.lineno for d in n.decorator_list)]): n for n in defs})
    lines, nodes = _DEFINITIONS[code.co_filename]
    node = nodes.get(code.co_firstlineno)
    if node is None:
        return _source(func), None
    return "".join(lines[code.co_firstlineno - 1:node.end_lineno]), node


def _called(func) -> list:
    """The functions of tests/ that ``func`` calls by name (``helper(...)``, ``module.helper(...)``)."""
    import ast
    import inspect
    import textwrap

    source, tree = _definition(func)
    if tree is None:
        try:
            tree = ast.parse(textwrap.dedent(source))
        except SyntaxError:
            return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        chain, target = [], node.func
        while isinstance(target, ast.Attribute):
            chain.insert(0, target.attr)
            target = target.value
        if not isinstance(target, ast.Name):
            continue
        obj = getattr(func, "__globals__", {}).get(target.id)
        for attr in chain:
            obj = getattr(obj, attr, None)
        code = getattr(obj, "__code__", None)
        if inspect.isfunction(obj) and code and Path(code.co_filename).is_relative_to(TESTS):
            found.append(obj)
    return found


def _reached(func, seen: dict) -> str:
    """The source of ``func`` and of every function of tests/ it calls, however deep (memoized)."""
    if func in seen:
        return seen[func]
    seen[func] = _definition(func)[0]  # a call back into itself adds nothing
    seen[func] += "".join(_reached(f, seen) for f in _called(func))
    return seen[func]


# Libraries that run a program when first imported, imported here, before any test's guard, so that no
# test is failed for the import order of a library: croniter runs `file` (platform.architecture()),
# asyncssh `ldconfig` (ctypes.util.find_library, for its post-quantum key exchange).
import fleet  # noqa: E402,F401  (first: its filter of asyncssh's DSA warnings applies to the import below)
import asyncssh  # noqa: E402,F401
import croniter  # noqa: E402,F401

GUARD = "_a_pure_test_starts_nothing"  # the guard below, which every test uses: not itself a start


@pytest.fixture(autouse=True)
def _a_pure_test_starts_nothing(request, monkeypatch):
    """A test not marked services starts no process: every process start (subprocess, asyncio's,
    multiprocessing's, a fork) fails it, naming what it started. This keeps the marker honest where
    the words above miss a start hidden in a helper class (`-m "not services"` is then pure)."""
    if request.node.get_closest_marker("services") is None:
        def refused(what):
            def start(*args, **kwargs):
                raise AssertionError(f"this test starts {what} but is not marked services: give its module "
                                     "pytestmark = pytest.mark.services (tests/conftest.py)")
            return start
        monkeypatch.setattr(subprocess.Popen, "_execute_child", refused("a process"))
        monkeypatch.setattr(os, "fork", refused("a process (os.fork)"))
        monkeypatch.setattr(os, "posix_spawn", refused("a process (os.posix_spawn)"))
        monkeypatch.setattr(os, "posix_spawnp", refused("a process (os.posix_spawnp)"))
    yield


# What reads or writes kernel.perf_event_paranoid, the machine's one sysctl the tests change: the
# kernel_lab (tests/harness/lab.py), the prolog's paranoid_3, conftest's perf_event_paranoid(), a test
# reading it. A lab (`lab`) has a value of its own (tests/harness/sysctl.py), and is not among them.
SYSCTL_WORDS = ("PARANOID.", "perf_event_paranoid(", "/proc/sys/kernel/perf_event_paranoid", "KernelSysctl(")
SYSCTL_GROUP = "perf_event_paranoid"


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own, which reads the groups given here
def pytest_collection_modifyitems(config, items):
    """A test needs services (or root) when it, a fixture it uses (however deep), or a helper of
    tests/ either calls (however deep) starts one (or does what only root may). Then each test is
    given its group for pytest-xdist (:func:`_groups`)."""
    seen: dict = {}
    touching = set()
    for item in items:
        sources = _sources(item, seen)
        if any(w in s for s in sources for w in SERVICE_WORDS):
            item.add_marker(pytest.mark.services)
        if any(w in s for s in sources for w in ROOT_WORDS):
            item.add_marker(pytest.mark.root)
        if any(w in s for s in sources for w in SYSCTL_WORDS):
            touching.add(item.nodeid)
    _groups(items, touching)


def _sources(item, seen: dict) -> list[str]:
    """The source of a test and of every fixture it uses, each with the helpers of tests/ it calls."""
    defs = [d for name in getattr(item, "fixturenames", ()) if name != GUARD for d in
            (item._fixtureinfo.name2fixturedefs.get(name) or ())]
    funcs = [f for f in [getattr(item, "function", None), *(d.func for d in defs)] if f is not None]
    return [_reached(f, seen) for f in funcs]


def _groups(items, touching: set) -> None:
    """The suite runs on several workers (pytest-xdist, ``--dist loadgroup``, scripts/test), a group
    to a worker. A module is one group, so its module fixtures (a Slurm cluster, a team store) start
    once. The tests that touch kernel.perf_event_paranoid (``touching``: their ids; the kernel_lab,
    the prolog's paranoid_3, the docs' reader, the file read) share one group, run one after another on
    one worker: the sysctl is the machine's, and each sets it and asserts what it finds. A module
    with both kinds is in two groups, its module fixtures started in each.
    A test that starts nothing (no ``services`` marker) is a group of its own: it shares nothing worth
    keeping on one worker, and a module of many such tests (the change points' hundred histories a
    test) spreads over them all. The groups are handed out longest first (tests/harness/groups.py:
    the seconds each took in a whole run), the order within a group kept."""
    group_of, tests_of, services = {}, Counter(), set()
    for item in items:
        if item.nodeid in touching:
            name = SYSCTL_GROUP
        elif item.get_closest_marker("services") is None:
            name = item.nodeid
        else:
            name = item.path.relative_to(TESTS).as_posix()
        item.add_marker(pytest.mark.xdist_group(name))
        group_of[item.nodeid] = name
        tests_of[name] += 1
        if item.get_closest_marker("services") is not None:
            services.add(name)
    seconds = groups.weights(tests_of, services)
    items.sort(key=lambda item: -seconds[group_of[item.nodeid]])  # stable: a group's own order kept


def pytest_configure(config):
    """pytest-xdist hands out the groups in the order given above, not by their count of tests."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False
