"""Exit statuses: the documented table is fleet/exitcodes.py's, and the login node's status is 3."""

from __future__ import annotations

import re
import socket

from fleet import exitcodes
from tests.conftest import REPO, run_fleet


def documented_statuses() -> dict[int, str]:
    """The user guide's table of exit statuses: status -> meaning."""
    text = (REPO / "docs" / "user-guide.md").read_text()
    section = text.split("\n## Exit statuses\n", 1)[1].split("\n## ", 1)[0]
    return {int(m[1]): m[2] for m in re.finditer(r"^\| (\d+) \| (.+) \|$", section, re.M)}


def test_the_user_guide_documents_every_exit_status_and_no_other():
    defined = {v: k for k, v in vars(exitcodes).items() if k.isupper() and isinstance(v, int)}
    documented = documented_statuses()
    assert sorted(documented) == sorted(defined), (documented, defined)
    assert "Ctrl-C" in documented[exitcodes.INTERRUPTED] and "login node" in documented[exitcodes.UNREACHABLE]


def closed_port() -> int:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unreachable_slurm_login_node_exits_3_having_submitted_nothing(tmp_path):
    inventory = tmp_path / "cluster.yaml"
    inventory.write_text("all:\n  children:\n    hpc:\n      vars:\n        slurm_login: login1\n"
                         f"      hosts:\n        login1:\n          ansible_host: 127.0.0.1\n"
                         f"          ansible_port: {closed_port()}\n")
    out = run_fleet("-i", str(inventory), "profile", "--partition", "gpu", "--store", str(tmp_path / "store"),
                    "--", "true")
    assert out.returncode == exitcodes.UNREACHABLE, out.stderr
    assert "login1 (login node) unreachable" in out.stderr and "Traceback" not in out.stderr
