"""``fleet slurm install``: the files that wire fleet into slurmd, rendered (and, with --apply,
written).

Everything lives under one prefix (default /etc/fleet), owned by root: the
agent as one Python file, the node config (owned sysctls and the failure
policy), and three tiny wrapper scripts that slurm.conf names. The wrappers
start the node's Python by absolute path (slurmd gives prologs no useful PATH),
isolated (``-I``: no PYTHONPATH, no user site, nothing from the job's folder).

A Python that cannot run the hooks would fail every job's prolog, and Slurm
drains a node whose prolog fails: so the install first runs the chosen
interpreter with the bundled agent and refuses it in one line, writing nothing
(:func:`interpreter_problem`), and each wrapper checks again before it starts
the agent: an interpreter that cannot start (removed, replaced by an older one)
is logged and the hook exits 0, leaving the node in service.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import exitcodes
from ..agent.bundle import script as agent_script
from ..rundir import RunDir
from ..errors import FleetError

OPS = {"prolog": "Prolog", "epilog": "Epilog", "task-prolog": "TaskProlog"}
NEEDS = (3, 8)  # the agent's oldest Python (tests/test_bundle.py holds it to that)
VERSION = "import sys; print('%d.%d.%d' % sys.version_info[:3])"
# The wrappers' last guard: the interpreter starts and is new enough, or the hook says why and exits
# 0.
GUARD = ("import sys; sys.exit(0 if sys.version_info >= %r else 'it is Python %%d.%%d; the agent "
         "needs %d.%d or newer' %% sys.version_info[:2])" % (NEEDS, *NEEDS))
AS_ROOT = "fleet slurm install --apply writes files slurmd runs as root: run it as root"


@dataclass(frozen=True)
class NodeSetup:
    prefix: str = "/etc/fleet"
    python: str = "/usr/bin/python3"
    owned_sysctls: dict = field(default_factory=dict)
    jobs_dir: str = "/run/fleet/jobs"
    state_dir: str = "/var/lib/fleet"
    log_file: str = "/var/log/fleet/slurm.log"
    fail_closed: bool = False
    pause_dcgm: bool = False
    # None: the newest under /opt/nvidia (root's installations)
    qdstrm_importer: str | None = None
    finish_timeout: int = 120               # seconds the epilog may spend finishing reports
    # the node's own value of each owned sysctl
    baseline_sysctls: dict = field(default_factory=dict)

    @property
    def config_path(self) -> str:
        return f"{self.prefix}/node.json"

    @property
    def agent(self) -> str:
        """The agent as one file, named as a Slurm run's folder names it."""
        return f"{self.prefix}/{RunDir.AGENT}"

    def config(self) -> dict:
        return {"owned_sysctls": dict(self.owned_sysctls), "jobs_dir": self.jobs_dir,
                "state_dir": self.state_dir,
                "log_file": self.log_file, "fail_closed": self.fail_closed,
                "pause_dcgm": self.pause_dcgm,
                "qdstrm_importer": self.qdstrm_importer, "finish_timeout": self.finish_timeout,
                "baseline_sysctls": dict(self.baseline_sysctls)}

    def wrapper(self, op: str) -> str:
        args = json.dumps({"mode": "slurmd", "op": op, "config": self.config_path},
                          separators=(",", ":"))
        log = shlex.quote(self.log_file)
        return (f"#!/bin/sh\n# fleet's Slurm {OPS[op]} (written by `fleet slurm install`; see "
                "docs/slurm-admin.md).\n# It exits 0 on fleet's own errors (logged to syslog and "
                f"{self.log_file}).\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n"
                f"py={shlex.quote(self.python)}\n"
                "# The last guard: an interpreter that cannot start must not fail the hook (Slurm "
                "would drain\n# the node). Nothing is printed: a TaskProlog's output becomes the "
                f"job's environment.\nif ! why=$(\"$py\" -I -c {shlex.quote(GUARD)} 2>&1 "
                f"</dev/null); then\n    msg=\"fleet slurm: {op}: $py cannot run fleet's agent "
                "($(printf '%s' \"$why\" | tail -n 1)): nothing done, node left in service\"\n"
                "    logger -t fleet -p daemon.err -- \"$msg\" 2>/dev/null\n"
                f"    {{ mkdir -p -- \"$(dirname -- {log})\" && printf '%s %s\\n' \"$(date "
                f"+%Y-%m-%dT%H:%M:%S)\" \"$msg\" >> {log}; }} 2>/dev/null\n"
                "    exit 0\n"
                "fi\n"
                f"exec \"$py\" -I {shlex.quote(self.agent)} {shlex.quote(args)}\n")

    def slurm_conf(self) -> str:
        return ("".join(f"{OPS[op]}={self.prefix}/slurm-{op}\n" for op in OPS)
                + "PrologFlags=Alloc   # the prolog runs when the job is allocated, before its "
                "batch script\n")

    def files(self) -> dict[str, tuple[bytes, int]]:
        """path -> (content, mode)"""
        out = {self.agent: (agent_script().encode(), 0o644),
               self.config_path: ((json.dumps(self.config(), indent=1) + "\n").encode(), 0o644)}
        for op in OPS:
            out[f"{self.prefix}/slurm-{op}"] = (self.wrapper(op).encode(), 0o755)
        return out


def baselines(owned: dict, given: dict) -> dict:
    """The node's own value of each owned sysctl, outside fleet's jobs: as given, else as this
    machine has it now (the install is run on the nodes). The prolog and epilog hold the node to
    it when the state record of a change is lost (a NODE FAULT, never adopted as the original)."""
    out = {}
    for name in owned:
        if name in given:
            out[name] = given[name]
            continue
        try:
            out[name] = Path("/proc/sys", *name.split(".")).read_text().strip()
        except OSError:
            continue  # not readable here: no baseline, the record alone says what to put back
    return out


class InstallRefused(FleetError):
    """``fleet slurm install`` refused before anything is written: one line, a usage error."""


class NotRoot(InstallRefused):
    """--apply run by a user other than root: slurmd runs the files as root, so only root may
    write them."""

    exit_status = exitcodes.FAILED


def check_options(owned: dict, given: dict, qdstrm_importer: str | None) -> None:
    """InstallRefused for a baseline given for a sysctl that is not owned, or a QdstrmImporter not
    named by absolute path (the epilog gets no PATH)."""
    if (stray := sorted(set(given) - set(owned))):
        raise InstallRefused(f"--baseline-sysctl {stray[0]}: not an owned sysctl (--owned-sysctl)")
    if qdstrm_importer and not qdstrm_importer.startswith("/"):
        raise InstallRefused("--qdstrm-importer takes an absolute path (the epilog gets no PATH)")


def check_python(python: str, *, writing: bool, on_nodes: bool) -> None:
    """InstallRefused, before anything is written, for a ``python`` that cannot run the hooks (it
    would drain every node): here; then, ``writing``, NotRoot unless this is root, and
    (``on_nodes``) on each node through a step, as slurmd will run it."""
    if (why := interpreter_problem(python)):
        raise InstallRefused(f"{why}; nothing written" if writing else why)
    if writing and os.geteuid() != 0:
        raise NotRoot(AS_ROOT)
    if writing and on_nodes and (why := nodes_problem(python)):
        raise InstallRefused(f"{why}; nothing written")


def interpreter_problem(python: str) -> str | None:
    """Why ``python`` cannot run the hooks, in one line naming it and its version, or None: it is
    run here with the bundled agent (its hooks' modules compiled and imported, as on a node)."""
    if not python.startswith("/"):
        return f"--python {python}: give an absolute path (slurmd runs the hooks with no PATH)"
    try:
        said = subprocess.run([python, "-I", "-c", VERSION], capture_output=True, text=True,
                              timeout=30)
        version = said.stdout.strip() if said.returncode == 0 and said.stdout.strip() else None
    except (OSError, subprocess.SubprocessError) as e:
        return f"--python {python} cannot run the hooks: {getattr(e, 'strerror', None) or e}"
    named = (f"--python {python} (Python {version})" if version
             else f"--python {python} (no version: it did not start)")
    fd, agent = tempfile.mkstemp(prefix="fleet-agent-check-", suffix=".py")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(agent_script())
        ran = subprocess.run([python, "-I", agent, json.dumps({"mode": "slurmd", "op": "check"})],
                             capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{named} cannot run fleet's agent: {e}"
    finally:
        os.unlink(agent)
    if ran.returncode != 0:
        lines = [line.strip() for line in (ran.stderr or ran.stdout).splitlines() if line.strip()]
        needs = "; the hooks need Python %d.%d or newer" % NEEDS
        return (f"{named} cannot run fleet's agent: "
                f"{lines[-1] if lines else f'exit status {ran.returncode}'}{needs}")
    return None


# One task per node: the interpreter's version, then the bundled agent's own check (read from
# stdin, as on a lab server), and the node's name: "@@check NODE STATUS VERSION LAST-LINE".
NODE_CHECK = ('v=$("$0" -I -c "$1" 2>/dev/null </dev/null); out=$("$0" -I -c "$2" "$3" 2>&1); '
              'rc=$?; echo "@@check ${SLURMD_NODENAME:-?} $rc ${v:--} $(printf %s "$out" | tail -n '
              '1)"')
STEP_BOUND = 120  # seconds the checking step may take, from submission (it waits for free nodes)


class _Unchecked(FleetError):
    """Why the nodes could not be checked at all: sinfo or srun failed, or no node is in service
    (said by nodes_problem in its answer, never raised to the user)."""


def nodes_problem(python: str, env: dict | None = None) -> str | None:
    """Why ``python`` cannot run the hooks on some node of the cluster, in one line naming the
    node, the path and its version; None when every node that can take a step ran the agent's
    check with it. One step, a task on each node, through the cluster's own srun."""
    try:
        nodes = _nodes_in_service(env)
        ran = _check_step(python, nodes, env)
    except _Unchecked as e:
        return f"cannot check --python {python} on the nodes: {e}"
    said = _said(ran.stdout)
    for node in nodes:
        if node not in said:
            why = (ran.stderr.decode(errors="replace").strip().splitlines()[-1:]
                   or [f"exit status {ran.returncode}"])
            return f"cannot check --python {python} on {node}: the step did not run there: {why[0]}"
        if (why := _node_problem(python, node, *said[node])):
            return why
    return None


def _nodes_in_service(env: dict | None) -> list[str]:
    """The nodes sinfo lists in service (idle, mixed, allocated or completing), sorted."""
    try:
        listed = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True,
                                text=True, timeout=30, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise _Unchecked(f"sinfo: {getattr(e, 'strerror', None) or e}") from e
    if listed.returncode != 0:
        raise _Unchecked(f"sinfo: {listed.stderr.strip() or listed.returncode}")
    nodes = sorted({n for n, state in (line.split()[:2] for line in listed.stdout.splitlines()
                                       if len(line.split()) > 1)
                    if state.rstrip("*~#!%$@^-") in ("idle", "mix", "alloc", "comp")})
    if not nodes:
        raise _Unchecked("sinfo lists none in service")
    return nodes


def _check_step(python: str, nodes: list[str], env: dict | None) -> subprocess.CompletedProcess:
    """The checking step, a task on each of ``nodes`` (NODE_CHECK), run to its end; what it said."""
    from ..agent.bundle import BOOTSTRAP, bundle
    cmd = ["srun", f"--nodelist={','.join(nodes)}", f"--nodes={len(nodes)}",
           f"--ntasks={len(nodes)}",
           "--ntasks-per-node=1", "--input=all", "--time=2", "--immediate=60",
           "--job-name=fleet-install-check", "--quiet",
           "sh", "-c", NODE_CHECK, python, VERSION, BOOTSTRAP,
           json.dumps({"mode": "slurmd", "op": "check"})]
    try:
        return subprocess.run(cmd, input=bundle(), capture_output=True, timeout=STEP_BOUND, env=env)
    except (OSError, subprocess.SubprocessError) as e:
        raise _Unchecked(f"srun: {getattr(e, 'strerror', None) or e}") from e


def _said(stdout: bytes) -> dict[str, tuple[str, str, str]]:
    """Each node's "@@check" line from the step's output: node -> (status, version, last line)."""
    said = {}
    for line in stdout.decode(errors="replace").splitlines():
        parts = line.split(" ", 4)
        if len(parts) >= 4 and parts[0] == "@@check":
            said[parts[1]] = (parts[2], parts[3], parts[4] if len(parts) > 4 else "")
    return said


def _node_problem(python: str, node: str, status: str, version: str, last: str) -> str | None:
    """Why ``python`` failed the agent's check on ``node``, from what its task said, or None."""
    if status != "0" and version == "-":
        return f"--python {python} does not start on {node}: {last or f'exit status {status}'}"
    if status != "0":
        return (f"--python {python} on {node} (Python {version}) cannot run fleet's agent: {last}; "
                "the hooks need Python %d.%d or newer" % NEEDS)
    return None


def apply(setup: NodeSetup) -> list[str]:
    """Write the files (as root: they are run by slurmd as root, so only root may change them)."""
    if os.geteuid() != 0:
        raise PermissionError(AS_ROOT)
    Path(setup.prefix).mkdir(mode=0o755, parents=True, exist_ok=True)
    written = []
    for path, (content, mode) in setup.files().items():
        tmp = Path(path + ".tmp")
        tmp.write_bytes(content)
        tmp.chmod(mode)
        os.replace(tmp, path)
        written.append(path)
    return written
