"""fleet reads the user's -X words as nsys 2025.3 reads its command line, and refuses what nsys
would refuse before anything is touched: an ambiguous prefix (--dur), an unknown option, an
option given twice, an option without its value. fleet's list of nsys's switches
(fleet/wrapping/nsysopts.py) is held to the recorded `nsys profile --help`, and its verdicts to the
nsys stand-in, which reads that recording itself and replays what the real nsys said
(tests/fixtures/tools-2025.3-h200)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from fleet import policy
from fleet.plan import LabPart, Plan, ProfileRequest, plan
from fleet.userflags import profiler_args_error
from fleet.wrapping.nsysopts import NSYS_REPEATABLE, NSYS_SHORT, NSYS_SWITCHES, nsys_options
from fleet.slurm.launchers import unsupported

TOOLS = Path(__file__).parent / "fixtures" / "tools-2025.3-h200"
STANDIN = Path(__file__).parent / "standins" / "nsys"
HELP = (TOOLS / "nsys-profile-help" / "output.txt").read_text()


def state(perf_event_paranoid: int = 2) -> policy.NodeState:
    """A node as the agent describes it: two idle Hopper GPUs, nsys and ncu, a user at this level."""
    gpu = {"architecture": 9, "mig_mode": {"current": 0, "pending": 0}, "processes": []}
    return policy.NodeState.read({
        "euid": 1000, "uid": 1000, "perf_event_paranoid": perf_event_paranoid, "host_pid_namespace": True,
        "capabilities": {"sys_admin": False, "perfmon": False},
        "nvidia": {"driver_loaded": True, "profiling_admin_only": 0}, "nvml": {"available": True},
        "gpus": [{**gpu, "index": 0, "uuid": "GPU-a"}, {**gpu, "index": 1, "uuid": "GPU-b"}],
        "mps": {"control_daemon": [], "servers": []}, "dcgm": {"hostengine": [], "exporter": [], "listening": []},
        "tools": {"nsys": {"path": "/opt/nsys", "version": "2025.3.1"},
                  "ncu": {"path": "/opt/ncu", "version": "2025.3.1"}},
        "report_dir": {"path": "/var/tmp/fleet-alice", "writable": True, "free_bytes": 10**11,
                       "memory_backed": False}})
# A switch's heading line in the help: "\t-t, --trace=", "\t(Experimental) --syscall",
# "\t--nvtx-domain-[include|exclude]=" (two switches).
HEADING = re.compile(r"^\t(?:\(\w+\) )?(?:(-\w), )?--([\w-]+)(?:\[([\w|-]+)\])?", re.M)


def help_switches() -> dict[str, str | None]:
    found = {}
    for short, stem, alternatives in HEADING.findall(HELP):
        for name in ([stem + a for a in alternatives.split("|")] if alternatives else [stem]):
            found["--" + name] = short or None
    return found


def test_fleets_list_of_nsys_switches_is_the_recorded_help():
    recorded = help_switches()
    assert sorted(NSYS_SWITCHES) == sorted(recorded) and len(recorded) > 70
    assert NSYS_SHORT == {short: name for name, short in recorded.items() if short}
    # the switches the help says may be given more than once
    paragraphs = re.split(r"\n(?=\t(?:\(\w+\) )?-)", HELP)
    repeats = {m.group(2) for p in paragraphs if re.search(r"can be (given|specified|used) (more than once|multiple "
                                                           r"times)", p) for m in [HEADING.search(p)]}
    assert {"--" + name for name in repeats} == set(NSYS_REPEATABLE)


def recorded_words(case: str) -> tuple[str, ...]:
    """The options of a recorded `nsys profile` command line (before its application)."""
    words = shlex.split((TOOLS / case / "cmd.txt").read_text())
    words = words[words.index("profile") + 1:]
    app = next(i for i, w in enumerate(words) if w.startswith("/bin/"))
    return tuple(words[:app])


# (words, refused by nsys 2025.3): the recorded command lines, and spellings beside them.
CASES = [(recorded_words(case), case != "nsys-option-prefix-output")
         for case in sorted(p.name for p in TOOLS.glob("nsys-option-*"))] + [
    (("--duration=3", "-d", "9"), True), (("-d3",), False), (("--du=3",), True), (("--durat", "3"), True),
    (("--stop-on=true", "-snone"), False), (("--cpuctx=none",), False),
    (("--export=sqlite", "--export", "json"), False),
    (("--trace=cuda", "--stats=false"), False), (("-z", "1"), True), (("--trace",), True), (("--capture=nvtx",), True),
    (("--gpu-metrics-dev=all", "--gpu-metrics-devices=0"), True), (("-Y", "true", "--start-later=false"), True),
]


@pytest.mark.parametrize("words,refused", CASES)
def test_fleet_refuses_what_nsys_refuses(words, refused, tmp_path):
    """fleet's verdict, the stand-in's (the recorded nsys's), and what the recordings say, agree."""
    words = tuple(re.sub(r"/tmp/fleet-check\.\w+/reco", str(tmp_path), w) for w in words)  # the recording's folder
    why = nsys_options(words)[1]
    assert (why is not None) == refused, why
    standin = subprocess.run([str(STANDIN), "profile", *words, "--", "true"], cwd=tmp_path, capture_output=True,
                             text=True, timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)})
    assert (standin.returncode != 0) == refused, standin.stderr
    if refused:
        assert why.startswith("nsys 2025.3 refuses ") and "\n" not in why


def test_each_refusal_says_what_nsys_would_object_to_in_one_line():
    assert nsys_options(("--dur=1",))[1] == \
        "nsys 2025.3 refuses --dur=1: ambiguous, it matches --duration and --duration-frames"
    assert nsys_options(("-t", "osrt", "--trace", "osrt"))[1] == \
        "nsys 2025.3 refuses --trace given twice (-t osrt, --trace osrt): give it once"
    assert "refuses --no-such-option: it has no such option" in nsys_options(("--no-such-option",))[1]
    assert "refuses --trace without its value" in nsys_options(("--trace",))[1]
    assert [(n, v) for n, v, _ in nsys_options(("--out", "x", "-tcuda", "--stop-on=true"))[0]] == [
        ("--output", "x"), ("--trace", "cuda"), ("--stop-on-exit", "true")]
    # fleet's own objections come after nsys's: a word nsys cannot read names no option of fleet's
    assert profiler_args_error("nsys", ("--o=x",)).startswith("nsys 2025.3 refuses --o=x: ambiguous")
    assert profiler_args_error("nsys", ("--out=x",)).startswith("-X -o / --output is fleet's")
    assert profiler_args_error("ncu", ("--dur=1",)) is None  # ncu's options are not nsys's


def test_the_planned_nsys_command_is_one_nsys_takes_whatever_the_user_gave(tmp_path):
    """fleet's own flags (--output, --sample/--cpuctxsw=none where sampling is off, --duration for
    the timeout) beside the user's choice of the same: never one option twice, as the stand-in
    (what nsys 2025.3 did) accepts it."""
    for user in ((), ("--sample=process-tree",), ("-s", "none"), ("--cpuctx=process-tree",), ("-d", "9"),
                 ("--duration=9", "--trace=osrt"), ("--delay=1",), ("--kill", "none")):
        for paranoid in (2, 4):
            p = plan("h", state(perf_event_paranoid=paranoid),
                     ProfileRequest(tool="nsys", command=("true",), run_id="r", profiler_args=user, lab=LabPart(timeout=5)))
            flags = [f"--output={tmp_path}/r" if f.startswith("--output=") else f for f in p.command.fleet_flags]
            words = (*flags, *p.command.user_flags)
            assert nsys_options(words)[1] is None, words
            done = subprocess.run([str(STANDIN), "profile", *words, "--", "true"], cwd=tmp_path, capture_output=True,
                                  text=True, timeout=60, env={**os.environ, "TMPDIR": str(tmp_path)})
            assert done.returncode == 0, (words, done.stderr)
            (tmp_path / "r.nsys-rep").unlink()


def test_nsys_runs_in_a_session_of_the_run_s_own_and_the_user_s_named_session_wins():
    """A yield to a newcomer stops a GPU-metrics run through nsys's session (fleet.agent.nsyssession):
    the plan names it, once; a session the user named with -X is the one stopped; under a launcher
    or in a container there is none (each rank's nsys, or the nsys inside, is not reached by a
    `nsys stop` of the agent's)."""
    def planned(profiler_args=(), **lab):
        return plan("gpu01", state(), ProfileRequest(tool="nsys", command=("app",), run_id="20261206-120000-ab12",
                                                     gpu_metrics=True, profiler_args=profiler_args, lab=LabPart(**lab)))
    p = planned()
    assert p.session == "fleet-20261206-120000-ab12-gpu01"
    assert "--session-new=fleet-20261206-120000-ab12-gpu01" in p.command.fleet_flags
    assert "--session-new=fleet-20261206-120000-ab12-gpu01" in p.to_json()["argv"]
    mine = planned(("--session-new=mine",))
    assert mine.session == "mine" and not [f for f in mine.command.fleet_flags if f.startswith("--session-new")]
    assert nsys_options((*mine.command.fleet_flags, *mine.command.user_flags))[1] is None  # once, as nsys takes it
    assert planned(docker_image="nvcr.io/nvidia/pytorch:25.01-py3").session is None
    # a session the user names inside a container is not one `nsys stop` on the node reaches
    assert planned(("--session-new=mine",), docker_image="nvcr.io/nvidia/pytorch:25.01-py3").session is None
    # every nsys the agent reaches has one: Ctrl-C's "leave the workload running" stops it too
    plain = plan("gpu01", state(), ProfileRequest(tool="nsys", command=("app",), run_id="r"))
    assert plain.session == "fleet-r-gpu01" and "--session-new=fleet-r-gpu01" in plain.command.fleet_flags
    assert Plan.from_json(p.to_json()).session == p.session  # as the plan reaches the agent


def test_the_plan_on_a_node_refuses_them_too():
    p = plan("h", state(), ProfileRequest(tool="nsys", command=("app",), run_id="r", profiler_args=("--dur=1",)))
    assert p.status == "refused" and p.reasons[0].startswith("nsys 2025.3 refuses --dur=1")


def test_rays_option_words_are_checked_as_ray_passes_them_to_nsys():
    """Ray's _nsight options: a one-letter key becomes -K VALUE, a longer one --KEY=VALUE."""
    assert unsupported("ray", "nsys", ("t=cuda,nvtx", "stats=true")) is None
    assert "fleet's" in unsupported("ray", "nsys", ("o=/tmp/elsewhere",))
    assert unsupported("ray", "nsys", ("dur=1",)).startswith("nsys 2025.3 refuses --dur=1: ambiguous")
    assert "given twice" in unsupported("ray", "nsys", ("s=none", "sample=none"))


def test_the_command_line_refuses_them_before_anything_on_either_path(tmp_path):
    """Exit 2 and one line, nothing touched: on lab servers before any host is reached, on Slurm
    before the login node is asked anything."""
    from tests.conftest import run_fleet

    marker = tmp_path / "ran"
    for where in (("--hosts", "localhost"), ("--partition", "gpu")):
        for words, said in ((("-X", "--dur=1"), "fleet: nsys 2025.3 refuses --dur=1: ambiguous, it matches "
                                                "--duration and --duration-frames\n"),
                            (("-X", "-t", "-X", "osrt", "-X", "--trace=cuda"), "fleet: nsys 2025.3 refuses --trace "
                                                                              "given twice (-t osrt, --trace=cuda)")):
            out = run_fleet("profile", "--store", str(tmp_path / "store"), *where, *words, "--", "touch", str(marker))
            assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith(said), out.stderr
    assert not marker.exists() and not (tmp_path / "store").exists()


def test_a_playbook_with_options_nsys_refuses_is_a_usage_error_at_load(tmp_path):
    from fleet.nightly.playbook import PlaybookError, load
    from tests.conftest import run_fleet

    path = tmp_path / "p.yaml"
    path.write_text("target: {hosts: h01}\ncommand: [a]\nprofiler_args: [--trace=cuda, --dur=1]\n")
    with pytest.raises(PlaybookError) as e:
        load(path)
    assert str(e.value) == (f"{path}:3: nsys 2025.3 refuses --dur=1: ambiguous, it matches --duration and "
                            "--duration-frames")
    out = run_fleet("run", str(path), "--dry-run")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "refuses --dur=1" in out.stderr
