"""Large reports through OpenSSH's own client, over real sshd: the bytes, the sha256, resume, the
store's rules, and a hostile node (a link at the path, a file that shrinks or changes, a stall),
with asyncssh carrying the file wherever ssh cannot; raw, and compressed with the node's zstd as
over a slow link (``wire``), where a node's stream that is not what fleet asked for is refused."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import stat
import tempfile
import threading
import time
from pathlib import Path

import pytest

from fleet.inventory import load
from fleet.agent.messages import ReportFile
from fleet.collection.fetch import fetch_verified
from fleet.transport import Fanout, compressed, openssh_fetch, ssh_fetch
from fleet.transport.settings import SSHSettings
from tests.harness.procs import descendants
from tests.harness.sshd import SSHCluster, keygen

SMALL_MIN = 1 << 20  # the paths' thresholds, lowered so that files of a few MiB take them


@pytest.fixture(autouse=True)
def low_thresholds(monkeypatch):
    monkeypatch.setattr(openssh_fetch, "OPENSSH_MIN", SMALL_MIN)
    monkeypatch.setattr(ssh_fetch, "STREAM_MIN", SMALL_MIN)


@pytest.fixture(params=["raw", "zstd"])
def wire(request, monkeypatch) -> str:
    """The way a large file comes: "raw", or "zstd" as from a host whose link is slow."""
    if request.param == "zstd":
        assert shutil.which("zstd"), "zstd is missing here: apt-get install zstd (scripts/test installs it)"
        monkeypatch.setattr(compressed.LinkRates, "slow", lambda self, host: True)
    return {"raw": "openssh", "zstd": "openssh-zstd"}[request.param]


def node_file(cluster, name: str, size: int) -> dict:
    """A 'report' on the node, with the sha256 the agent would have computed there."""
    path = cluster.scratch("openssh-reports") / name
    data = os.urandom(size)
    path.write_bytes(data)
    path.chmod(0o644)
    return {"path": str(path), "size": size, "sha256": hashlib.sha256(data).hexdigest()}


class Routes:
    """The Fanout, with the way each fetch came recorded (``SSHTransport.fetch`` returns it)."""

    def __init__(self, fan: Fanout):
        self.fan, self.seen = fan, []

    async def fetch(self, *args, **kwargs) -> str:
        route = await self.fan.fetch(*args, **kwargs)
        self.seen.append(route)
        return route


def fetch(cluster, report, dest, config=None, during=None):
    """fetch_verified through h01; returns (entry, routes taken). ``during``: a coroutine
    function run beside the fetch, given the partial file's path."""
    async def go():
        host = load([cluster.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(config or cluster.ssh_config))) as fan:
            routes = Routes(fan)
            work = asyncio.ensure_future(fetch_verified(routes, host, ReportFile.read(report), dest))
            if during is not None:
                await during(dest.with_name(dest.name + ".partial"), work)
            return await work, routes.seen
    return asyncio.run(go())


def test_a_large_report_comes_through_openssh_whole_checked_and_private(cluster, tmp_path, wire):
    report = node_file(cluster, f"big-{wire}.nsys-rep", 5 << 20)
    dest = tmp_path / "store" / "big.nsys-rep"
    dest.parent.mkdir(mode=0o700)
    entry, routes = fetch(cluster, report, dest)
    assert routes == [wire] and entry["verified"], entry
    assert dest.read_bytes() == Path(report["path"]).read_bytes()
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600 and not dest.with_name(dest.name + ".partial").exists()


def test_a_cut_copy_resumes_through_openssh_from_what_arrived(cluster, tmp_path, wire):
    report = node_file(cluster, f"resume-{wire}.nsys-rep", 4 << 20)
    dest = tmp_path / "resume.nsys-rep"
    data = Path(report["path"]).read_bytes()
    dest.with_name(dest.name + ".partial").write_bytes(data[:(1 << 20) + 7])
    entry, routes = fetch(cluster, report, dest)
    assert routes == [wire] and entry["verified"] and entry["resumed_from"] == (1 << 20) + 7, entry
    assert dest.read_bytes() == data


def test_a_link_planted_as_the_partial_copy_is_never_written_through(cluster, tmp_path):
    report = node_file(cluster, "planted.nsys-rep", 3 << 20)
    dest = tmp_path / "planted.nsys-rep"
    victim = tmp_path / "victim"
    victim.write_bytes(b"mine")
    dest.with_name(dest.name + ".partial").symlink_to(victim)
    entry, routes = fetch(cluster, report, dest)
    assert routes == ["openssh"] and entry["verified"] and entry.get("resumed_from") is None, entry
    assert victim.read_bytes() == b"mine" and dest.read_bytes() == Path(report["path"]).read_bytes()


@pytest.mark.parametrize("size", [3 << 20, 64 << 10], ids=["openssh", "sftp"])
def test_a_link_at_the_node_path_is_not_followed(cluster, tmp_path, size, wire):
    report = node_file(cluster, f"link-{size}-{wire}.nsys-rep", size)
    target = Path(report["path"]).with_name(f"target-{size}-{wire}")
    os.replace(report["path"], target)
    os.symlink(target, report["path"])  # same bytes, same sha256: only the link tells
    dest = tmp_path / "link.nsys-rep"
    entry, routes = fetch(cluster, report, dest)
    assert not entry["verified"] and entry["status"] == "missing" and not dest.exists(), entry
    assert "symbolic link" in entry["error"] and "kept" in entry["error"]


def test_a_file_shorter_than_the_node_said_is_a_clear_error_and_what_came_is_kept(cluster, tmp_path, wire):
    report = node_file(cluster, f"shrunk-{wire}.nsys-rep", 4 << 20)
    os.truncate(report["path"], 3 << 20)
    dest = tmp_path / "shrunk.nsys-rep"
    entry, routes = fetch(cluster, report, dest)
    assert not entry["verified"] and not dest.exists(), entry
    assert f"gave {3 << 20} bytes, {4 << 20} expected" in entry["error"] and "count=" in entry["error"]
    assert dest.with_name(dest.name + ".partial").read_bytes() == Path(report["path"]).read_bytes()


def test_a_file_grown_after_the_node_hashed_it_brings_only_the_bytes_hashed(cluster, tmp_path, wire):
    report = node_file(cluster, f"grown-{wire}.nsys-rep", 3 << 20)
    with open(report["path"], "ab") as f:
        f.write(os.urandom(1 << 20))
    dest = tmp_path / "grown.nsys-rep"
    entry, routes = fetch(cluster, report, dest)
    assert routes == [wire] and entry["verified"] and dest.stat().st_size == 3 << 20, entry


def node_path(*tools: str) -> Path:
    """A folder for one sshd's PATH (its SetEnv): only ``tools``, as this machine has them."""
    path = Path(tempfile.mkdtemp(prefix="fleet-node-path-"))
    path.chmod(0o755)
    for tool in tools:
        (path / tool).symlink_to(shutil.which(tool))
    return path


def node_path_with_a_dd_that_stops(held: int) -> Path:
    """The node's PATH: sh, nice and zstd as they are, and a dd that sends the first ``held`` bytes
    of what it was asked for and then holds the connection open without a byte more, until the file
    ``resume`` appears beside it; from then on, the real dd."""
    tools = node_path("sh", "nice", "zstd")
    real = {tool: shutil.which(tool) for tool in ("dd", "head", "sleep")}
    (tools / "dd").write_text(f"""#!/bin/sh
if [ -e {tools}/resume ]; then exec {real['dd']} "$@"; fi
{real['dd']} "$@" | {real['head']} -c {held}
exec {real['sleep']} 300
""")
    (tools / "dd").chmod(0o755)
    return tools


def test_the_connection_cut_mid_copy_leaves_a_prefix_that_resumes_through_openssh(tmp_path, wire):
    # The node's dd stops after 16 MiB of the 48 and holds on: the cut comes while the copy waits, so
    # that it is cut mid-copy however fast or loaded this machine is. zstd on two threads holds back
    # what it has not yet filled a job with: of 8 MiB held it let 4.1 MiB through (16 MiB: 12.5), at
    # the 4 MiB the cut waits for, and on a loaded machine the copy stalled short of it.
    tools = node_path_with_a_dd_that_stops(16 << 20)
    try:
        with SSHCluster(1, options={"SetEnv": f"PATH={tools}"}) as node:
            report = node_file(node, f"cut-{wire}.nsys-rep", 48 << 20)
            dest = tmp_path / "cut.nsys-rep"

            async def cut(partial: Path, work) -> None:
                while not partial.exists() or partial.stat().st_size < (4 << 20):
                    await asyncio.sleep(0.002)
                    assert not work.done(), work.result()
                for pid in descendants(node.hosts[0].pid):  # this test's sshd sessions only, by pid
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)

            first, _ = fetch(node, report, dest, during=cut)
            got = dest.with_name(dest.name + ".partial").stat().st_size
            data = Path(report["path"]).read_bytes()
            assert not first["verified"] and 0 < got <= 16 << 20, (first, got)  # what the node sent, no more
            assert dest.with_name(dest.name + ".partial").read_bytes() == data[:got]  # a clean prefix
            (tools / "resume").touch()
            second, routes = fetch(node, report, dest)
    finally:
        shutil.rmtree(tools)
    assert routes == [wire] and second["verified"] and second["resumed_from"] == got, second
    assert dest.read_bytes() == data


def test_a_node_that_sends_more_than_asked_is_stopped_and_the_excess_cut_off(tmp_path):
    # A node whose sshd answers every command with 6 MiB, whatever was asked: more than the 4 MiB
    # its result named. Its own sshd, as the shared hosts are never changed.
    with SSHCluster(1, options={"ForceCommand": "head -c 6291456 /dev/zero"}) as node:
        report = {"path": "/nonexistent/big.nsys-rep", "size": 4 << 20,
                  "sha256": hashlib.sha256(bytes(4 << 20)).hexdigest()}
        dest = tmp_path / "big.nsys-rep"
        entry, _ = fetch(node, report, dest)
    assert not entry["verified"] and "sent more than the 4194304 bytes" in entry["error"], entry
    assert dest.with_name(dest.name + ".partial").stat().st_size == 4 << 20 and not dest.exists()


@pytest.mark.parametrize("sent, why", [
    ("printf Z; head -c 67108864 /dev/zero | zstd -1 -q -c", "sent more than the 4194304 bytes"),  # 64 MiB in 2 KiB
    ("printf R; head -c 6291456 /dev/zero", "sent more than the 4194304 bytes"),
    ("head -c 6291456 /dev/zero", "neither of fleet's marks"),
    ("printf Z; head -c 1048576 /dev/urandom", "not zstd's"),
], ids=["a-stream-that-inflates-past-the-size", "raw-past-the-size", "no-mark", "not-zstd"])
def test_a_node_whose_compressed_stream_is_not_what_was_asked_is_refused(tmp_path, monkeypatch, sent, why):
    # Its own sshd answers every command with ``sent``, whatever was asked; nothing past the 4 MiB
    # its result named is written, however far a small stream would inflate.
    monkeypatch.setattr(compressed.LinkRates, "slow", lambda self, host: True)
    with SSHCluster(1, options={"ForceCommand": sent}) as node:
        report = {"path": "/nonexistent/big.sqlite", "size": 4 << 20, "sha256": hashlib.sha256(bytes(4 << 20)).hexdigest()}
        dest = tmp_path / "big.sqlite"
        entry, _ = fetch(node, report, dest)
    assert not entry["verified"] and why in entry["error"] and not dest.exists(), entry
    assert dest.with_name(dest.name + ".partial").stat().st_size <= 4 << 20


def test_a_node_without_zstd_sends_the_file_raw_when_asked_to_compress(tmp_path, monkeypatch):
    monkeypatch.setattr(compressed.LinkRates, "slow", lambda self, host: True)
    tools = node_path("sh", "dd", "nice")  # what the command needs, no zstd
    with SSHCluster(1, options={"SetEnv": f"PATH={tools}"}) as node:
        report = node_file(node, "raw.sqlite", 3 << 20)
        dest = tmp_path / "raw.sqlite"
        entry, routes = fetch(node, report, dest)
        sent = Path(report["path"]).read_bytes()
    shutil.rmtree(tools)
    assert routes == ["openssh"] and entry["verified"] and dest.read_bytes() == sent, entry


@pytest.mark.parametrize("slow_link, second", [(float("inf"), "openssh-zstd"), (0.0, "openssh")], ids=["slow", "fast"])
def test_after_a_slow_copy_a_hosts_next_large_file_comes_compressed(cluster, tmp_path, monkeypatch, slow_link, second):
    # Whether a link is slow is known from the host's last large raw copy: none before the first.
    monkeypatch.setattr(compressed, "SLOW_LINK", slow_link)
    monkeypatch.setattr(compressed, "MEASURED_FROM", 1 << 20)
    reports = [node_file(cluster, f"pair-{slow_link}-{i}.sqlite", 3 << 20) for i in range(2)]

    async def go():
        host = load([cluster.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(cluster.ssh_config))) as fan:
            routes = Routes(fan)
            entries = [await fetch_verified(routes, host, ReportFile.read(r), tmp_path / Path(r["path"]).name)
                       for r in reports]
            return entries, routes.seen

    entries, routes = asyncio.run(go())
    assert routes == ["openssh", second] and all(e["verified"] for e in entries), (routes, entries)


def test_a_links_rate_is_known_only_from_large_raw_copies(monkeypatch):
    monkeypatch.setattr(compressed, "zstandard", object())  # as where this machine can undo zstd
    links = compressed.LinkRates()
    assert not links.slow("n1")  # nothing known: raw
    links.heard("n1", "sftp", 1 << 30, 100.0)  # SFTP carries small files only: its rate is not the link's
    links.heard("n1", "openssh", 1 << 20, 10.0)  # too small to tell
    assert not links.slow("n1")
    links.heard("n1", "stream", 259 << 20, 2.4)  # 113 MB/s: about 1 Gbit/s
    assert links.slow("n1") and not links.slow("n2")
    links.heard("n1", "openssh-zstd", 259 << 20, 100.0)  # a compressed copy's rate is not the link's
    assert links.slow("n1")
    links.heard("n1", "openssh", 1 << 30, 1.0)  # 1 GB/s: a fast link after all
    assert not links.slow("n1")
    monkeypatch.setattr(compressed, "zstandard", None)
    links.heard("n1", "stream", 259 << 20, 2.4)
    assert not links.slow("n1")  # nothing here undoes zstd: raw


def test_a_file_that_changes_during_the_copy_is_never_stored(cluster, tmp_path):
    size = 64 << 20
    report = node_file(cluster, "changing.nsys-rep", size)
    dest = tmp_path / "changing.nsys-rep"

    async def change(partial: Path, work) -> None:
        while not partial.exists() or partial.stat().st_size < (1 << 20):
            await asyncio.sleep(0.002)
            assert not work.done(), work.result()  # a copy that ended first fails here, never waits on
        # The copy is held (this test's sshd sessions stopped, by pid) while the rest of the file is
        # rewritten on the node: flow control keeps the node's reader within the channel's window
        # (a few MiB) of what has come, so a part well past it is read changed, however loaded the
        # machine (a wait that merely raced the copy lost on a busy one).
        sessions = descendants(cluster.hosts[0].pid)
        for pid in sessions:
            os.kill(pid, signal.SIGSTOP)
        try:
            start = max(40 << 20, partial.stat().st_size + (16 << 20))
            assert start < size, "the copy ran past where the change can be made unseen"
            with open(report["path"], "r+b") as f:
                f.seek(start)
                f.write(os.urandom(size - start))
            # Held long enough that the first copy's rate is below the compression's threshold
            # however fast the rest of it goes (64 MiB in 0.6 s or more: at most 112 MB/s).
            time.sleep(0.6)
        finally:
            for pid in sessions:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    entry, routes = fetch(cluster, report, dest, during=change)
    # The wrong hash earned one fresh copy; the first, held, came slowly enough that the second is
    # compressed (the link's rate is all the transport knows).
    assert routes == ["openssh", "openssh-zstd"], routes
    assert not entry["verified"] and "differs" in entry["error"] and not dest.exists(), entry
    assert not dest.with_name(dest.name + ".partial").exists()


def test_a_node_that_stops_sending_is_given_up_within_the_bound(cluster, tmp_path, monkeypatch, wire):
    monkeypatch.setattr(ssh_fetch, "STALL_SECONDS", 1.0)
    fifo = cluster.scratch("openssh-reports") / f"stalled-{wire}.nsys-rep"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    report = {"path": str(fifo), "size": 4 << 20, "sha256": "0" * 64}
    writer: dict = {}

    def feed() -> None:  # a file system that hands over 2 MiB, then hangs
        writer["f"] = open(fifo, "wb")
        writer["f"].write(os.urandom(2 << 20))
        writer["f"].flush()

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        entry, routes = fetch(cluster, report, tmp_path / "stalled.nsys-rep")
        took = time.monotonic() - start
    finally:
        # Where dd never opened the FIFO before the bound (a slow start on a loaded machine), the
        # writer is still waiting for a reader: a daemon thread, left there.
        thread.join(10 if "f" in writer else 0)
        if "f" in writer:
            writer["f"].close()  # dd on the node sees its end and exits
    assert not entry["verified"] and "sent nothing for 1 s" in entry["error"], entry
    assert took < 10, took
    assert not [p for p in descendants(os.getpid()) if Path(f"/proc/{p}/comm").read_text().strip() == "ssh"]


def test_where_openssh_refuses_the_config_asyncssh_brings_the_file(cluster, tmp_path):
    config = tmp_path / "ssh_config"  # a keyword asyncssh passes over and OpenSSH's ssh rejects
    config.write_text(cluster.ssh_config.read_text() + "  NoSuchFleetOption yes\n")
    report = node_file(cluster, "fallback.nsys-rep", 3 << 20)
    dest = tmp_path / "fallback.nsys-rep"
    entry, routes = fetch(cluster, report, dest, config=config)
    assert routes == ["stream"] and entry["verified"], entry


def test_a_changed_host_key_is_refused_by_ssh_and_known_hosts_left_as_it_was(cluster, tmp_path):
    h01 = cluster.hosts[0]
    known = tmp_path / "known_hosts"
    wrong = keygen(tmp_path / "otherkey")  # another machine's host key
    known.write_text(f"[{h01.address}]:{h01.port} {wrong}\n")
    before = known.read_bytes()
    command = openssh_fetch.ssh_command(
        address=h01.address, options={"port": h01.port, "username": cluster.user}, identity_files=(str(cluster.user_key),),
        identities_only=True, config_paths=[], known_hosts=[str(known)], proxied=False)
    report = node_file(cluster, "hostkey.nsys-rep", 2 << 20)

    async def go():
        with open(tmp_path / "out", "wb") as dst:
            await openssh_fetch.openssh_copy(command, report["path"], str(tmp_path / "out"), dst, 0, report["size"], None)

    with pytest.raises(openssh_fetch.OpenSSHRefused, match="Host key verification failed"):
        asyncio.run(go())
    assert known.read_bytes() == before and (tmp_path / "out").stat().st_size == 0


@pytest.mark.parametrize("change, why", [
    ({"address": "-oProxyCommand=touch /tmp/x"}, "a name that would be an option"),
    ({"address": "host name"}, "a space"),
    ({"options": {"username": "a b"}}, "a space in a value"),
    ({"identity_files": ("~/.ssh/%h",)}, "an ssh_config %-token"),
    ({"known_hosts": []}, "nothing trusted"),
    ({"known_hosts": ["/tmp/known hosts"]}, "a space in a known_hosts path"),
    ({"proxied": True}, "a jump host or proxy command"),
    ({"options": {"proxy_command": ["/bin/sh", "-c", "nc h 22"]}}, "a proxy command"),
    ({"options": {"some_new_asyncssh_option": 1}}, "an option fleet cannot say to ssh"),
])
def test_a_connection_ssh_cannot_be_told_exactly_stays_with_asyncssh(change, why):
    given = dict(address="node1", options={"port": 2222}, identity_files=(), identities_only=False,
                 config_paths=[], known_hosts=["/home/u/.ssh/known_hosts"], proxied=False)
    assert openssh_fetch.ssh_command(**given) is not None
    assert openssh_fetch.ssh_command(**{**given, **change}) is None, why


def test_the_ssh_command_checks_host_keys_strictly_against_fleets_files_only():
    command = openssh_fetch.ssh_command(
        address="node1", options={"port": 2222, "username": "u", "connect_timeout": 15.0, "agent_path": None},
        identity_files=("/k/id",), identities_only=True, config_paths=["/c/ssh_config"],
        known_hosts=["/k/known_hosts", "/etc/ssh/ssh_known_hosts"], proxied=False)
    assert command[0] == shutil.which("ssh") and command[-2:] == ["--", "node1"]
    said = [command[i + 1] for i, word in enumerate(command) if word == "-o"]
    for wanted in ("StrictHostKeyChecking=yes", "BatchMode=yes", "UpdateHostKeys=no", "KnownHostsCommand=none",
                   "UserKnownHostsFile=/k/known_hosts /etc/ssh/ssh_known_hosts", "GlobalKnownHostsFile=/dev/null",
                   "Port=2222", "User=u", "ConnectTimeout=15", "IdentityAgent=none", "IdentityFile=/k/id",
                   "IdentitiesOnly=yes", "ForwardAgent=no", "ControlPath=none"):
        assert wanted in said, wanted
    assert not any("accept-new" in w or w.startswith("StrictHostKeyChecking=no") for w in said)
    assert command[command.index("-F") + 1] == "/c/ssh_config"


def test_without_an_ssh_client_here_the_connection_stays_with_asyncssh(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert openssh_fetch.ssh_command(address="node1", options={}, identity_files=(), identities_only=False,
                                     config_paths=[], known_hosts=["/k"], proxied=False) is None


def test_without_openssh_a_fifo_at_the_node_path_is_refused_before_a_read(cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(openssh_fetch, "OPENSSH_MIN", 1 << 62)  # asyncssh's SFTP open would wait for a writer
    fifo = cluster.scratch("openssh-reports") / "fifo.nsys-rep"
    os.mkfifo(fifo)
    fifo.chmod(0o666)
    entry, _ = fetch(cluster, {"path": str(fifo), "size": 4 << 20, "sha256": "0" * 64}, tmp_path / "fifo.nsys-rep")
    assert not entry["verified"] and "not a regular file" in entry["error"], entry


def test_without_openssh_too_only_the_bytes_the_node_hashed_come(cluster, tmp_path, monkeypatch):
    monkeypatch.setattr(openssh_fetch, "OPENSSH_MIN", 1 << 62)
    report = node_file(cluster, "grown-stream.nsys-rep", 3 << 20)
    with open(report["path"], "ab") as f:
        f.write(os.urandom(1 << 20))
    dest = tmp_path / "grown-stream.nsys-rep"
    entry, routes = fetch(cluster, report, dest)
    assert routes == ["stream"] and entry["verified"] and dest.stat().st_size == 3 << 20, entry
