"""Strings others set never drive the user's terminal: a process name another account chose
(``prctl``), a GPU's bus id in an export the job wrote, the notes, reasons and paths a node's
answer carries. Each is planted with an OSC title, an OSC 52 clipboard write, a CSI and a C1
CSI, and each command's human output is searched for a raw ESC, BEL or C1 byte: none may reach
stdout or stderr; the field itself is shown, its control characters escaped (``\\x1b``)."""

from __future__ import annotations

import json
import re
import sqlite3
from contextlib import closing

import pytest

from fleet.cli.terminal import visible
from tests.conftest import run_fleet
from tests.harness import fakenvml
from tests.harness import nsys_export as nx
from tests.harness.manifests import V1, put_in_store
from tests.harness.procs import TENANT_USER, local_env, spawn, stop
from tests.harness.rank_plants import eight
from tests.harness.rank_store import RUN, file_run
from tests.harness.sshd import ensure_user

TITLE = "\x1b]0;owned\x07"                 # OSC 0: the window's title
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"    # OSC 52: the clipboard
CLEAR = "\x1b[2J\x1b[H"                     # CSI: clear the screen
C1 = "\x9b31m"                              # CSI as one C1 character
HOSTILE = TITLE + CLIPBOARD + CLEAR + C1
RAW = re.compile("[\x1b\x07\x80-\x9f]")
FORGED_NOTE = "note\n  h09  ok"  # a host line of fleet's own, were the newline obeyed
FORGED_NAME = "x\nh09: GPU 7"  # 15 bytes, as prctl keeps: a line of its own if the newline were obeyed


def assert_nothing_obeyed(out) -> None:
    for stream in (out.stdout, out.stderr):
        found = RAW.search(stream)
        assert found is None, f"a raw {found.group()!r} reaches the terminal: {stream!r}"


def test_visible_shows_every_control_character_and_keeps_the_text():
    assert visible(HOSTILE) == "\\x1b]0;owned\\x07\\x1b]52;c;cm0gLXJmIH4=\\x07\\x1b[2J\\x1b[H\\x9b31m"
    assert visible("a\nb\tc\r") == "a\\x0ab\\x09c\\x0d" and visible("a\nb\tc\r", lines=True) == "a\nb\tc\\x0d"
    assert visible("GPU \u202eevil\u2066") == "GPU \\u202eevil\\u2066" and visible("ünïcode ✓") == "ünïcode ✓"


PRCTL_NAME = ("import ctypes, sys, time; ctypes.CDLL(None).prctl(15, sys.argv[1].encode('latin-1'), 0, 0, 0); "
              "time.sleep(300)")


@pytest.mark.parametrize("name", [TITLE, "\x1b]52;c;cHdu\x07", FORGED_NAME])
def test_a_process_name_another_account_chose_is_shown_escaped_by_probe_and_doctor(tmp_path, name):
    """An unprivileged user named its GPU process with an OSC sequence; ``fleet probe`` printed it raw."""
    ensure_user(TENANT_USER)
    tenant = spawn(TENANT_USER, ["python3", "-c", PRCTL_NAME, name])
    try:
        for _ in range(100):
            if open(f"/proc/{tenant.pid}/comm", encoding="latin-1").read().strip() == name:
                break
            __import__("time").sleep(0.05)
        scenario = tmp_path / "gpus.txt"
        fakenvml.write_scenario(scenario, {"gpus": [{"index": 0, "processes": [
            {"kind": "compute", "pid": tenant.pid, "mem": 10**9}]}]})
        env = local_env(fakenvml.env(fakenvml.build(tmp_path / "lib"), scenario))
        probe = run_fleet("probe", env=env)
        assert probe.returncode == 0, probe.stderr
        assert_nothing_obeyed(probe)
        assert visible(name) in probe.stdout and TENANT_USER in probe.stdout
        assert not any(line.startswith("h09") for line in probe.stdout.splitlines()), probe.stdout
        doctor = run_fleet("doctor", env=env)
        assert_nothing_obeyed(doctor)
    finally:
        stop([tenant])


def test_an_exports_gpu_bus_id_is_shown_escaped_by_reports_ranks(tmp_path):
    """An export's busLocation reached the terminal raw, with OSC title and OSC 52 sequences."""
    root = file_run(tmp_path, nx.Scenario(eight()), conditions=False)  # no NVML index: the bus id is shown
    for path in root.rglob("rank*.sqlite"):
        with closing(sqlite3.connect(path)) as db, db:
            db.execute("UPDATE TARGET_INFO_GPU SET busLocation = ?, name = ?", (HOSTILE, HOSTILE))
    out = run_fleet("reports", "ranks", RUN, "--sync-range", "sync", "--store", str(root))
    assert out.returncode == 0, out.stderr
    assert_nothing_obeyed(out)
    assert visible(HOSTILE) in out.stdout


def test_a_nodes_strings_in_a_stored_run_are_shown_escaped_by_reports_show_and_ls(tmp_path):
    """A hostile node's result strings (notes, why it is missing, what it gave up, a report's
    path) printed raw in ``reports show``."""
    doc = json.loads((V1 / "lab-partial.json").read_text())
    for h in doc["hosts"]:
        h["missing_why"] = f"lost {HOSTILE}"
        h["given_up"] = [f"sampling {HOSTILE}", FORGED_NOTE]
        h["gpu"], h["driver"], h["tool_version"] = HOSTILE, HOSTILE, HOSTILE
        h["result"] = {**(h.get("result") or {}), "notes": [f"note {HOSTILE}", FORGED_NOTE],
                       "profiler_errors": [HOSTILE]}
        for r in h["reports"]:
            r["remote"] = f"/var/tmp/{HOSTILE}.ncu-rep"
    doc["hosts"][0]["host"] = f"h02{HOSTILE}"
    put_in_store(tmp_path, doc)
    assert run_fleet("reports", "reindex", "--store", str(tmp_path)).returncode == 0
    for args in (("reports", "show", doc["run_id"]), ("reports", "ls"), ("reports", "stats", doc["run_id"]),
                 ("reports", "open", doc["run_id"], "nohost"), ("reports", "ranks", doc["run_id"])):
        out = run_fleet(*args, "--store", str(tmp_path), env={"PATH": "/usr/bin:/bin"})
        assert "Traceback" not in out.stderr, (args, out.stderr)
        assert_nothing_obeyed(out)
    shown = run_fleet("reports", "show", doc["run_id"], "--store", str(tmp_path))
    assert f"lost {visible(HOSTILE)}" in shown.stdout and f"gave up: sampling {visible(HOSTILE)}" in shown.stdout
    assert "gave up: note\\x0a  h09  ok" in shown.stdout, shown.stdout  # one line, the newline shown
    assert not any(line.lstrip().startswith("h09") for line in shown.stdout.splitlines()), shown.stdout
