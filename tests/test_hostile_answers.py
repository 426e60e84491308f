"""What comes back from a node is data: a node that lies about its reports, sends a malformed
answer, or goes silent fails alone, with the reason, and takes nothing of the controller's.

Real sshd hosts; each hostile node's ``ansible_python_interpreter`` is a script on that node that
runs the real agent for the probe and answers the profile round trip with what a hostile (or
broken) node would send, framed as the agent frames it.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fleet import exitcodes
from fleet.agent import wire
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness.procs import end_frozen
from tests.harness.sshd import SSHCluster

# On the node: the probe is the real agent's; the profile round trip answers with the file
# beside this script (after reading the agent from stdin, as the real one does).
HOSTILE_PYTHON = """#!/bin/sh
here=$(dirname "$0")
case "$3:$4" in
  -:*|*:-ahead) cat >/dev/null;  # the profile round trip: its plan follows the agent on stdin echo $$ > "$here/profile.pid"
                        [ -f "$here/silent" ] && exec sleep 600
                        cat "$here/answer" ;;
  *'"mode":'*) exec /usr/bin/python3 "$@" ;;
  *) [ -f "$here/probe" ] && { cat >/dev/null; cat "$here/probe"; exit 0; }  # the probe: no mode named
     exec /usr/bin/python3 "$@" ;;
esac
"""


@pytest.fixture(scope="module")
def lab():
    """h01 answers as told (hostile), h02 is an honest node with the stand-in nsys."""
    with SSHCluster(2) as c:
        node = c.scratch("hostile")
        (node / "python3").write_text(HOSTILE_PYTHON)
        (node / "python3").chmod(0o755)
        c.hosts[0].vars["ansible_python_interpreter"] = str(node / "python3")
        c.hosts[1].vars["ansible_python_interpreter"] = "/usr/bin/python3"
        c.inventory_vars = {"nsys_path": str(c.standins() / "nsys")}
        c.write_client_files()
        yield {"c": c, "node": node, "store": c.dir / "store"}  # the store is the user's own: not a shared folder


@pytest.fixture(autouse=True)
def fresh(lab):
    for name in ("answer", "probe", "silent", "profile.pid"):
        (lab["node"] / name).unlink(missing_ok=True)
    yield
    pid_file = lab["node"] / "profile.pid"
    if pid_file.exists() and pid_file.read_text().strip():
        try:  # the silent node's sleep, started by this test
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


def answer(lab, body: dict, kind: str = "profile", name: str = "answer") -> None:
    (lab["node"] / name).write_text(wire.frame(kind, body))
    (lab["node"] / name).chmod(0o644)


def profile(lab, *args: str):
    out = run_fleet("profile", "--store", str(lab["store"]), "--json", *args, env=lab["c"].env(), timeout=180)
    return out, fleet_json(out.stdout)


def host(doc: dict, name: str) -> dict:
    return next(h for h in doc["hosts"] if h["host"] == name)


def file_entry(path: Path) -> dict:
    data = path.read_bytes()
    return {"path": str(path), "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_a_node_naming_a_file_outside_its_run_folder_gets_nothing_fetched(lab):
    """A node's result named /etc/passwd (with its true size and sha256): fleet fetched it as a
    "verified" report."""
    answer(lab, {"status": "ok", "reports": [file_entry(Path("/etc/passwd"))]})
    out, doc = profile(lab, "--hosts", "h01", "--", "true")
    h01 = host(doc, "h01")
    assert out.returncode == exitcodes.FAILED and h01["status"] == "failed", out.stderr
    assert "'/etc/passwd' is not in the run's folder on the node" in h01["error"]
    assert not h01["reports"][0]["verified"] and not h01["reports"][0]["stored"]
    assert not list(Path(lab["store"]).rglob("passwd")), "nothing of it reached the store"


def test_a_malformed_result_fails_that_host_alone_and_the_run_ends(lab):
    """notes as a number gave a traceback at the end, and the manifest stayed "running"."""
    answer(lab, {"status": "ok", "notes": 5, "reports": []})
    out, doc = profile(lab, "--hosts", "h01,h02", "--", "true")
    h01, h02 = host(doc, "h01"), host(doc, "h02")
    assert "Traceback" not in out.stderr
    assert h01["status"] == "failed" and "malformed" in h01["error"] and "notes" in h01["error"]
    assert h02["status"] == "ok" and h02["reports"][0]["verified"]
    assert doc["status"] == "partial" and out.returncode == exitcodes.PARTIAL
    shown = fleet_json(run_fleet("reports", "show", doc["run_id"], "--json", "--store", str(lab["store"]),
                                 env=lab["c"].env()).stdout)
    assert shown["status"] == "partial", "the stored manifest is not left running"


def test_a_report_entry_without_its_size_is_not_ok(lab):
    """A report entry without its size or type gave "ok", run complete, exit 0, with no report."""
    entry = {"path": "/var/tmp/x.nsys-rep", "sha256": "0" * 64}
    answer(lab, {"status": "ok", "reports": [entry]})
    out, doc = profile(lab, "--hosts", "h01", "--", "true")
    assert host(doc, "h01")["status"] == "failed" and "reports[0].size: missing" in host(doc, "h01")["error"]
    assert out.returncode != exitcodes.OK


def test_a_wrong_typed_probe_answer_fails_that_host_and_the_healthy_one_is_profiled(lab):
    """One wrong-typed field in one node's probe answer gave a traceback, and no host was profiled."""
    answer(lab, {"host": "h01", "gpus": [{"index": "zero"}], "tools": {}}, kind="probe", name="probe")
    out, doc = profile(lab, "--hosts", "h01,h02", "--", "true")
    assert "Traceback" not in out.stderr
    h01 = host(doc, "h01")
    assert h01["status"] == "failed" and "gpus[0].index" in h01["error"]
    assert host(doc, "h02")["status"] == "ok" and out.returncode == exitcodes.PARTIAL
    probed = run_fleet("probe", "h01,h02", env=lab["c"].env())
    assert "Traceback" not in probed.stderr and "h01: the agent's probe answer is malformed" in probed.stderr


def test_a_silent_node_ends_unreachable_within_the_runs_bound(lab):
    """A node whose agent never answers hung the client forever, even with --timeout."""
    (lab["node"] / "silent").touch()
    out, doc = profile(lab, "--hosts", "h01", "--timeout", "1", "--finish-timeout", "2", "--", "true")
    h01 = host(doc, "h01")
    assert h01["status"] == "unreachable" and out.returncode == exitcodes.UNREACHABLE, out.stderr
    assert f"fleet gather {doc['run_id']}" in h01["error"]


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid``; one that ends while they are read is passed over."""
    children = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            children += [int(p) for p in (task / "children").read_text().split()]
    except OSError:  # gone, or its thread gone, while read
        pass
    return [d for c in children for d in [c, *_descendants(c)]]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def silenced(lab, tmp_path, config: str, *args: str) -> tuple[dict, int, float, str]:
    """``fleet profile --hosts h02 ARGS -- sleep 600`` under ssh_config lines ``config``; once the
    workload runs, the sshd serving h02's session (the test's own sshd's children, by pid) is
    stopped. Returns h02's entry, the exit status, the seconds it took from the workload's start
    (where --timeout counts from: fleet's own start, slow on a loaded machine, is not the bound's) and
    stderr."""
    c = lab["c"]
    ssh_config = tmp_path / "ssh_config"
    ssh_config.write_text("Host *\n" + config + c.ssh_config.read_text())
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(lab["store"]), "--json",
                             "--hosts", "h02", *args, "--", "sleep", "600"],
                            env={**env, **c.env(), "FLEET_SSH_CONFIG": str(ssh_config)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO)
    stopped: list[int] = []
    try:
        sshd = c.hosts[1].pid
        while not any(_cmdline(p).startswith(b"sleep\x00600") for p in _descendants(sshd)):
            assert proc.poll() is None and time.monotonic() < started + 60, "the workload never started"
            time.sleep(0.05)
        running = time.monotonic()
        for pid in _descendants(sshd):
            try:
                os.kill(pid, signal.SIGSTOP)
            except ProcessLookupError:  # ended since it was listed
                continue
            stopped.append(pid)
        out, err = proc.communicate(timeout=180)  # without a bound it waits for ever
        ended = time.monotonic() - running
    finally:
        end_frozen(proc, stopped)
    return host(fleet_json(out), "h02"), proc.returncode, ended, err


def test_a_node_gone_silent_without_keepalives_ends_unreachable_within_timeout_and_finish_timeout(lab, tmp_path):
    """With ``ServerAliveInterval 0`` in ssh_config, ``--timeout 5 --finish-timeout 10`` was still
    waiting after 100 s: the dead connection was awaited after the channel's close."""
    h02, code, ended, err = silenced(lab, tmp_path, "  ServerAliveInterval 0\n", "--timeout", "5",
                                     "--finish-timeout", "10")
    assert h02["status"] == "unreachable" and code == exitcodes.UNREACHABLE, (h02, err)
    assert ended < 20, f"ended after {ended:.0f} s"  # the acceptance's bound: --timeout + --finish-timeout + 5


def test_a_silent_node_with_no_timeout_and_keepalives_off_ends_after_fleets_keepalives(lab, tmp_path):
    """No ``--timeout``, and ssh_config's ``ServerAliveInterval 0`` (ssh's "no keepalives"): the
    0 counts as unset, so fleet's interval (30 s) with the config's count (1) calls the node
    unreachable after about 60 s, as the user guide says, instead of waiting for ever."""
    h02, code, ended, err = silenced(lab, tmp_path, "  ServerAliveInterval 0\n  ServerAliveCountMax 1\n")
    assert h02["status"] == "unreachable" and code == exitcodes.UNREACHABLE, (h02, err)
    assert ended < 150, f"ended after {ended:.0f} s"  # 30 s x (1 + 1), with room for a slow machine


def test_finish_timeout_needs_timeout(lab):
    out = run_fleet("profile", "--hosts", "h01", "--finish-timeout", "5", "--", "true", env=lab["c"].env())
    assert out.returncode == exitcodes.USAGE and "give --timeout too" in out.stderr


def test_a_probe_answer_past_its_bound_is_not_believed_and_the_healthy_host_goes_on(lab):
    """A 1 GB probe answer from one node took 2.1-3.2 GB of client memory."""
    (lab["node"] / "probe").write_text("")  # the forged probe streams instead: a file of 64 MiB of zeros
    big = lab["node"] / "probe"
    with open(big, "wb") as f:
        f.truncate(64 << 20)
    big.chmod(0o644)
    out, doc = profile(lab, "--hosts", "h01,h02", "--", "true")
    h01 = host(doc, "h01")
    assert h01["status"] == "failed" and "sent more than 16 MiB on stdout" in h01["error"], h01["error"]
    assert host(doc, "h02")["status"] == "ok" and out.returncode == exitcodes.PARTIAL


def test_a_command_longer_than_argv_takes_is_profiled(lab):
    """A 70k-character argument worked with exec and failed with profile ("Argument list too long")."""
    word = "x" * 70_000
    out, doc = profile(lab, "--hosts", "h02", "--", "sh", "-c", 'test "${#1}" = 70000', "sh", word)
    assert out.returncode == exitcodes.OK and host(doc, "h02")["status"] == "ok", out.stderr[-2000:]


def test_given_up_as_a_number_fails_that_host_alone_and_the_run_ends(lab):
    """`given_up` as a number gave a traceback at the end, and the manifest stayed "running"."""
    answer(lab, {"status": "ok", "given_up": 5, "reports": []})
    out, doc = profile(lab, "--hosts", "h01,h02", "--", "true")
    assert "Traceback" not in out.stderr
    h01 = host(doc, "h01")
    assert h01["status"] == "failed" and "given_up" in h01["error"], h01["error"]
    assert host(doc, "h02")["status"] == "ok" and out.returncode == exitcodes.PARTIAL


def test_doctor_names_a_wrong_typed_probe_answer_and_checks_the_healthy_host(lab):
    """The wrong-typed probe answer gave a traceback in doctor too."""
    answer(lab, {"host": "h01", "gpus": [{"index": "zero"}], "tools": {}}, kind="probe", name="probe")
    out = run_fleet("doctor", "h01,h02", env=lab["c"].env())
    assert "Traceback" not in out.stderr, out.stderr
    assert "h01: the agent's probe answer is malformed" in out.stdout + out.stderr, out.stdout + out.stderr
    assert "h02" in out.stdout


def test_a_refusal_reason_with_a_newline_is_one_line_on_the_hosts_status(lab):
    """The node's reasons become the host's status line (``h01: refused: ...``): a newline in one
    forged a line of fleet's own below it."""
    answer(lab, {"status": "refused", "reasons": ["x\nh09: ok"], "reports": []})
    out = run_fleet("profile", "--store", str(lab["store"]), "--hosts", "h01", "--", "true", env=lab["c"].env(),
                    timeout=180)
    said = out.stdout + out.stderr
    assert "Traceback" not in said and "x\\x0ah09: ok" in said, said
    assert not any(line.startswith("h09") for line in said.splitlines()), said


def test_a_nodes_result_strings_are_shown_escaped_by_profile(lab):
    """A hostile node's notes, reasons and errors printed raw in ``fleet profile``: an OSC title,
    an OSC 52 clipboard write and a CSI reached the user's terminal, and a newline forged a line."""
    hostile = "\x1b]0;owned\x07\x1b]52;c;cm0gLXJmIH4=\x07\x1b[2J\x9b31m"
    answer(lab, {"status": "ok", "notes": [f"note {hostile}", "forged\nh09: ok"], "reasons": [hostile],
                 "given_up": [hostile], "profiler_errors": [hostile], "reports": []})
    out = run_fleet("profile", "--store", str(lab["store"]), "--hosts", "h01,h02", "--", "true", env=lab["c"].env(),
                    timeout=180)
    assert "Traceback" not in out.stderr and "h02" in out.stdout + out.stderr, out.stderr
    for stream in (out.stdout, out.stderr):
        assert not any(c in stream for c in "\x1b\x07\x9b"), stream
    assert "note \\x1b]0;owned\\x07" in out.stdout + out.stderr
    assert "forged\\x0ah09: ok" in out.stdout + out.stderr  # a newline in a note: shown, not a host line of its own
    assert not any(line.startswith("h09") for line in (out.stdout + out.stderr).splitlines())


def test_thousands_of_short_notes_from_a_node_are_cut_and_say_so_in_the_store_and_on_the_terminal(lab):
    """Each note within its bound, and as many as the wire takes (9,000): stored whole, printed whole."""
    answer(lab, {"status": "ok", "notes": ["n"] * 9_000, "reports": []})
    out, doc = profile(lab, "--hosts", "h01", "--", "true")
    assert host(doc, "h01")["result"] is not None, json.dumps(host(doc, "h01"))
    notes = host(doc, "h01")["result"]["notes"]
    assert notes[:200] == ["n"] * 200 and notes[200:] == ["[cut: 8800 more]"], notes[195:]
    shown = run_fleet("profile", "--store", str(lab["store"]), "--hosts", "h01", "--", "true", env=lab["c"].env(),
                      timeout=180)
    said = shown.stdout + shown.stderr
    assert said.count("note:") == 201 and "note:     [cut: 8800 more]" in said, said[-2000:]


def test_a_60_mb_note_from_a_node_is_cut_and_says_so_in_the_store_and_on_the_terminal(lab):
    """A 60 MB note from a node was stored whole in the manifest and printed whole."""
    answer(lab, {"status": "ok", "notes": ["n" * 60_000_000, "short"], "reports": []})
    out, doc = profile(lab, "--hosts", "h01", "--", "true")
    notes = host(doc, "h01")["result"]["notes"]
    assert len(notes[0]) < 10_000 and notes[0].endswith("[cut: 59991808 more characters]"), notes[0][-80:]
    assert notes[1] == "short"
    manifest = next(Path(lab["store"]).rglob(f"{doc['run_id']}/manifest.json"))
    assert manifest.stat().st_size < 1 << 20
    shown = run_fleet("profile", "--store", str(lab["store"]), "--hosts", "h01", "--", "true", env=lab["c"].env(),
                      timeout=180)
    said = shown.stdout + shown.stderr
    assert len(said) < 1 << 20 and "[cut: 59991808 more characters]" in said, said[-2000:]


def test_output_without_newlines_is_relayed_as_it_comes_and_an_endless_result_is_not_believed(monkeypatch):
    """Workload output with no newlines grew quadratically (128 MB: 134 s, 692 MB of client
    memory): it was held whole until a newline came. Now it is relayed in pieces of at most
    LINE_LIMIT (and a chunk) as it arrives, and the agent's result line has its own bound."""
    from fleet.lab import sink as lab_sink

    written = []
    sink = lab_sink.LineSink("h01", False, lambda stream, text: written.append(len(text)))
    chunk = b"x" * 65536
    for _ in range(64):  # 4 MiB, no newline
        sink("stderr", chunk)
        assert len(sink.partial["stderr"]) <= lab_sink.LINE_LIMIT
    assert sum(written) >= 63 * 65536 and max(written) <= lab_sink.LINE_LIMIT + len(chunk) + 1  # a piece a chunk
    monkeypatch.setattr(lab_sink, "RESULT_LIMIT", 1 << 20)
    sink("stdout", wire.MARK.encode())
    for _ in range(20):  # a result line past its bound
        sink("stdout", chunk)
    assert sink.result is None and "the agent's result is over 1 MiB" in sink.malformed
    assert len(sink.partial["stdout"]) <= 1 << 20


def test_a_look_at_a_workload_left_running_reads_only_its_own_shape():
    """fleet jobs' look at a host (fleet.lab.leftrunning): the boot's id, then "PID STARTTIME" lines;
    anything else is not read, and a pid whose start time or boot differs is not the workload."""
    from fleet.lab.leftrunning import LeftRunning, read_look

    boot = "0f6b5a4e-2d1c-4b7a-9e8f-1a2b3c4d5e6f"
    left = LeftRunning("r", "gpu01", [41, 42], [1000, 2000], boot, "/x/gpu01.workload.out")
    look = "fleet-left-running-look\n"
    assert read_look(f"motd of a .bashrc\n{look}{boot}\n41 1000\n", left) == "running"
    assert read_look(f"{look}{boot}\n41 1001\n42 2001\n", left) == "ended"  # the pids given to later processes
    assert read_look(f"{look}{boot.replace('0f', '1f')}\n41 1000\n", left) == "ended"  # another boot
    assert read_look(f"{look}{boot}\n", left) == "ended"
    for hostile in ("", f"{boot}\n41 1000", f"{look}not a boot id\n41 1000", f"{look}{boot}\n41 1000; rm -rf /",
                    f"{look}{boot}\n41\n", f"{look}{boot}\n-1 5"):
        with pytest.raises(ValueError):
            read_look(hostile, left)
