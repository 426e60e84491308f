"""A node's fleet files for the Slurm prolog and epilog (config, jobs, state, log) and a job user,
as slurmd runs the hooks (as root, with slurmd's environment); kernel.perf_event_paranoid at 3
for a module's tests. The fixtures are registered for every test module by tests/conftest.py; a
module whose tests change the sysctl says `pytestmark = pytest.mark.usefixtures("paranoid_3")`."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import tempfile
from pathlib import Path

import pytest

from fleet.agent import slurmd
from tests.conftest import perf_event_paranoid
from tests.harness.procs import TENANT_USER
from tests.harness.sshd import TEST_USER, ensure_user

PARANOID = Path("/proc/sys/kernel/perf_event_paranoid")
OWNED = {"kernel.perf_event_paranoid": 2}


@pytest.fixture(scope="module")
def paranoid_3():
    with perf_event_paranoid("3"):  # the machine's value is put back however the tests end
        yield


@pytest.fixture
def node(tmp_path):
    """A node's fleet files (config, jobs, state, log) and a job user with a working directory."""
    user = pwd.getpwnam(ensure_user(TEST_USER).pw_name)
    ensure_user(TENANT_USER)
    root = Path(tempfile.mkdtemp(prefix="fleet-prolog-"))  # traversable by the job's user
    root.chmod(0o755)
    work = root / "work"
    work.mkdir()
    os.chown(work, user.pw_uid, user.pw_gid)
    config = {"owned_sysctls": OWNED, "jobs_dir": str(tmp_path / "jobs"), "state_dir": str(tmp_path / "state"),
              "log_file": str(tmp_path / "log" / "slurm.log"), "fail_closed": False, "pause_dcgm": False}
    (tmp_path / "node.json").write_text(json.dumps(config))
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_UID": str(user.pw_uid), "SLURM_JOB_GID": str(user.pw_gid),
           "SLURM_JOB_WORK_DIR": str(work), "SLURM_JOB_GPUS": "0"}
    yield {"config": config, "config_path": str(tmp_path / "node.json"), "env": env, "work": work, "user": user,
           "root": root, "log": tmp_path / "log" / "slurm.log"}
    slurmd.main({"op": "epilog", "config": str(tmp_path / "node.json")}, env)  # never leave a value held
    shutil.rmtree(root)


def write_request(node, doc, owner=None) -> Path:
    path = node["work"] / slurmd.REQUEST_NAME
    path.write_text(json.dumps(doc))
    pw = owner or node["user"]
    os.chown(path, pw.pw_uid, pw.pw_gid)
    return path


def run(node, op: str) -> int:
    return slurmd.main({"op": op, "config": node["config_path"]}, node["env"])


def python36(where: Path) -> Path:
    """Stands in for RHEL 8's /usr/bin/python3 (3.6): it starts and says its version, and fails
    on the agent as 3.6 did on a node (the message the issue recorded)."""
    path = where / "python3.6"
    path.write_text('#!/bin/sh\ncase "$*" in *"print("*) echo 3.6.8; exit 0 ;; esac\n'
                    'echo "SyntaxError: future feature annotations is not defined" >&2\nexit 1\n')
    path.chmod(0o755)
    return path
