"""``fleet slurm install``: the files that wire fleet into slurmd, rendered (and, with --apply, written).

Everything lives under one prefix (default /etc/fleet), owned by root: the
agent as one Python file, the node config (owned sysctls and the failure
policy), and three tiny wrapper scripts that slurm.conf names. The wrappers
start the node's Python by absolute path: slurmd gives prologs no useful PATH.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..agent.bundle import script as agent_script

OPS = {"prolog": "Prolog", "epilog": "Epilog", "task-prolog": "TaskProlog"}


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
    qdstrm_importer: str | None = None      # None: the newest under /opt/nvidia (root's installations)
    finish_timeout: int = 120               # seconds the epilog may spend finishing reports

    @property
    def config_path(self) -> str:
        return f"{self.prefix}/node.json"

    def config(self) -> dict:
        return {"owned_sysctls": dict(self.owned_sysctls), "jobs_dir": self.jobs_dir, "state_dir": self.state_dir,
                "log_file": self.log_file, "fail_closed": self.fail_closed, "pause_dcgm": self.pause_dcgm,
                "qdstrm_importer": self.qdstrm_importer, "finish_timeout": self.finish_timeout}

    def wrapper(self, op: str) -> str:
        args = json.dumps({"mode": "slurmd", "op": op, "config": self.config_path}, separators=(",", ":"))
        return (f"#!/bin/sh\n# fleet's Slurm {OPS[op]} (written by `fleet slurm install`; see docs/slurm-admin.md).\n"
                f"# It exits 0 on fleet's own errors (logged to syslog and {self.log_file}).\n"
                f"exec {shlex.quote(self.python)} {shlex.quote(self.prefix + '/fleet-agent.py')} {shlex.quote(args)}\n")

    def slurm_conf(self) -> str:
        return "".join(f"{OPS[op]}={self.prefix}/slurm-{op}\n" for op in OPS) + \
            "PrologFlags=Alloc   # the prolog runs when the job is allocated, before its batch script\n"

    def files(self) -> dict[str, tuple[bytes, int]]:
        """path -> (content, mode)"""
        out = {f"{self.prefix}/fleet-agent.py": (agent_script().encode(), 0o644),
               self.config_path: ((json.dumps(self.config(), indent=1) + "\n").encode(), 0o644)}
        for op in OPS:
            out[f"{self.prefix}/slurm-{op}"] = (self.wrapper(op).encode(), 0o755)
        return out


def apply(setup: NodeSetup) -> list[str]:
    """Write the files (as root: they are run by slurmd as root, so only root may change them)."""
    if os.geteuid() != 0:
        raise PermissionError("fleet slurm install --apply writes files slurmd runs as root: run it as root")
    Path(setup.prefix).mkdir(mode=0o755, parents=True, exist_ok=True)
    written = []
    for path, (content, mode) in setup.files().items():
        tmp = Path(path + ".tmp")
        tmp.write_bytes(content)
        tmp.chmod(mode)
        os.replace(tmp, path)
        written.append(path)
    return written
