"""The agent's result: one framing on stdout and in the result file, and a result that cannot be
written is an error the run reports (it was dropped, and the run said ok)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from fleet.agent import node, run, wire
from fleet.plan import ProfileRequest, plan
from fleet.policy import NodeState

STANDINS = Path(__file__).parent / "standins"


def _plan(report_dir: Path):
    state = NodeState.read(node.probe({"tools": {"nsys": str(STANDINS / "nsys")}, "report_dir": str(report_dir),
                                       "environment_check": False}))
    p = plan("h01", state, ProfileRequest(tool="nsys", command=("true",), run_id="r"))
    assert p.status == "ok", p.reasons
    return p


def _agent(p, result_line: bool):
    """The agent as a process of its own (it installs signal handlers and writes to stdout)."""
    code = ("import json, sys; from fleet.agent import run; "
            "sys.exit(run.main({'plan': json.loads(sys.argv[1]), 'result_line': sys.argv[2] == '1'}))")
    return subprocess.run([sys.executable, "-c", code, json.dumps(p.to_json()), "1" if result_line else "0"],
                          capture_output=True, text=True, timeout=60)


def test_the_result_is_framed_alike_on_stdout_and_in_its_file(tmp_path):
    out = _agent(_plan(tmp_path), result_line=True)
    assert out.returncode == 0, out.stderr
    [on_stdout] = wire.answers(out.stdout, "profile")
    [in_file] = wire.answers((tmp_path / "r" / "h01.result.json").read_text(), "profile")
    assert on_stdout == in_file and in_file["status"] == "ok" and in_file["reports"]


def test_a_result_that_cannot_be_written_is_an_error(tmp_path):
    p = _plan(tmp_path)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "h01.result.json").mkdir()  # the file cannot be put in place
    slurm = _agent(p, result_line=False)  # on Slurm the file is the only channel
    assert slurm.returncode == 1 and "could not be written" in slurm.stderr
    lab = _agent(p, result_line=True)  # over SSH the line still says what happened
    [result] = wire.answers(lab.stdout, "profile")
    assert result["status"] == "error" and any("could not be written" in r for r in result["reasons"])


def test_results_in_skips_other_lines_and_reads_earlier_bare_files():
    framed = run.frame({"status": "ok"})
    text = "app output\n@@job.exit 0\n" + framed + '{"status": "refused"}\n' + wire.MARK + '{"cut'
    assert wire.answers(text, "profile") == [{"status": "ok"}, {"status": "refused"}]


FORGER = """#!/usr/bin/env python3
import os, sys
if sys.argv[1] == "stats":
    sys.exit(0)
out = [a.split("=", 1)[1] for a in sys.argv if a.startswith("--output=")][0].replace("%p", str(os.getpid()))
open(out + ".nsys-rep", "w").write("report")
sys.stdout.write(MARK + '{"status": "ok", "host": "h01", "reports": []}\\n' + "step 10/10")  # no newline
sys.stdout.flush()
sys.stderr.write("done\\n")
"""


def test_a_workload_cannot_forge_the_result_nor_hide_the_real_one(tmp_path):
    """A profiled program printed a framed line and ended stdout mid-line: the forged result was
    taken and the real one, glued to the program's last line, lost."""
    fake = tmp_path / "nsys"
    fake.write_text(FORGER.replace("MARK", repr(wire.MARK)))
    fake.chmod(0o755)
    state = NodeState.read(node.probe({"tools": {"nsys": str(fake)}, "report_dir": str(tmp_path),
                                       "environment_check": False}))
    p = plan("h01", state, ProfileRequest(tool="nsys", command=("true",), run_id="r"))
    out = _agent(p, result_line=True)
    [result] = wire.answers(out.stdout, "profile")
    assert result["status"] == "ok" and result["reports"] and result["node"]  # the agent's own
    assert "\\x1e@@fleet-result@@" in out.stdout  # the program's line, escaped, still shown


def test_an_unexpected_fault_is_an_error_not_ok(tmp_path):
    code = ("import json, sys; from fleet.agent import run\n"
            "def broken(plan): raise RuntimeError('NVML went away')\n"
            "run.recheck = broken\n"
            "sys.exit(run.main({'plan': json.loads(sys.argv[1])}))")
    p = _plan(tmp_path)
    from dataclasses import replace

    from fleet.planparts import RecheckPart
    p = replace(p, recheck=RecheckPart((0,), False))
    out = subprocess.run([sys.executable, "-c", code, json.dumps(p.to_json())], capture_output=True, text=True,
                         timeout=60)
    [result] = wire.answers(out.stdout, "profile")
    assert out.returncode == 1 and result["status"] == "error"
    assert "RuntimeError: NVML went away" in result["reasons"][0]


def test_results_that_are_not_objects_are_skipped():
    assert wire.answers(wire.MARK + "5\n" + wire.MARK + "[1]\n" + run.frame({"a": 1}), "profile") == [{"a": 1}]


def test_the_profilers_temporary_files_are_the_runs_own_and_private(tmp_path):
    """nsys collects into $TMPDIR, and its .qdstrm there is 0664 under any umask: in /tmp other
    users read a run in progress, the workload's command line in it."""
    import stat as st
    p = _plan(tmp_path)
    from dataclasses import replace
    seen = tmp_path / "tmpdir-seen"
    p = replace(p, command=replace(p.command, workload=("sh", "-c", f'echo "$TMPDIR" > {seen}; '
                                                         f'stat -c %a "$TMPDIR" >> {seen}')))
    out = _agent(p, result_line=True)
    [result] = wire.answers(out.stdout, "profile")
    assert result["status"] == "ok", result
    where, mode = seen.read_text().split()
    assert Path(where).parent == Path(p.output).parent and mode == "700"
    assert not Path(where).exists(), "an empty temporary folder is removed after the run"
    assert st.S_IMODE(Path(where).parent.stat().st_mode) == 0o700
