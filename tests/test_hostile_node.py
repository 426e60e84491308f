"""Another account on the node is hostile: report directories it made or linked, GPU lock files it
planted, and a node whose state record is corrupt. Each attack ends in one clear line, and nothing
is written where the attacker pointed.

Over the real sshd lab servers of tests/harness/lab.py: h01 logs in as an ordinary user, h02 and
h03 as root."""

from __future__ import annotations

import json
import os
import pwd
import stat
import time
from pathlib import Path

import pytest
import yaml

from fleet.agent import locks
from tests.conftest import run_fleet
from tests.harness.lab import fleet
from tests.harness.procs import TENANT_USER, spawn, stop

pytestmark = pytest.mark.usefixtures("clean_gpus")  # the lab servers (tests/harness/lab.py), started for this module


def with_report_dir(lab, tmp_path, host: str, report_dir: Path) -> dict:
    """The lab's environment, with ``report_dir`` set for ``host`` in a copy of its inventory."""
    doc = yaml.safe_load(lab["c"].inventory.read_text())

    def find(node):
        if isinstance(node, dict):
            if host in (node.get("hosts") or {}):
                node["hosts"][host] = dict(node["hosts"][host] or {}, report_dir=str(report_dir))
                return True
            return any(find(v) for v in node.values())
        return False

    assert find(doc)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump(doc))
    return {**lab["c"].env(), "FLEET_INVENTORY": str(inventory)}


def run_in(lab, env, *args):
    return run_fleet("profile", "--store", str(lab["out"]), *args, env=env)


def as_account(name: str, path: Path, mode: int) -> Path:
    pw = pwd.getpwnam(name)
    os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
    if not path.is_symlink():
        path.chmod(mode)
    return path


@pytest.fixture
def parent(lab):
    """A root-owned folder the lab user can pass through, per test."""
    d = lab["c"].dir / f"rd-{time.time_ns()}"
    d.mkdir(mode=0o755)
    return d


@pytest.fixture
def victim(lab):
    """A private file of the lab user's, which an attacker would like the report to overwrite."""
    f = lab["c"].scratch("victims") / f"victim-{time.time_ns()}.txt"
    f.write_text("precious\n")
    as_account(lab["c"].user, f, 0o600)
    return f


def test_a_report_directory_another_user_made_is_refused_and_nothing_is_written(lab, tmp_path, parent, victim):
    rd = parent / "fleet-rd"
    rd.mkdir()
    as_account(TENANT_USER, rd, 0o777)
    planted = rd / "h01-1234.nsys-rep"
    planted.symlink_to(victim)
    marker = lab["c"].scratch("ran") / f"ran-{time.time_ns()}"
    out = run_in(lab, with_report_dir(lab, tmp_path, "h01", rd), "--hosts", "h01", "--", "touch", str(marker))
    assert out.returncode == 5, out.stderr
    assert f"{rd} belongs to {TENANT_USER}" in out.stderr and "not to you" in out.stderr
    assert not marker.exists() and victim.read_text() == "precious\n"
    assert sorted(p.name for p in rd.iterdir()) == [planted.name]


def test_a_report_directory_linked_elsewhere_by_another_user_is_refused(lab, tmp_path, victim):
    shared = lab["c"].scratch("shared-tmp")  # sticky, as /var/tmp: anyone may create entries
    theirs = shared / f"theirs-{time.time_ns()}"
    theirs.mkdir()
    as_account(TENANT_USER, theirs, 0o777)
    rd = shared / f"fleet-{time.time_ns()}"
    rd.symlink_to(theirs)
    as_account(TENANT_USER, rd, 0)
    out = run_in(lab, with_report_dir(lab, tmp_path, "h01", rd), "--hosts", "h01", "--", "true")
    assert out.returncode == 5, out.stderr
    assert "is a symbolic link" in out.stderr
    assert list(theirs.iterdir()) == []


def test_a_report_directory_under_a_folder_anyone_can_write_is_refused(lab, tmp_path, parent):
    parent.chmod(0o777)  # no sticky bit: any account could move the user's folder and put another there
    out = run_in(lab, with_report_dir(lab, tmp_path, "h01", parent / "fleet-rd"), "--hosts", "h01", "--", "true")
    assert out.returncode == 5, out.stderr
    assert "writable by every account" in out.stderr and not (parent / "fleet-rd").exists()


def test_the_users_own_open_report_directory_is_narrowed_and_reports_are_private(lab, tmp_path, parent):
    rd = parent / "fleet-rd"
    rd.mkdir()
    as_account(lab["c"].user, rd, 0o777)  # as an older fleet, or the user's umask, left it
    out = run_in(lab, with_report_dir(lab, tmp_path, "h01", rd), "--hosts", "h01", "--", "true")
    assert out.returncode == 0, out.stderr
    assert stat.S_IMODE(rd.stat().st_mode) == 0o700
    written = [p for p in rd.rglob("*")]
    assert any(p.name.endswith(".nsys-rep") for p in written)
    for p in written:
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
        assert p.stat().st_uid == pwd.getpwnam(lab["c"].user).pw_uid


def test_a_corrupt_state_record_as_root_is_an_error_and_runs_nothing(lab, tmp_path):
    state = lab["state"]
    state.mkdir(mode=0o700, exist_ok=True)
    record = state / "state.json"
    record.write_text('{"sysctls": {"kernel.perf_event_paranoid": 3}}')
    record.chmod(0o600)
    marker = lab["c"].scratch("ran") / f"ran-{time.time_ns()}"
    try:
        out = fleet(lab, "--hosts", "h02", "--", "touch", str(marker))
    finally:
        record.unlink()
    assert out.returncode == 1, out.stderr
    assert "is corrupt" in out.stderr and not marker.exists()
    assert " ok" not in out.stderr.splitlines()[-1]


# --- GPU lock files, shared by every user of the node ---

def in_child_as(user: str, fn) -> dict:
    """``fn()`` in a forked child that has become ``user``; its JSON-able result or its error."""
    pw = pwd.getpwnam(user)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(pw.pw_gid)
            os.setuid(pw.pw_uid)
            try:
                doc = {"value": fn()}
            except Exception as e:
                doc = {"error": str(e)}
            os.write(write_end, json.dumps(doc).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    data = b""
    while chunk := os.read(read_end, 65536):
        data += chunk
    os.close(read_end)
    os.waitpid(pid, 0)
    return json.loads(data)


def take(lock_dir: Path, uuid: str):
    def fn():
        lock = locks.GPULock(uuid, str(lock_dir))
        got = lock.acquire()
        lock.release()
        return got
    return fn


def test_a_lock_file_another_user_made_private_is_named_not_a_traceback(lab):
    uuid = f"GPU-planted-{time.time_ns()}"
    path = lab["locks"] / f"fleet-gpu-{uuid}.lock"
    path.write_text(json.dumps({"pid": 1, "user": "root"}))
    as_account(TENANT_USER, path, 0o600)
    done = in_child_as(lab["c"].user, take(lab["locks"], uuid))
    assert "cannot open the GPU lock" in done["error"] and f"made by {TENANT_USER}" in done["error"]


def test_a_lock_file_another_user_made_readable_still_works_and_its_contents_are_not_believed(lab):
    uuid = f"GPU-planted-{time.time_ns()}"
    path = lab["locks"] / f"fleet-gpu-{uuid}.lock"
    path.write_text(json.dumps({"pid": 1, "user": "root"}))  # a fake holder: not believed
    as_account(TENANT_USER, path, 0o644)
    assert in_child_as(lab["c"].user, take(lab["locks"], uuid)) == {"value": True}
    assert locks.GPULock(uuid, str(lab["locks"])).holder() is None


def test_the_holder_of_a_lock_is_who_the_kernel_says(lab):
    uuid = f"GPU-held-{time.time_ns()}"
    path = lab["locks"] / f"fleet-gpu-{uuid}.lock"
    path.write_text(json.dumps({"pid": 1, "user": "root", "command": "fleet"}))
    as_account(TENANT_USER, path, 0o644)
    holder = spawn(TENANT_USER, ["flock", str(path), "sleep", "60"])
    try:
        deadline = time.monotonic() + 10
        while (found := locks.GPULock(uuid, str(lab["locks"])).holder()) is None:
            assert time.monotonic() < deadline, "flock never took the lock"
            time.sleep(0.05)
        assert found["pid"] == holder.pid and found["user"] == TENANT_USER and "flock" in found["command"]
        assert in_child_as(lab["c"].user, take(lab["locks"], uuid)) == {"value": False}
    finally:
        stop([holder])
