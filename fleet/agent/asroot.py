"""One step that changes the node's state, done as root: directly where the agent is root, else
by this same agent run again under ``sudo -n`` with its own bytes; and the mode that serves
``fleet repair`` and such a re-run (``owned``), which answers one "repair" line of the wire.

Runs ON THE NODE (standard library, Python 3.8), for :mod:`holds` (a run's owned sysctls and
DCGM pause) and ``fleet repair``; the steps themselves are :mod:`owned`'s. Root reached through
sudo sets only what the node's root-owned config lists (:mod:`nodeconfig`), whatever the caller
asked for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field

try:  # as shipped by fleet, every module travels under a flat name
    import fleet_agent_nodeconfig as nodeconfig
    import fleet_agent_wire as wire
    import fleet_policy as policy
    from fleet_agent_owned import OPS, OwnedError
except ImportError:  # as part of the installed package (tests, the local machine)
    from . import nodeconfig, wire
    from .. import policy
    from .owned import OPS, OwnedError

# How this agent was shipped, so a step that needs root can run the same
# agent again under `sudo -n`:
# (the bootstrap one-liner, the compressed agent it read from stdin). Set by the bundle's loader
# (fleet/agent/bundle.py) right after it loads this module. None when the agent runs from a file
# (Slurm) or from the installed package: there is nothing to hand to sudo then.
SHIPPED_AS = None


class NoRoot(OwnedError):
    """Root could not be reached at all (no sudo, sudo wants a password), or root reached through
    sudo would set none of what was asked (the node's config does not list it): nothing changed."""


NO_ROOT_REMEDY = ("run as root, have an admin allow it without a password (sudoers), "
                  "or profile through Slurm where fleet's prolog sets it")


def privileged(op, **kw):
    """Do one state-changing step as root: directly, or by running this agent
    again under ``sudo -n``."""
    if os.geteuid() == 0:
        return _step(op)(**kw)
    if SHIPPED_AS is None:
        raise NoRoot("changing node state needs root, and this agent "
                     "cannot re-run itself under sudo")
    bootstrap, bundle = SHIPPED_AS
    try:
        out = subprocess.run(["sudo", "-n", sys.executable, "-c", bootstrap,
                              json.dumps(dict(kw, mode="owned", op=op))],
                             input=bundle, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             timeout=120)
    except FileNotFoundError:
        raise NoRoot("changing node state needs root, and this node has "
                     "no sudo: %s" % NO_ROOT_REMEDY)
    except subprocess.TimeoutExpired:
        raise OwnedError("as root through sudo -n: no answer within 120 s")
    answer = SudoAnswer.of(out)
    if out.returncode != 0 or not answer.said or answer.error is not None:
        raise _sudo_failure(out, answer)
    return answer.value


@dataclass(frozen=True)
class SudoAnswer:
    """The answer of the agent re-run under sudo (a "repair" line), read once: its value, or its
    error and whether it changed nothing. ``said``: whether it gave an answer at all."""
    said: bool = False
    value: object = None
    error: str | None = None
    nothing_changed: bool = False

    @classmethod
    def read(cls, doc):
        if not isinstance(doc, dict):
            return cls()
        error = doc.get("error")
        return cls(True, doc.get("value"), error if isinstance(error, str) and error else None,
                   doc.get("nothing_changed") is True)

    @classmethod
    def of(cls, out):
        """From the re-run's output: none where it gave no answer; an error saying what it printed
        instead of one."""
        text = out.stdout.decode(errors="replace")
        try:
            return cls.read(wire.read(text, "repair")) if out.returncode in (0, 1) else cls()
        except wire.WireError as e:
            if not text.strip():
                return cls()
            return cls(True, error="%s: %.200r" % (e, text.strip()[-200:]))


def _sudo_failure(out, answer):
    """Why the step as root failed: NoRoot where sudo would not run it (or it changed nothing),
    else OwnedError."""
    said = out.stderr.decode(errors="replace").strip().splitlines()[-1:] or ["no output"]
    why = answer.error or said[0]
    if "password is required" in why or "may not run sudo" in why or "not in the sudoers" in why:
        return NoRoot("as root through sudo -n: %s: %s" % (why, NO_ROOT_REMEDY))
    if answer.nothing_changed:
        return NoRoot("as root through sudo -n: %s" % why)
    return OwnedError("as root through sudo -n: %s" % why)


def through_sudo(mode):
    """Whether this agent is root reached through sudo (:func:`privileged` re-runs it as mode
    "owned"; sudo sets SUDO_UID): then the caller is not who decides what root changes."""
    return os.geteuid() == 0 and (mode == "owned" or "SUDO_UID" in os.environ)


@dataclass(frozen=True)
class RootCall:
    """A call of this mode, read once: the step (``op``, "repair" unless said), its keyword
    arguments, the mode it came as ("owned": re-run under sudo by :func:`privileged`), and the
    sysctls it wants set (acquire_sysctls), which root reached through sudo checks against the
    node's own config."""
    op: str
    kw: dict
    mode: str | None = None
    wanted: dict = field(default_factory=dict)

    @classmethod
    def read(cls, args):
        op, mode, wanted = args.get("op", "repair"), args.get("mode"), args.get("wanted")
        return cls(op if isinstance(op, str) else "",
                   {k: v for k, v in args.items() if k not in ("mode", "op")},
                   mode if isinstance(mode, str) else None,
                   wanted if isinstance(wanted, dict) else {})


def _as_root(call):
    kw = call.kw
    if call.op == "acquire_sysctls" and through_sudo(call.mode):
        allowed, why = policy.sudo_sysctls(call.wanted, *nodeconfig.owned_sysctls())
        if why:
            raise NoRoot(why)
        kw = dict(kw, owned=allowed)
    return _step(call.op)(**kw)


def _step(op):
    if op not in OPS:
        raise OwnedError("no such step: %.40r" % op)
    return OPS[op]


def main(args):
    """Entry point for ``fleet repair`` and for steps re-run under sudo: one JSON line out."""
    call = RootCall.read(args)
    result = {"host": os.uname()[1]}
    try:
        result["value"] = _as_root(call) if os.geteuid() == 0 else privileged(call.op, **call.kw)
    except NoRoot as e:
        result["error"], result["nothing_changed"] = str(e), True
    except (OwnedError, OSError) as e:
        result["error"] = str(e)
    sys.stdout.write(wire.frame("repair", result))
    return 1 if "error" in result else 0
