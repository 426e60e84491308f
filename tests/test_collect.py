"""Bringing reports home over real sshd: resume, corruption, a full disk, a cut connection."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from fleet.agent.messages import ReportFile
from fleet.collection.fetch import fetch_verified
from fleet.inventory import load
from fleet.transport import Fanout
from fleet.transport.settings import SSHSettings
from tests.harness.procs import descendants


def node_file(cluster, name: str, size: int) -> dict:
    """A 'report' on the node, with the sha256 the agent would have computed there."""
    path = cluster.scratch("node-reports") / name
    data = os.urandom(size)
    path.write_bytes(data)
    path.chmod(0o644)
    return {"path": str(path), "size": size, "sha256": hashlib.sha256(data).hexdigest()}


def fetch(cluster, report, dest, fan=None):
    async def go():
        host = load([cluster.inventory]).select(["h01"])[0]
        if fan is not None:
            return await fetch_verified(fan, host, ReportFile.read(report), dest)
        async with Fanout(SSHSettings(config=str(cluster.ssh_config))) as f:
            return await fetch_verified(f, host, ReportFile.read(report), dest)
    return asyncio.run(go())


def test_a_cut_off_transfer_resumes_from_what_arrived(cluster, tmp_path):
    report = node_file(cluster, "resume.nsys-rep", 3 << 20)
    dest = tmp_path / "store" / "resume.nsys-rep"
    dest.parent.mkdir()
    data = Path(report["path"]).read_bytes()
    dest.with_name(dest.name + ".partial").write_bytes(data[: 1 << 20])  # what a cut connection left
    entry = fetch(cluster, report, dest)
    assert entry["verified"] and entry["resumed_from"] == 1 << 20
    assert dest.read_bytes() == data and not dest.with_name(dest.name + ".partial").exists()


def test_a_corrupted_byte_is_detected_and_the_report_fetched_again(cluster, tmp_path):
    report = node_file(cluster, "corrupt.nsys-rep", 1 << 20)
    dest = tmp_path / "corrupt.nsys-rep"
    bad = bytearray(Path(report["path"]).read_bytes()[: 1 << 19])
    bad[1000] ^= 0xFF
    dest.with_name(dest.name + ".partial").write_bytes(bytes(bad))
    entry = fetch(cluster, report, dest)
    assert entry["verified"] and hashlib.sha256(dest.read_bytes()).hexdigest() == report["sha256"]


def test_an_empty_file_comes_home_and_verifies(cluster, tmp_path):
    # nsys 2025.3's `nsys stats` writes an empty *_nvtx_sum.csv for a workload without NVTX ranges.
    report = node_file(cluster, "empty_nvtx_sum.csv", 0)
    assert report["sha256"] == hashlib.sha256(b"").hexdigest()
    dest = tmp_path / "store" / "empty_nvtx_sum.csv"
    entry = fetch(cluster, report, dest)
    assert entry["verified"] and entry["status"] == "complete" and "error" not in entry, entry
    assert dest.read_bytes() == b"" and not dest.with_name(dest.name + ".partial").exists()


def test_an_empty_file_gone_from_the_node_is_missing_not_verified(cluster, tmp_path):
    report = node_file(cluster, "gone_nvtx_sum.csv", 0)
    Path(report["path"]).unlink()  # listed by the agent, then removed: nothing here vouches for it
    dest = tmp_path / "gone_nvtx_sum.csv"
    entry = fetch(cluster, report, dest)
    assert not entry["verified"] and entry["status"] == "missing" and not dest.exists(), entry


def test_a_report_that_never_matches_is_not_stored_and_the_node_keeps_it(cluster, tmp_path):
    report = node_file(cluster, "changed.nsys-rep", 4096)
    report["sha256"] = "0" * 64  # the node's file no longer matches what was hashed
    dest = tmp_path / "changed.nsys-rep"
    entry = fetch(cluster, report, dest)
    assert not entry["verified"] and entry["status"] == "missing" and "kept" in entry["error"]
    assert not dest.exists() and Path(report["path"]).exists()


@pytest.fixture
def tiny_disk(tmp_path):
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], check=True)
    yield mnt
    subprocess.run(["umount", str(mnt)], check=True)


def test_a_full_store_disk_is_a_clear_error_and_the_node_keeps_its_copy(cluster, tiny_disk):
    report = node_file(cluster, "big.nsys-rep", 2 << 20)
    entry = fetch(cluster, report, tiny_disk / "big.nsys-rep")
    assert not entry["verified"] and "No space left" in entry["error"] and "kept" in entry["error"]
    assert Path(report["path"]).stat().st_size == 2 << 20


def test_the_connection_cut_mid_transfer_then_resumed_and_verified(cluster, tmp_path):
    report = node_file(cluster, "cut.nsys-rep", 48 << 20)
    dest = tmp_path / "cut.nsys-rep"
    partial = dest.with_name(dest.name + ".partial")
    h01 = cluster.hosts[0]

    async def go():
        host = load([cluster.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(cluster.ssh_config))) as fan:
            first = asyncio.ensure_future(fetch_verified(fan, host, ReportFile.read(report), dest))
            while not partial.exists() or partial.stat().st_size < (4 << 20):
                await asyncio.sleep(0.005)
                assert not first.done(), first.result()
            # Cut the connection on the server side: the sshd session serving it dies. Only the
            # processes of this test's own sshd (h01's listener, by pid) are killed; other sshd
            # sessions on the machine, of the same user or not, are left alone.
            sessions = descendants(h01.pid)
            assert sessions, "no sshd session below h01's listener"
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            cut = await first
            got = partial.stat().st_size if partial.exists() else 0
            second = await fetch_verified(fan, host, ReportFile.read(report), dest)
            return cut, got, second

    cut, got, second = asyncio.run(go())
    assert not cut["verified"] and 0 < got < report["size"], (cut, got)
    assert second["verified"] and second["resumed_from"] == got
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == report["sha256"]
    assert h01.pid and Path(f"/proc/{h01.pid}").exists()  # the listener itself lives on
