"""Ship the node agent, run it in one round trip per node, read its JSON back.

The agent travels on the command's stdin as one zlib-compressed Python
script: ``fleet/agent/node.py`` plus the pure-Python NVML binding, which is
compiled on the node only when an NVIDIA driver is there. The node needs a
``python3`` (3.8 or newer) and nothing else.
"""

from __future__ import annotations

import importlib.util
import json
import zlib
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from .transport import Result

if TYPE_CHECKING:
    from .inventory import Host
    from .transport import Fanout

from .agent.owned import BOOTSTRAP  # the only code on the command line: run the script on stdin

_LOADER = '''\
import sys, importlib.abc, importlib.util
_LAZY = {lazy}
class _Shipped(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Modules that travelled with the agent, compiled only when imported."""
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in _LAZY else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(_LAZY[module.__name__], "<fleet-agent>/" + module.__name__ + ".py", "exec"), module.__dict__)
sys.meta_path.insert(0, _Shipped())
_args = __import__("json").loads(sys.argv[1]) if len(sys.argv) > 1 else {{}}
_mode = {{"probe": "fleet_agent_node", "profile": "fleet_agent_run", "repair": "fleet_agent_owned",
         "owned": "fleet_agent_owned", "task": "fleet_agent_task",
         "slurmd": "fleet_agent_slurmd"}}[_args.get("mode", "probe")]
sys.exit(__import__(_mode).main(_args))
'''


@lru_cache(maxsize=1)
def script() -> str:
    """The agent as one Python file: the loader and every module it may import."""
    spec = importlib.util.find_spec("pynvml")
    if spec is None or spec.origin is None:
        raise RuntimeError("the NVML binding is missing: pip install nvidia-ml-py")
    here = Path(__file__).parent
    sources = {"pynvml": Path(spec.origin).read_text(encoding="utf-8"),
               "fleet_policy": (here / "policy.py").read_text(encoding="utf-8"),
               "fleet_plan": (here / "plan.py").read_text(encoding="utf-8")}
    for name in ("node", "run", "owned", "task", "slurmd"):
        sources[f"fleet_agent_{name}"] = (here / "agent" / f"{name}.py").read_text(encoding="utf-8")
    return _LOADER.format(lazy=repr(sources))


@lru_cache(maxsize=1)
def bundle() -> bytes:
    """The agent script, compressed, as it travels on stdin (built once per process)."""
    return zlib.compress(script().encode(), 9)


def agent_argv(host: "Host", args: dict) -> list[str]:
    python = host.vars.get("ansible_python_interpreter", "python3")
    return [python, "-c", BOOTSTRAP, json.dumps(args, separators=(",", ":"))]


def agent_args(host: "Host", owner_uid: int | None = None, environment_check: bool = True) -> dict:
    """What the agent needs from the inventory; ``nsys status -e`` only when asked (doctor)."""
    args: dict = {"tools": {t: host.vars[f"{t}_path"] for t in ("nsys", "ncu") if host.vars.get(f"{t}_path")},
                  "environment_check": environment_check}
    if host.vars.get("report_dir"):
        args["report_dir"] = host.vars["report_dir"]
    if owner_uid is not None:
        args["owner_uid"] = owner_uid
    return args


def read_state(host: "Host", r: Result) -> Result:
    """Turn the agent's output into ``r.extra['state']``, or a clear per-host error."""
    if r.error and not r.reached:
        return r
    python = host.vars.get("ansible_python_interpreter", "python3")
    err = r.stderr.decode("utf-8", "replace").strip()
    if r.exit_status == 127 or (r.exit_status and "not found" in err and python in err):
        r.error, r.error_kind = (f"{python} not found on {host.name}: fleet's agent needs Python 3.8 or newer there "
                                 "(set ansible_python_interpreter to its path)"), "no-python"
        return r
    if r.exit_status != 0 or r.error:
        last = err.splitlines()[-1] if err else (r.error or f"exit status {r.exit_status}")
        if "SyntaxError" in err:
            last = f"{python} on {host.name} is too old for fleet's agent (3.8 or newer needed): {last}"
        r.error, r.error_kind = f"agent failed on {host.name}: {last}", r.error_kind or "agent"
        return r
    try:
        r.extra["state"] = json.loads(r.stdout)
    except ValueError as e:
        r.error, r.error_kind = f"agent on {host.name} printed no JSON document: {e}", "agent"
    return r


async def probe(fan: "Fanout", hosts: list["Host"], *, owner_uid: int | None = None, environment_check: bool = True,
                timeout: float = 120.0, on_result: Callable[[Result], None] | None = None) -> list[Result]:
    """One round trip per host; each Result carries ``extra['state']`` or an error."""
    payload = bundle()

    async def one(host: "Host") -> Result:
        args = agent_args(host, owner_uid, environment_check)
        r = await fan.run(host, agent_argv(host, args), input=payload, timeout=timeout)
        return read_state(host, r)

    return await fan.each(hosts, one, on_result)
