"""The stand-in profilers replay what the real ones did on an H200 test machine
(tests/fixtures/nsys-2025.3-h200/): the same files, empty where nsys left them empty."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest

from fleet.agent.strays import GENERATING
from fleet.store import kernel_rows
from tests.harness.procs import cmdline, descendants

STANDINS = Path(__file__).parent / "standins"
REAL = Path(__file__).parent / "fixtures" / "nsys-2025.3-h200"
SUMMARIES = ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum")


def nsys(*args, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([str(STANDINS / "nsys"), *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(cwd), **(env or {})})


def stats(report: Path) -> dict[str, str]:
    base = str(report)[: -len(".nsys-rep")]
    done = nsys("stats", "-q", "--report", ",".join(SUMMARIES), "--format", "csv", "--output", base, str(report),
                cwd=report.parent)
    assert done.returncode == 0, done.stderr
    return {name: Path(f"{base}_{name}.csv").read_text() for name in SUMMARIES}


def test_stats_write_the_real_headers_and_rows_shaped_as_nsys_writes_them(tmp_path):
    app = 'echo fleet-check >> "$STANDIN_NVTX_LOG"; sleep 0.1'
    assert nsys("profile", "--trace=cuda,nvtx", "-o", "r", "--", "sh", "-c", app, cwd=tmp_path).returncode == 0
    ours = stats(tmp_path / "r.nsys-rep")
    for name in SUMMARIES:
        real = list(csv.reader(open(REAL / f"with-nvtx_{name}.csv", newline="")))
        mine = list(csv.reader(io.StringIO(ours[name])))
        assert mine[0] == real[0] and len(mine) > 1, name  # the header, and rows
        assert all(len(r) == len(real[0]) for r in mine[1:]), name
    real_range = (REAL / "with-nvtx_nvtx_sum.csv").read_text().splitlines()[1].split(",")[-2:]
    assert ours["nvtx_sum"].splitlines()[1].split(",")[-2:] == real_range == ["PushPop", ":fleet-check"]
    real_kernels = [(name, n) for name, _, n in kernel_rows(REAL / "with-nvtx_cuda_gpu_kern_sum.csv")]
    assert [(name, n) for name, _, n in kernel_rows(tmp_path / "r_cuda_gpu_kern_sum.csv")] == real_kernels
    real_api = [r[-1] for r in csv.reader(open(REAL / "with-nvtx_cuda_api_sum.csv", newline=""))]
    assert [r[-1] for r in csv.reader(io.StringIO(ours["cuda_api_sum"]))] == real_api


def test_a_workload_without_nvtx_ranges_gets_an_empty_nvtx_summary(tmp_path):
    assert (REAL / "without-nvtx_nvtx_sum.csv").read_bytes() == b""  # what nsys 2025.3 wrote
    assert nsys("profile", "--trace=cuda", "-o", "a", "--", "true", cwd=tmp_path).returncode == 0
    assert nsys("profile", "-o", "b", "--", "true", cwd=tmp_path).returncode == 0  # nvtx traced, no range opened
    for report in ("a", "b"):
        ours = stats(tmp_path / f"{report}.nsys-rep")
        assert ours["nvtx_sum"] == "" and ours["cuda_gpu_kern_sum"], report


def test_a_workload_without_kernels_gets_an_empty_kernel_summary_the_catalog_reads_as_none(tmp_path):
    assert nsys("profile", "--trace=nvtx", "-o", "r", "--", "true", cwd=tmp_path).returncode == 0
    assert stats(tmp_path / "r.nsys-rep")["cuda_gpu_kern_sum"] == ""
    assert kernel_rows(tmp_path / "r_cuda_gpu_kern_sum.csv") == []


def test_stats_of_an_empty_report_are_empty_files_and_exit_0(tmp_path):
    (tmp_path / "cut.nsys-rep").write_bytes(b"")  # an importer killed while it wrote the report
    assert stats(tmp_path / "cut.nsys-rep") == {name: "" for name in SUMMARIES}


def test_the_real_kernel_summary_is_catalogued(tmp_path):
    rows = kernel_rows(REAL / "with-nvtx_cuda_gpu_kern_sum.csv")
    assert [(n[:22], t, i) for n, t, i in rows] == [("void cutlass::Kernel2<", 1752856203, 5151),
                                                    ("void at::native::<unna", 12576, 1)]


def test_nsys_whose_importer_cannot_start_leaves_the_qdstrm_at_the_output_name_and_exits_0(tmp_path):
    done = nsys("profile", "-o", "r", "--", "true", cwd=tmp_path, env={"STANDIN_MISSING_LIBRARY": "libdw.so.1"})
    assert done.returncode == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["r.qdstrm"]
    real = (REAL / "nsys-profile-importer-missing.txt").read_text().splitlines()
    ours = (done.stderr + done.stdout).splitlines()
    shared = [line for line in ours if not line.startswith(("Generating '", "\t"))]
    assert shared and all(line in real for line in shared), (shared, real)
    assert ours[-2:] == ["Generated:", "\tr.qdstrm"] and real[-2] == "Generated:" and real[-1].endswith(".qdstrm")


def test_nsys_and_its_importer_killed_while_generating_leave_an_empty_report_and_the_data(tmp_path):
    proc = subprocess.Popen([str(STANDINS / "nsys"), "profile", "-o", "r", "--", "true"], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path), "STANDIN_IMPORT_SECONDS": "60"})
    try:
        deadline = time.monotonic() + 30
        while not (tmp_path / "r.nsys-rep").exists():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        importer = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
    finally:
        proc.kill()  # nsys, then the importer it started, as on the H200 test machine
        for pid in importer:
            os.kill(int(pid), signal.SIGKILL)
    output = proc.communicate()[0]
    assert (tmp_path / "r.nsys-rep").read_bytes() == b"" and len(list(tmp_path.glob("nsys-report-*.qdstrm"))) == 1
    real = (REAL / "nsys-profile-killed-generating.txt").read_text()
    assert GENERATING.findall(output.encode()) and GENERATING.findall(real.encode())  # the same shape
    last = [text.splitlines()[-1] for text in (output, real)]  # the progress line nsys was killed in
    assert all(line.startswith("[1/1] [0%") and line.endswith(".nsys-rep") for line in last), last


def test_the_importer_refuses_data_whose_collection_never_ended_as_the_real_one_did(tmp_path):
    said = "Qdstrm file is incomplete or invalid. Please ensure that the CLI ran to completion and provide a valid " \
           "qdstrm file."
    real = Path(__file__).parent.parent / "docs/examples/h200-acceptance/profile-check/6-nsys-killed-collecting.txt"
    assert f"(exit 2): {said}" in real.read_text()  # what QdstrmImporter said of nsys killed while collecting
    (tmp_path / "empty.qdstrm").write_bytes(b"")
    (tmp_path / "cut.qdstrm").write_text('{"tool": "nsys", "app": ["sle')
    (tmp_path / "collecting.qdstrm").write_text(json.dumps({"tool": "nsys", "app": ["sleep", "9"]}))
    for name in ("empty", "cut", "collecting"):
        done = subprocess.run([str(STANDINS / "QdstrmImporter"), "-i", str(tmp_path / f"{name}.qdstrm")],
                              capture_output=True, text=True)
        assert (done.returncode, done.stderr.strip()) == (2, said), name
        assert not (tmp_path / f"{name}.nsys-rep").exists() and (tmp_path / f"{name}.qdstrm").exists()


def test_ncu_runs_without_clock_control_locking_to_base_as_the_real_one_does(tmp_path):
    # ncu 2025.3.1 --help: "--clock-control arg (=base)"; fleet always passes it, ncu does not insist.
    done = subprocess.run([str(STANDINS / "ncu"), "-o", "r", "--", "true"], cwd=tmp_path, capture_output=True,
                          text=True)
    assert done.returncode == 0 and (tmp_path / "r.ncu-rep").exists(), done.stderr


def test_ncu_import_replays_what_ncu_printed_on_an_h200(tmp_path):
    assert subprocess.run([str(STANDINS / "ncu"), "-o", "r", "--", "true"], cwd=tmp_path).returncode == 0
    done = subprocess.run([str(STANDINS / "ncu"), "--import", "r.ncu-rep", "--page", "raw", "--csv"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == (Path(__file__).parent / "fixtures/ncu-raw-h200.csv").read_text()


# --- held to the raw recordings of tests/fixtures/tools-2025.3-h200 ---

TOOLS = Path(__file__).parent / "fixtures" / "tools-2025.3-h200"


def recorded(case: str, name: str = "output.txt") -> str:
    return (TOOLS / case / name).read_text()


def test_versions_are_what_the_real_tools_printed(tmp_path):
    for tool, case in (("nsys", "nsys-version"), ("ncu", "ncu-version"), ("QdstrmImporter", "importer-version")):
        done = subprocess.run([str(STANDINS / tool), "--version"], capture_output=True, text=True)
        assert (done.returncode, done.stdout) == (int(recorded(case, "status.txt")), recorded(case)), tool


def test_nsys_status_is_the_recorded_text_at_this_machines_paranoid_level(tmp_path):
    level = Path("/proc/sys/kernel/perf_event_paranoid").read_text().strip()
    done = nsys("status", "-e", cwd=tmp_path)
    real = recorded("nsys-status-root" if os.geteuid() == 0 else "nsys-status-user").splitlines()
    ours = done.stdout.splitlines()
    assert len(ours) == len(real) and f"Linux Kernel Paranoid Level = {level}" in ours
    differ = [(a, b) for a, b in zip(ours, real) if a != b]  # only the level and what follows from it
    assert all(a.startswith(("Linux Kernel Paranoid Level", "CPU Profiling Environment (")) for a, _ in differ), differ


def test_a_taken_output_name_is_said_after_the_workload_as_nsys_said_it(tmp_path):
    name = str(tmp_path / "taken")  # as the recording gave it: a full path
    assert nsys("profile", "-o", name, "--", "true", cwd=tmp_path).returncode == 0
    done = nsys("profile", "-o", name, "--", "sh", "-c", "echo app done", cwd=tmp_path)
    real = recorded("nsys-taken-name")
    assert done.returncode == int(recorded("nsys-taken-name", "status.txt")) == 0
    said = f"Failed to create '{tmp_path / 'taken.nsys-rep'}': File exists."
    assert "Failed to create '" in real and "taken.nsys-rep': File exists." in real and said in done.stderr
    assert real.index("app done") < real.index("Failed to create")  # after the workload's own output
    assert "Use `--force-overwrite true` to overwrite existing files." in real and said in done.stderr


def test_a_signal_to_nsys_finishes_the_report_without_kernels_and_its_duration_keeps_them(tmp_path):
    for sig, case in ((signal.SIGTERM, "nsys-sigterm"), (signal.SIGINT, "nsys-sigint")):
        proc = subprocess.Popen([str(STANDINS / "nsys"), "profile", "-o", f"s{sig}", "--", "sleep", "30"],
                                cwd=tmp_path, env={**os.environ, "TMPDIR": str(tmp_path)}, stdout=subprocess.DEVNULL)
        # Collecting: its workload started (its handlers are set before it). Not any child: `python3`
        # may be a version manager's shell script, whose own helpers run before Python does.
        deadline = time.monotonic() + 30
        while ["sleep", "30"] not in [cmdline(p) for p in descendants(proc.pid)]:
            assert time.monotonic() < deadline and proc.poll() is None, case
            time.sleep(0.05)
        time.sleep(0.5)  # a little of the workload's time collected
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == int(recorded(case, "status.txt")), case  # 143, 130
        ours = stats(tmp_path / f"s{sig}.nsys-rep")
        assert ours["cuda_gpu_kern_sum"] == recorded(f"{case}-stats", "s_cuda_gpu_kern_sum.csv") == "", case
        calls = [(r[-1], r[2]) for r in csv.reader(io.StringIO(ours["cuda_api_sum"]))]  # names and counts
        assert calls == [(r[-1], r[2]) for r in csv.reader(io.StringIO(recorded(f"{case}-stats", "s_cuda_api_sum.csv")))]
    done = nsys("profile", "--duration=1", "-o", "d", "--", "sleep", "30", cwd=tmp_path)
    assert done.returncode == int(recorded("nsys-duration", "status.txt")) == 143
    assert stats(tmp_path / "d.nsys-rep")["cuda_gpu_kern_sum"] and recorded("nsys-duration-stats", "s_cuda_gpu_kern_sum.csv")


def test_ncu_refuses_a_taken_name_with_its_own_words_before_the_workload_runs(tmp_path):
    assert subprocess.run([str(STANDINS / "ncu"), "-o", "ncu", "--", "true"], cwd=tmp_path).returncode == 0
    done = subprocess.run([str(STANDINS / "ncu"), "-o", str(tmp_path / "ncu"), "--", "touch", "ran"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert (done.returncode, done.stderr) == (int(recorded("ncu-taken-name", "status.txt")), recorded("ncu-taken-name"))
    assert not (tmp_path / "ran").exists()


def errors(text: str) -> list[str]:
    return [line[line.index("==ERROR== "):] for line in text.splitlines() if "==ERROR== " in line]


def ends(how: str) -> list[str]:
    return ["sh", "-c", "exit 3" if how == "exit3" else "kill -SEGV $$"]


def test_ncu_says_the_applications_code_and_exits_with_it_as_the_real_one_did(tmp_path):
    for how in ("exit3", "segv"):
        case = f"ncu-app-{how}"
        done = subprocess.run([str(STANDINS / "ncu"), "-o", f"r{how}", "--", *ends(how)], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == int(recorded(case, "status.txt")), case  # 3; 11, the signal's number
        assert errors(done.stdout + done.stderr) == errors(recorded(case)), case
        assert ("Disconnected from process" in done.stdout) == ("Disconnected from process" in recorded(case)), case
        assert (tmp_path / f"r{how}.ncu-rep").exists(), case  # the report kept, as the real one's was


def test_nsys_passes_the_workloads_end_on_and_loses_the_kernels_of_one_killed_by_a_signal(tmp_path):
    for how in ("exit3", "segv"):
        case = f"nsys-app-{how}"
        done = nsys("profile", "-o", how, "--", *ends(how), cwd=tmp_path)
        assert done.returncode == int(recorded(case, "status.txt")), case  # 3, 139
        said = (done.stdout + done.stderr).lower()
        assert "error" not in said and "error" not in recorded(case).lower(), case  # nothing said of it
    ours = stats(tmp_path / "segv.nsys-rep")
    assert ours["cuda_gpu_kern_sum"] == recorded("nsys-app-segv-stats", "s_cuda_gpu_kern_sum.csv") == ""
    assert stats(tmp_path / "exit3.nsys-rep")["cuda_gpu_kern_sum"]  # an exit, even non-zero, keeps them


def test_sigint_to_ncus_group_ends_it_with_the_report_kept_as_the_real_one_did(tmp_path):
    """Through fleet's agent (SIGINT's default disposition, ncu-sigint-by-agent): ncu ends by the
    signal at once, the report kept. Started with SIGINT ignored, as the background of a shell
    does (ncu-sigint-group, ncu-sigint-alone): the group's shuts the application down, exit 9;
    ncu's alone does nothing."""
    ignored = lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)  # noqa: E731
    for case, group, start in (("ncu-sigint-by-agent", True, None), ("ncu-sigint-group", True, ignored),
                               ("ncu-sigint-alone", False, ignored)):
        proc = subprocess.Popen([str(STANDINS / "ncu"), "-o", case, "--", "sleep", "3"], cwd=tmp_path,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                                preexec_fn=start)
        first = proc.stdout.readline()  # ncu attached to its application: a signal before would find no ncu yet
        assert "Connected to process" in first, first
        started = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT) if group else proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        out = first + out
        took = time.monotonic() - started
        real = recorded(case)
        if start is None:
            assert proc.returncode < 0 and "ended by a signal" in recorded(case, "status.txt"), case
        else:
            assert proc.returncode == int(recorded(case, "status.txt")), case  # 9; 0
            assert errors(out) == [re.sub(r"process \d+", f"process {pid_of(out)}", e) for e in errors(real)]
        assert ("Trying to shutdown target application" in out) == ("Trying to shutdown target application" in real)
        assert (took < 1.0) if group else (took > 2.0), (case, took)  # real: 0.16 s and 0.44 s; the workload's end
        assert (tmp_path / f"{case}.ncu-rep").exists() and "==PROF== Report:" in real, case


def pid_of(out: str) -> str:
    return re.search(r"Connected to process (\d+)", out).group(1)



# --- how nsys 2025.3 reads `profile`'s command line (scripts/gpu-node/record-options.sh) ---

OPTION_CASES = sorted(p.name for p in TOOLS.glob("nsys-option-*")) + ["nsys-profile-help"]
RECORDED_DIR = re.compile(r"/tmp/fleet-check\.\w+/reco")  # the script's work folder, here tmp_path
COLLECTING = re.compile(r"'[^']*/nsys-report-[0-9a-f]{4}\.qdstrm'")


def as_here(text: str, tmp_path: Path) -> str:
    """A recording's text with what differs from run to run made the same: the work folder, the
    collection's temporary name, and the generation's progress line (the stand-in has fewer steps)."""
    text = COLLECTING.sub("'TMP/nsys-report-XXXX.qdstrm'", RECORDED_DIR.sub(str(tmp_path), text))
    return "\n".join(line for line in text.splitlines() if not line.startswith("[1/1] ["))


@pytest.mark.parametrize("case", OPTION_CASES)
def test_nsys_reads_profiles_command_line_as_the_real_one_did(case, tmp_path):
    """Each recorded command line, run by the stand-in: the same words and status (an option given
    twice in any spelling, an ambiguous prefix with and without its value, an unknown option, a
    unique prefix taken, the help), and the same files left (none, where nsys refused)."""
    words = shlex.split(RECORDED_DIR.sub(str(tmp_path), recorded(case, "cmd.txt")))
    done = nsys(*words[words.index("profile"):], cwd=tmp_path)
    assert done.returncode == int(recorded(case, "status.txt")), done.stderr
    assert as_here(done.stdout + done.stderr, tmp_path) == as_here(recorded(case), tmp_path)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted(line.split(" ", 1)[1] for line in recorded(case, "files.txt").splitlines()), left


def test_nsys_refuses_other_spellings_in_the_recorded_words_before_the_workload_runs(tmp_path):
    """Spellings not recorded, in the recorded words with only the option's name or word
    changed: the long name for an option twice (-d and --duration), the prefix as given."""
    twice = recorded("nsys-option-twice").replace("'--trace'", "'--duration'")
    prefix = recorded("nsys-option-prefix").replace("'--dur=1'", "'--du=3'")
    unknown = recorded("nsys-option-unknown").replace("'--no-such-option'", "'-z'")
    for given, said in ((("-d", "3", "--duration=9"), twice), (("-d3", "-d", "9"), twice), (("--du=3",), prefix),
                        (("-z", "1"), unknown)):
        done = nsys("profile", *given, "--", "touch", str(tmp_path / "ran"), cwd=tmp_path)
        assert (done.returncode, done.stdout + done.stderr) == (1, said), given
        assert list(tmp_path.iterdir()) == [], given


def test_nsys_takes_a_unique_prefix_and_a_short_options_attached_value(tmp_path):
    """--stop-on names --stop-on-exit alone, -snone is -s none; --durat still matches two switches."""
    done = nsys("profile", "--stop-on=true", "-snone", "--out=r", "--", "true", cwd=tmp_path)
    assert done.returncode == 0 and (tmp_path / "r.nsys-rep").exists(), done.stderr
    assert nsys("profile", "--durat=1", "--", "true", cwd=tmp_path).returncode == 1  # --duration, --duration-frames


def test_nsys_counts_its_duration_after_its_delay_as_its_help_says(tmp_path):
    """`-y, --delay=`: "Collection start delay in seconds"; `-d, --duration=`: "Collection duration"."""
    said = recorded("nsys-profile-help")
    assert "Collection start delay in seconds." in said and "Collection duration in seconds." in said
    started = time.monotonic()
    done = nsys("profile", "--delay=1", "--duration=1", "-o", "d", "--", "sleep", "30", cwd=tmp_path)
    assert done.returncode == int(recorded("nsys-duration", "status.txt")) and 2 <= time.monotonic() - started < 20
    assert stats(tmp_path / "d.nsys-rep")["cuda_gpu_kern_sum"]
    assert nsys("profile", "--delay=5", "-o", "early", "--", "true", cwd=tmp_path).returncode == 0
    assert stats(tmp_path / "early.nsys-rep")["cuda_gpu_kern_sum"] == ""  # ended before collection began
