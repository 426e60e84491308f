"""A profiler's --version is asked once for each program file: the answer is kept in the account's
code cache, under the program's path, device, inode, size and times, and asked again when any of
them changes. Real compiled programs (gcc), the real probe code, a cache folder per test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleet.agent import node, toolversions

pytestmark = pytest.mark.services  # gcc, and the programs it makes, are started

PROGRAM = r"""
#include <stdio.h>
#include <stdlib.h>
#include <utime.h>
int main(int argc, char **argv) {
    FILE *calls = fopen(getenv("TOOL_CALLS"), "a");
    fprintf(calls, "%s\n", argc > 1 ? argv[1] : "");
    fclose(calls);
    if (TOUCH)
        utime(argv[0], NULL);  /* the program file changes while it answers */
    printf("NVIDIA Nsight Systems version %s\n", VERSION);
    return EXIT;
}
"""


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """``make(version, exit=0)`` compiles a profiler that answers with ``version`` at one path (the
    same path each time, as an upgrade in place would); ``calls()`` lists what it was asked."""
    if shutil.which("gcc") is None:  # as the simulated NVML needs it: the README's test command installs it
        raise RuntimeError("gcc not found on PATH: it is needed to make a compiled program")
    folder, log, cache = tmp_path / "bin", tmp_path / "calls", tmp_path / "cache"
    folder.mkdir(mode=0o755)
    folder.chmod(0o755)
    (tmp_path / "tool.c").write_text(PROGRAM)
    monkeypatch.setenv("TOOL_CALLS", str(log))
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.setattr(sys, "dont_write_bytecode", False)

    def make(version: str, exit: int = 0, touch: bool = False) -> str:
        built = tmp_path / "built"
        subprocess.run(["gcc", f'-DVERSION="{version}"', f"-DEXIT={exit}", f"-DTOUCH={int(touch)}", "-o",
                        str(built), str(tmp_path / "tool.c")], check=True, timeout=60)
        os.replace(built, folder / "nsys")  # a new file in its place: a new inode, as a package upgrade
        return str(folder / "nsys")

    def calls() -> list[str]:
        return log.read_text().splitlines() if log.exists() else []

    return make, calls, cache


def asked(path: str, doctor: bool = False) -> dict:
    return node.ToolQuestions({"nsys": path}, doctor, ("nsys",)).answers()["nsys"]


def entries(cache: Path) -> list[Path]:
    return [p for p in (cache / "fleet" / "agent-code").iterdir() if p.name.startswith("nsys-version.")]


def test_a_programs_answer_is_asked_once_and_kept_for_that_program(tool):
    make, calls, cache = tool
    path = make("2025.3.1.90")
    first, second = asked(path), asked(path)
    assert calls() == ["--version"]  # the second probe started nothing
    assert first["version"] == second["version"] == "2025.3.1.90"
    assert first["version_text"] == second["version_text"]
    [entry] = entries(cache)
    assert entry.stat().st_mode & 0o777 == 0o600


def test_an_upgraded_or_touched_program_is_asked_again(tool):
    make, calls, cache = tool
    path = make("2025.3.1.90")
    asked(path)
    make("2025.5.1.121")  # upgraded in place
    assert asked(path)["version"] == "2025.5.1.121" and calls() == ["--version"] * 2
    os.utime(path, ns=(1, 1))  # the same bytes, touched: asked again
    assert asked(path)["version"] == "2025.5.1.121" and calls() == ["--version"] * 3
    # only the newest answer of a path is kept
    assert len(entries(cache)) == 1
    copy = Path(path).with_name("copy")  # the same bytes and times in another file: another inode
    shutil.copy2(path, copy)
    os.replace(copy, path)
    assert asked(path)["version"] == "2025.5.1.121" and calls() == ["--version"] * 4


def test_an_answer_that_is_not_whole_is_not_kept(tool):
    make, calls, _ = tool
    path = make("2025.3.1.90", exit=1)  # it failed, whatever it printed
    asked(path), asked(path)
    assert calls() == ["--version"] * 2


def test_a_script_is_asked_every_time(tool, tmp_path):
    """A script (CUDA's bin/ncu is one) may run whichever program it finds."""
    _, calls, _ = tool
    script = tmp_path / "bin" / "nsys"
    script.write_text('#!/bin/sh\necho "$1" >> "$TOOL_CALLS"\necho "NVIDIA Nsight Systems version 2025.3.1.90"\n')
    script.chmod(0o755)
    assert toolversions.program_key(str(script)) is None
    assert asked(str(script))["version"] == asked(str(script))["version"] == "2025.3.1.90"
    assert calls() == ["--version"] * 2


def test_an_entry_not_the_accounts_own_or_open_to_others_is_not_believed(tool):
    make, calls, cache = tool
    path = make("2025.3.1.90")
    asked(path)
    [entry] = entries(cache)
    planted = entry.read_bytes().replace(b"2025.3.1.90", b"2099.9.9.99")
    entry.write_bytes(planted)
    entry.chmod(0o644)  # another account could have written it
    assert asked(path)["version"] == "2025.3.1.90" and calls() == ["--version"] * 2
    entry.write_bytes(planted)
    entry.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(entry, 65534, 65534)  # another account's
        assert asked(path)["version"] == "2025.3.1.90" and calls() == ["--version"] * 3


def test_an_entry_cut_short_is_asked_again(tool):
    """A writer that died leaves an entry cut short: "2025.3.1.90" cut to "2025.3.1" would be
    another version, so a cut entry is no answer."""
    make, calls, cache = tool
    path = make("2025.3.1.90")
    asked(path)
    [entry] = entries(cache)
    whole = entry.read_bytes()
    entry.write_bytes(whole[:whole.index(b"2025.3.1") + len(b"2025.3.1")])
    assert asked(path)["version"] == "2025.3.1.90" and calls() == ["--version"] * 2


def test_a_program_that_changed_while_it_answered_is_not_kept(tool):
    make, calls, cache = tool
    path = make("2025.3.1.90", touch=True)
    asked(path), asked(path)
    assert calls() == ["--version"] * 2 and entries(cache) == []


def test_a_program_others_could_change_is_never_kept(tool):
    """Another account could swap it while it answers and put it back after: its answer would then
    be kept for the program it did not come from. (Root does not run such a program at all.)"""
    make, calls, cache = tool
    path = make("2025.3.1.90")
    for _ in range(2):
        questions = node.ToolQuestions.__new__(node.ToolQuestions)
        questions.found = {"nsys": {"path": path, "writable_by_others": "its folder is writable by every account"},
                           "ncu": None}
        questions.runs = {}
        questions._ask_versions(["nsys"], fresh=False)
        assert questions.answers()["nsys"]["version"] == "2025.3.1.90"
    assert calls() == ["--version"] * 2 and not (cache / "fleet").exists()


def test_doctor_asks_every_time_and_a_probe_after_it_needs_not(tool):
    make, calls, _ = tool
    path = make("2025.3.1.90")
    asked(path, doctor=True), asked(path, doctor=True)
    assert calls().count("--version") == 2
    asked(path)
    assert calls().count("--version") == 2


def test_a_refused_cache_folder_costs_only_the_question(tool, tmp_path):
    make, calls, cache = tool
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (cache / "fleet").mkdir(parents=True, mode=0o700)
    (cache / "fleet" / "agent-code").symlink_to(elsewhere)  # a link in place of the folder: refused
    path = make("2025.3.1.90")
    assert asked(path)["version"] == asked(path)["version"] == "2025.3.1.90"
    assert calls() == ["--version"] * 2 and list(elsewhere.iterdir()) == []


def test_a_fifo_in_place_of_the_program_is_not_waited_on(tmp_path):
    fifo = tmp_path / "nsys"
    os.mkfifo(fifo)
    assert toolversions.program_key(str(fifo)) is None  # returns at once: nobody writes to it


def test_without_a_cache_every_probe_asks(tool, monkeypatch):
    make, calls, _ = tool
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # as PYTHONDONTWRITEBYTECODE says
    path = make("2025.3.1.90")
    asked(path), asked(path)
    assert calls() == ["--version"] * 2


def test_the_shipped_probe_keeps_the_answer_too(tool, tmp_path):
    """Through the bundle, as a node runs it: a second probe starts no profiler."""
    from fleet.agent import bundle

    make, calls, cache = tool
    path = make("2025.3.1.90")
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(cache), "TOOL_CALLS": os.environ["TOOL_CALLS"]}
    args = '{"mode": "probe", "tools": {"nsys": "%s"}, "environment_check": false, "versions": ["nsys"]}' % path
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", bundle.BOOTSTRAP, args], input=bundle.bundle(), env=env,
                             capture_output=True, timeout=60)
        assert b'"version":"2025.3.1.90"' in out.stdout, out.stderr
    assert calls() == ["--version"]
    assert Path(path).exists()
