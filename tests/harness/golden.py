"""Golden files for what fleet writes and prints, and the one function that takes out of a text
what differs from run to run (run ids, days, temporary paths, addresses and ports, pids, job ids,
durations, this machine's name) before it is compared.

On a mismatch the test fails with a unified diff. When the change is on purpose, regenerate the
golden files of a test file and review the diff before committing it:

    FLEET_UPDATE_GOLDEN=1 .venv/bin/python -m pytest -p no:cacheprovider -q tests/test_golden_output.py
"""

from __future__ import annotations

import difflib
import os
import re
import socket
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE = bool(os.environ.get("FLEET_UPDATE_GOLDEN"))

# (pattern, replacement), applied in order after the caller's own paths: each names what it hides.
VARYING = [
    (re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b"), "<run-id>"),             # fleet's run ids
    (re.compile(r"\b[0-9a-f]{64}\b"), "<sha256>"),
    (re.compile(r"\b[0-9a-f]{32}\b"), "<nonce>"),                          # a job's secrets.token_hex(16)
    (re.compile(r"\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?([+-]\d{4}|Z)?"), "<time>"),
    (re.compile(r"\b20\d{2}-\d{2}-\d{2}\b"), "<day>"),                      # the store's day folders
    (re.compile(r"/tmp/pytest-of-[^/\s]+/pytest-\d+/"), "<pytest-tmp>/"),   # pytest's per-run folders
    (re.compile(r"\b127\.\d+\.\d+\.\d+(:\d+)?"), "<address>"),              # the test sshd hosts
    (re.compile(r"\bport \d+"), "port <port>"),
    (re.compile(r"\bpid \d+"), "pid <pid>"),
    (re.compile(r"\bprocess \d+"), "process <pid>"),                     # ncu's "Connected to process N"
    (re.compile(r"(?<![\w-])(h\d{2})-\d+(?!\d)"), r"\1-<pid>"),           # a lab report's name: HOST-%p
    (re.compile(r"\(/[^()\s]*/python[\d.]*\)"), "(<python>)"),           # the interpreter a profiler names
    (re.compile(r"\bnsys-report-[0-9a-f]{4}\b"), "nsys-report-<random>"),  # nsys's temporary .qdstrm
    (re.compile(r"\bslurm-\d+\.out\b"), "slurm-<job-id>.out"),
    # What the stand-in profilers wrote is theirs, not fleet's: its size and hash are not compared.
    (re.compile(r"\b\d+ bytes\b"), "<size> bytes"),
    (re.compile(r"\bsha256 [0-9a-f]{12}…"), "sha256 <sha256>…"),
    (re.compile(r"\bjob \d+"), "job <job-id>"),
    (re.compile(r"\bjob_id=\d+"), "job_id=<job-id>"),
    (re.compile(r"\b\d+(\.\d+)? ?(ms|s|seconds)\b"), "<duration>"),
]


def normalized(text: str, paths: dict[str, str] | None = None) -> str:
    """``text`` with what varies between runs replaced by a name in angle brackets: first the
    caller's ``paths`` (a temporary folder -> its name, longest first, so a folder inside another
    keeps its own name), then this machine's host name, then the patterns of VARYING."""
    for path, name in sorted((paths or {}).items(), key=lambda item: -len(item[0])):
        text = text.replace(path, name)
    host = socket.gethostname()
    if host:
        text = re.sub(rf"\b{re.escape(host)}\b", "<this-machine>", text)
    for pattern, replacement in VARYING:
        text = pattern.sub(replacement, text)
    return text


def compare(name: str, text: str) -> None:
    """``text`` is what tests/golden/NAME holds (FLEET_UPDATE_GOLDEN=1: it is written there)."""
    path = GOLDEN / name
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    want = path.read_text() if path.exists() else ""
    if text != want:
        diff = "".join(difflib.unified_diff(want.splitlines(True), text.splitlines(True),
                                            f"tests/golden/{name}", "now"))
        pytest.fail(f"{name} differs from its golden file:\n{diff}\nIf the change is on purpose, regenerate with "
                    "FLEET_UPDATE_GOLDEN=1 (see tests/harness/golden.py) and review the diff.", pytrace=False)
