"""fleet top holds what a node streams as data: a host whose look sends a line past its bound, or a
sample not of the look's shape, has its session ended and says why, while the other hosts go on;
a string another user set (a process's command line) reaches the screen with its control
characters shown, never obeyed.

Real sshd hosts whose GPUs are the simulated NVML. h01's ``ansible_python_interpreter`` is a script
that relays the real agent's first sample and then sends what the test left beside it, and then
nothing more while its session stays open: a look that waited on it would never end.
"""

from __future__ import annotations

import os
import signal

import pytest

from fleet.agent import wire
from tests.conftest import fleet_json_lines, run_fleet
from tests.harness import fakenvml
from tests.harness.procs import TENANT_USER, descendants, spawn, stop
from tests.harness.sshd import SSHCluster, ensure_user

HOSTILE_PYTHON = """#!/bin/sh
here=$(dirname "$0")
case "$3" in
  *'"mode":"look"'*)
    /usr/bin/python3 "$@" | { IFS= read -r first; printf '%s\\n' "$first"; cat "$here/tail"; exec cat >/dev/null; } ;;
  *) exec /usr/bin/python3 "$@" ;;
esac
"""
# Another user's process named to set the terminal's title and write its clipboard (OSC 0, OSC 52).
ESCAPES = "\x1b]0;owned\x07\x1b]52;c;cHduZWQ=\x07"


@pytest.fixture(scope="module")
def hosts():
    ensure_user(TENANT_USER)
    c = SSHCluster(2)
    lib = fakenvml.build(c.dir / "fakenvml")
    tenant = spawn(TENANT_USER, ["sh", "-c", "sleep 600; :", ESCAPES])  # `; :` keeps sh itself the process
    node = c.scratch("hostile")
    (node / "python3").write_text(HOSTILE_PYTHON)
    (node / "python3").chmod(0o755)
    c.hosts[0].vars["ansible_python_interpreter"] = str(node / "python3")
    for h, processes in zip(c.hosts, ([], [{"pid": tenant.pid, "mem": 698351616, "sm": 90}])):
        path = c.dir / f"scenario-{h.name}.txt"
        fakenvml.write_scenario(path, {"gpus": [{**fakenvml.gpm_recorded("idle"), "processes": processes}]})
        h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in fakenvml.env(lib, path).items())
    try:
        c.start()
        yield {"c": c, "node": node, "tenant": tenant.pid}
    finally:
        _end_sessions(c)
        stop([tenant])
        c.stop()


def _end_sessions(c: SSHCluster) -> None:
    """The hostile node's relays (and the agent under them) live on in their sessions: killed by pid,
    only those below this test's own sshd."""
    for pid in descendants(c.hosts[0].pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def tail(hosts):
    path = hosts["node"] / "tail"

    def write(data: bytes) -> None:
        path.write_bytes(data)
        path.chmod(0o644)
    yield write
    _end_sessions(hosts["c"])


def _look(hosts) -> tuple:
    r = run_fleet("top", "--json", "--count", "3", "--interval", "0.3", "all", env=hosts["c"].env(), timeout=120)
    lines = fleet_json_lines(r.stdout, "top")
    return r, [d for d in lines if d["host"] == "h01"], [d for d in lines if d["host"] == "h02"]


def test_a_line_past_its_bound_ends_that_hosts_look_and_the_other_host_goes_on(hosts, tail):
    tail(b"x" * (5 << 20))  # 5 MiB and no newline
    r, h01, h02 = _look(hosts)
    assert r.returncode == 1, r.stderr  # the look ended: it did not wait on h01's open session
    assert h01[-1]["error"] == "h01 sent a line of more than 4 MiB: its look is not believed", h01[-1]
    assert [d["seq"] for d in h02] == [0, 1, 2] and not any(d["error"] for d in h02), h02


def test_a_sample_not_of_the_looks_shape_ends_that_hosts_look(hosts, tail):
    tail(wire.frame("look", {"seq": "one", "gpus": [{"index": 0}]}).encode())
    r, h01, h02 = _look(hosts)
    assert r.returncode == 1, r.stderr
    assert h01[0]["seq"] == 0 and h01[0]["error"] is None  # the real agent's first sample was believed
    assert h01[-1]["error"].startswith("its look is malformed: seq"), h01[-1]
    assert [d["seq"] for d in h02] == [0, 1, 2], h02


def test_a_command_line_another_user_set_is_shown_with_its_escapes_visible(hosts):
    r = run_fleet("top", "--once", "h02", env=hosts["c"].env(), timeout=120)
    assert r.returncode == 0, r.stderr
    assert f"{TENANT_USER}:{hosts['tenant']}" in r.stdout, r.stdout
    assert "\x1b" not in r.stdout + r.stderr and "\x07" not in r.stdout
    assert "\\x1b]0;owned\\x07" in r.stdout, r.stdout
    as_json = run_fleet("top", "--once", "--json", "h02", env=hosts["c"].env(), timeout=120)
    [p] = fleet_json_lines(as_json.stdout, "top")[0]["gpus"][0]["processes"]
    assert p["command"] == f"sh -c sleep 600; : {ESCAPES}"  # the data itself, for a program: JSON escapes it



def test_a_samples_strings_are_one_line_each_on_the_screen_and_a_wrong_typed_throttle_is_shown(hosts, tail):
    """The wire holds a sample's shape, not every item's: a throttle reason that is a number, or a
    string with a newline that would forge a GPU's row, is shown as data in its own cell."""
    forged = "hot\nh09  0  0.0/0.0  free  ok"
    gpu = {"index": 0, "processes": [], "activity": {"source": "utilization", "utilization": 5},
           "conditions": {"throttle": [7, forged], "power_w": 100}}
    tail(wire.frame("look", {"seq": 1, "gpus": [gpu]}).encode())
    r = run_fleet("top", "--count", "2", "--interval", "0.3", "h01", env=hosts["c"].env(), timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "7,hot\\x0ah09" in r.stdout, r.stdout
    assert not any(line.startswith("h09") for line in r.stdout.splitlines()), r.stdout


def test_the_looks_arguments_are_held_to_their_bounds_and_types():
    """The node bounds what the controller asks of its look, read once: an interval below or above
    its bounds is brought within them, the lifetime is at least one interval and at most the cap,
    and a count of samples that is not a whole number (a bool, a string) reads as none."""
    from fleet.agent.look import INTERVAL_BOUNDS, LIFETIME_MAX, LookArgs

    fast = LookArgs.read({"interval": 0, "lifetime": 1e9, "samples": True})
    assert (fast.interval, fast.lifetime, fast.samples) == (INTERVAL_BOUNDS[0], LIFETIME_MAX, None)
    odd = LookArgs.read({"interval": "soon", "lifetime": [], "samples": "3"})
    assert (odd.interval, odd.lifetime, odd.samples) == (1.0, LIFETIME_MAX, None)
    slow = LookArgs.read({"interval": 1e9, "lifetime": 0, "samples": 2})
    assert (slow.interval, slow.lifetime, slow.samples) == (INTERVAL_BOUNDS[1], INTERVAL_BOUNDS[1], 2)
