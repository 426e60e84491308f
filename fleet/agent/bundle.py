"""What fleet ships to a node, and how: the one boundary between the controller and the agent.

The agent travels on the command's stdin as one zlib-compressed Python script:
a small loader and the source of every module in ``shipped()``, each compiled on
the node only when it is imported (``pynvml`` only where an NVIDIA driver is),
and kept compiled there, for the next call, in a private cache of the user's
(``fleet/agent/codecache.py``).
The node needs a ``python3`` (3.8 or newer) and nothing else. The same script,
uncompressed, is what ``fleet slurm install`` and a Slurm run write as
``fleet-agent.py``.

Shipped modules import one another by their flat names here (falling back to
the package's relative imports when they run from the installed package), and
otherwise only the standard library: tests/test_bundle.py holds every module
in ``shipped()`` to that, and to Python 3.8.

This module itself stays on the controller.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import re
import zlib
from functools import lru_cache
from pathlib import Path

# The agent's modes (the "mode" of its JSON argument) -> the shipped module whose main() serves it.
MODES = {
    "probe": "fleet_agent_node",
    "look": "fleet_agent_look",  # fleet top: a sample a line until the reader goes
    "profile": "fleet_agent_run",
    "repair": "fleet_agent_asroot",
    "owned": "fleet_agent_asroot",  # one step re-run under sudo -n (asroot.privileged)
    "task": "fleet_agent_task",
    "slurmd": "fleet_agent_slurmd",
    # a Ray run's end: its workers' nsys waited for, their reports summarized
    "ray-end": "fleet_agent_rayend",
}

# How fleet starts its agent, the only code on the remote command line: read the compressed script
# from stdin into `b`, and run it in this same namespace, so the loader finds the bytes there.
BOOTSTRAP = ("import sys,zlib;b=sys.stdin.buffer.read();"
             "exec(compile(zlib.decompress(b),'<fleet-agent>','exec'))")

# How fleet starts an agent ahead of its arguments (a lab run's, while its node is probed): it reads
# the compressed script alone, as many bytes as its first argument says, loads its mode's modules,
# and waits for its arguments, the rest of stdin, sent once fleet has saved the run it is part of.
BOOTSTRAP_AHEAD = ("import sys,zlib;b=sys.stdin.buffer.read(int(sys.argv.pop(1)));"
                   "exec(compile(zlib.decompress(b),'<fleet-agent>','exec'))")
# The longest an agent started ahead waits for its arguments: with none by then, or none at all
# (fleet has gone, or has nothing for it to do), it ends having done nothing.
AHEAD_WAIT = 600

# The shipped module that keeps compiled modules on the node between calls (see its docstring).
CODE_CACHE = "fleet_agent_codecache"

# The shipped module the loader hands the agent's own bytes to, and the attribute it sets there:
# the steps that need root run the same agent again under `sudo -n` (asroot.privileged).
HAND_OVER = ("fleet_agent_asroot", "SHIPPED_AS")

_LOADER = '''\
import sys
# Every module's source, each compressed on its own, one after another, in base64 (a plain string
# costs a tenth of the parsing that the sources as literals did): only those imported are
# unpacked, and none that the node's code cache has.
_PACKED = "{packed}"
_PARTS = {parts}
_SHA256 = {digests}
_MODES = {modes}
# Started by BOOTSTRAP, this script runs in its namespace, where b holds the bytes read from stdin;
# run as a file (Slurm) it has none, and cannot re-run itself under sudo.
_SHIPPED_AS = ({bootstrap!r}, b) if "b" in globals() else None
def _source(name):
    start, end = _PARTS[name]
    return __import__("zlib").decompress(__import__("binascii").a2b_base64(_PACKED)[start:end])\
.decode("utf-8")
_CACHE = []  # the node's code cache ({code_cache!r}) once asked for: [] not yet, [None] none to use
def _compiled(name):
    filename = "<fleet-agent>/" + name + ".py"
    if not _CACHE:
        _CACHE.append(None)  # the cache's own modules, imported now, compile as they would \
without it
        try:
            _CACHE[0] = __import__({code_cache!r}).CodeCache.open()
        except Exception:  # refused (not the user's own, a link) or unusable: compile every module
            pass
    if _CACHE[0] is None:
        return compile(_source(name), filename, "exec")
    return _CACHE[0].code(name, _SHA256[name], filename, lambda: _source(name))
class _Shipped:
    """Modules that travelled with the agent, compiled only when imported (importlib.abc's bases
    are left out: importing importlib.abc costs more than the rest of the loader)."""
    def find_spec(self, name, path=None, target=None):
        return __import__("importlib.machinery").machinery.ModuleSpec(name, self) \
if name in _PARTS else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(_compiled(module.__name__), module.__dict__)
        if module.__name__ == {hand_over_module!r}:
            module.{hand_over_attribute} = _SHIPPED_AS
sys.meta_path.insert(0, _Shipped())
def _ahead(mode):
    """The arguments of an agent started ahead of them, its mode's modules loaded meanwhile: the
    rest of stdin, to its end. Nothing sent within {ahead_wait} s, nothing at all, or a stop signal
    while it waits, ends it at once and quietly, having done nothing (nothing to put back); a stop
    signal once they came is kept for the mode's main, as it keeps its own (_STOPS)."""
    __import__(_MODES[mode])
    signal, got = __import__("signal"), []
    def stop(signum, frame):
        if not got:
            raise SystemExit(0)
        _STOPS.append(signum)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(s, stop)
    timer = __import__("threading").Timer({ahead_wait}, __import__("os")._exit, (0,))
    timer.daemon = True
    timer.start()
    text = sys.stdin.buffer.read().decode()
    got.append(True)
    timer.cancel()
    if not text:
        sys.exit(0)
    return text
_STOPS = []
_args = sys.argv[1] if len(sys.argv) > 1 else "{{}}"
if _args == "-" and "b" in globals():  # the arguments follow the compressed agent on stdin \
(no argv limit)
    _rest = __import__("zlib").decompressobj()
    _rest.decompress(b)
    _args = _rest.unused_data.decode()
if _args == "-ahead" and "b" in globals():  # started ahead (BOOTSTRAP_AHEAD): see _ahead
    _args = _ahead(sys.argv[2])
_args = __import__("json").loads(_args)
_main = __import__(_MODES[_args.get("mode", "probe")]).main
sys.exit(_main(_args, _STOPS) if sys.argv[1:2] == ["-ahead"] else _main(_args))
'''


def module_of(flat_name: str) -> str:
    """The module a flat name stands for: ``fleet_agent_wire`` is ``fleet.agent.wire`` (no module
    of fleet's that travels has an underscore in its name; tests/test_bundle.py holds it so)."""
    return flat_name.replace("_", ".") if flat_name.startswith("fleet_") else flat_name


# A shipped module's import of another by its flat name, at the start of a line (a function's own
# import too): ``import fleet_agent_wire as wire``, ``from fleet_policy_neighbours import *``.
FLAT_IMPORT = re.compile(r"^[ \t]*(?:import|from)[ \t]+(fleet_\w+|pynvml)\b", re.M)


def _flat_imports(source: str) -> set[str]:
    """The flat names a shipped module imports (its relative imports are the installed package's
    fallback, the same modules). Read by a pattern, not parsed: a fleet command builds the bundle
    as it starts, and parsing every shipped module took a quarter of a second."""
    return set(FLAT_IMPORT.findall(source))


@lru_cache(maxsize=1)
def shipped() -> dict[str, str]:
    """What travels to a node, as flat name -> module: the modules that start its work (each
    mode's, the code cache the loader asks for, the one it hands the agent's bytes to) and every
    module they import by flat name, found in their sources, never listed by hand."""
    found: dict[str, str] = {}
    todo = sorted(set(MODES.values()) | {CODE_CACHE, HAND_OVER[0]})
    while todo:
        name = todo.pop()
        if name in found:
            continue
        found[name] = module_of(name)
        if name != "pynvml":  # third-party: what it imports is its own
            todo += sorted(_flat_imports(source_path(name).read_text(encoding="utf-8"))
                           - set(found))
    return dict(sorted(found.items()))


def source_path(flat_name: str) -> Path:
    """Where the source of a shipped module is on this machine."""
    module = module_of(flat_name)
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        if module == "pynvml":
            raise RuntimeError("the NVML binding is missing: pip install nvidia-ml-py")
        raise RuntimeError(f"{module} is missing from this installation of fleet")
    return Path(spec.origin)


@lru_cache(maxsize=1)
def sources() -> dict[str, str]:
    """Each shipped module's source, by the flat name it travels under."""
    return {name: source_path(name).read_text(encoding="utf-8") for name in shipped()}


def digests() -> dict[str, str]:
    """Each shipped module's SHA-256 (of its UTF-8 source): what names it in the node's code
    cache."""
    return {name: hashlib.sha256(text.encode()).hexdigest() for name, text in sources().items()}


@lru_cache(maxsize=1)
def script() -> str:
    """The agent as one Python file: the loader and every module it may import."""
    parts, packed, at = {}, [], 0
    for name, text in sources().items():
        # level 6, not 9: half the time (every command that reaches a node builds it, before its
        # first answer) for 0.6 % more bytes
        packed.append(zlib.compress(text.encode(), 6))
        parts[name], at = (at, at + len(packed[-1])), at + len(packed[-1])
    module, attribute = HAND_OVER
    return _LOADER.format(packed=base64.b64encode(b"".join(packed)).decode("ascii"),
                          parts=repr(parts),
                          digests=repr(digests()), modes=repr(MODES), bootstrap=BOOTSTRAP,
                          code_cache=CODE_CACHE, ahead_wait=AHEAD_WAIT,
                          hand_over_module=module, hand_over_attribute=attribute)


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """The agent script, compressed, as it travels on stdin (built once per process)."""
    return zlib.compress(script().encode(), 9)
