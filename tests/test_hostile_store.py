"""The store is hostile ground too: another account on this machine, a folder shared with others,
and one bad file in the store. Each attack ends in one clear line, or is simply of no use, and
nothing is written where the attacker pointed.

fleet runs for real (``fleet profile --hosts localhost``: this machine, the fake NVML and the
stand-in nsys); the attacker is a real second account, made for each test and removed after."""

from __future__ import annotations

import itertools
import json
import os
import pwd
import re
import shutil
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest
import yaml

from fleet import exitcodes, store
from tests.conftest import REPO, fleet_json, run_fleet
from tests.harness import fakenvml
from tests.harness.writes import unchecked_writes
from tests.harness.sshd import STANDINS, accounts_lock

SYSTEM_PYTHON = "/usr/bin/python3"  # the attacker's: the test's virtualenv is root's
NODE_REPORTS = Path("/var/tmp/fleet-root")  # where this machine's agent writes, as root
_names = itertools.count()


# --- the machine, the attacker, a folder other accounts can reach ---

@pytest.fixture(scope="module")
def node(lib_dir, tmp_path_factory) -> dict:
    """fleet's environment for profiling this machine: one simulated H200, the stand-in nsys."""
    d = tmp_path_factory.mktemp("node")
    scenario = fakenvml.write_scenario(d / "gpus.txt", {"gpus": [{"index": 0}]})
    for sub in ("state", "locks"):
        (d / sub).mkdir()
    return {**fakenvml.env(lib_dir, scenario), "PATH": f"{STANDINS}:{os.environ['PATH']}",
            "FLEET_STATE_DIR": str(d / "state"), "FLEET_LOCK_DIR": str(d / "locks"), "HOME": str(d)}


@pytest.fixture
def attacker():
    """A second account of this machine, of this test alone."""
    name = f"fhs{os.getpid() % 100000}x{next(_names)}"
    with accounts_lock():
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=True, capture_output=True)
    try:
        yield name
    finally:
        with accounts_lock():
            subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture
def shared():
    """A folder every account can pass through (pytest's own are root's alone), of this test alone."""
    d = Path(f"/tmp/fleet-hostile-store-{os.getpid()}-{time.time_ns()}")
    d.mkdir(mode=0o755)
    d.chmod(0o755)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def victim(shared) -> Path:
    """A file of root's that the attacker cannot write, and would like fleet (as root) to overwrite."""
    f = shared / "victim.txt"
    f.write_text("precious\n")
    f.chmod(0o644)
    return f


def as_account(name: str, code: str, *args: str) -> subprocess.CompletedProcess:
    """``code`` run by Python as account ``name``: a real process of that user."""
    pw = pwd.getpwnam(name)
    return subprocess.run([SYSTEM_PYTHON, "-c", code, *args], user=pw.pw_uid, group=pw.pw_gid, extra_groups=[],
                          capture_output=True, text=True, cwd="/", timeout=60)


def give(path: Path, name: str, mode: int) -> Path:
    pw = pwd.getpwnam(name)
    os.chown(path, pw.pw_uid, pw.pw_gid, follow_symlinks=False)
    if not path.is_symlink():
        path.chmod(mode)
    return path


def profile(node: dict, store_root: Path, *command: str, umask: int = 0o022, **kw):
    """``fleet profile --hosts localhost`` into ``store_root`` under ``umask``; the node's copies of the
    run's reports are removed after (they are this machine's, under the run's id)."""
    out = run_fleet("profile", "--store", str(store_root), "--hosts", "localhost", "--", *command, env=node,
                    prefix=("sh", "-c", f'umask {umask:03o}; exec "$@"', "sh"), **kw)
    for run in re.findall(r"run (\d{8}-\d{6}-\w+)", out.stdout + out.stderr):
        shutil.rmtree(NODE_REPORTS / run, ignore_errors=True)
    return out


def only_run(store_root: Path) -> Path:
    [manifest] = store_root.glob("lab/*/*/manifest.json")
    return manifest.parent


def modes(root: Path) -> dict[str, str]:
    """Every folder and file under ``root`` (itself too): its mode and owner, when not 0700/0600 root's."""
    odd = {}
    for p in [root, *root.rglob("*")]:
        st = p.lstat()
        want = 0o700 if stat.S_ISDIR(st.st_mode) else 0o600
        if stat.S_IMODE(st.st_mode) != want or st.st_uid != os.geteuid():
            odd[str(p.relative_to(root))] = f"{stat.S_IMODE(st.st_mode):o} uid {st.st_uid}"
    return odd


# --- the store is the user's ---

@pytest.mark.parametrize("umask", [0o022, 0o000])
def test_the_store_is_private_whatever_the_umask(node, tmp_path, umask):
    """Other local users read every report, manifest and the catalog of a 0755/0644 store."""
    root = tmp_path / "home" / ".local" / "share" / "fleet" / "store"
    out = profile({**node, "HOME": str(tmp_path / "home")}, root, "true", umask=umask)  # the default store
    assert out.returncode == 0, out.stdout + out.stderr
    assert any(p.name.endswith(".nsys-rep") for p in root.rglob("*")) and (root / "catalog.sqlite").exists()
    assert modes(root) == {}


def test_an_older_stores_open_folders_are_narrowed_when_next_used(node, tmp_path):
    root = tmp_path / "store"
    assert profile(node, root, "true", umask=0o000).returncode == 0
    run = only_run(root)
    for p in (root, run.parent, run):
        p.chmod(0o777)  # as a fleet before this one, under umask 000, left them
    listed = run_fleet("reports", "ls", "--store", str(root))
    assert listed.returncode == 0, listed.stderr
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert profile(node, root, "true").returncode == 0
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in (run.parent, run.parent.parent))


@pytest.mark.parametrize("kind", ["open to all", "another account's", "sticky"])
def test_a_store_in_a_folder_another_account_can_write_is_refused_naming_it(node, shared, attacker, kind):
    parent = shared / "place"
    parent.mkdir()
    if kind == "open to all":
        parent.chmod(0o777)  # no sticky bit: anyone could move the store away and put theirs there
        root, said = parent / "store", f"{parent}, above it, is writable by every account"
    elif kind == "another account's":
        give(parent, attacker, 0o755)
        root, said = parent / "store", f"{parent}, above it, belongs to {attacker}"
    else:
        parent.chmod(0o1777)  # as /tmp: a store right in it would have its catalog planted
        root, said = parent, f"refusing the store {parent}: every account can create files in it"
    marker = shared / "ran"
    out = profile(node, root, "touch", str(marker))
    assert out.returncode == exitcodes.USAGE, out.stdout + out.stderr
    [line] = out.stderr.splitlines()
    assert line.startswith("fleet: ") and said in line, line
    assert not marker.exists() and sorted(p.name for p in parent.iterdir()) == []
    listed = run_fleet("reports", "ls", "--store", str(root))
    assert listed.returncode == exitcodes.USAGE and said in listed.stderr or not root.exists(), listed.stderr


SWAP = """
import glob, os, sys
store, victim = sys.argv[1:]
for run in glob.glob(os.path.join(store, "*", "*", "*")):
    try:
        os.rename(run, run + ".moved")
        os.mkdir(run)
        os.chmod(run, 0o777)
        os.symlink(victim, os.path.join(run, "manifest.json.tmp"))
        print("swapped", run)
    except OSError as e:
        print("could not swap", run, e)
"""


def test_another_account_cannot_swap_the_run_folder_while_it_runs(node, shared, attacker, victim):
    """Under umask 000 the attacker swapped the run folder mid-run and planted manifest.json.tmp as a
    link to a victim file: fleet overwrote the victim and said "run complete"."""
    root = shared / "store"
    workload = ["runuser", "-u", attacker, "--", SYSTEM_PYTHON, "-c", SWAP, str(root), str(victim)]
    out = profile(node, root, *workload, umask=0o000)
    assert victim.read_text() == "precious\n"
    assert out.returncode == 0, out.stdout + out.stderr
    assert "swapped" not in out.stdout, out.stdout
    run = only_run(root)
    assert json.loads((run / "manifest.json").read_text())["status"] == "complete"
    assert modes(root) == {}


def test_a_run_folder_another_account_put_in_place_is_refused_and_nothing_written_through_it(
        node, shared, attacker, victim):
    root = shared / "store"
    assert profile(node, root, "true").returncode == 0
    run = only_run(root)
    manifest = store.read_manifest(run / "manifest.json")
    for p in (root, run.parent.parent, run.parent):
        p.chmod(0o777)  # the store as an older fleet left it under umask 000
    swapped = as_account(attacker, SWAP, str(root), str(victim))
    assert f"swapped {run}" in swapped.stdout, swapped.stdout + swapped.stderr
    with pytest.raises(store.UnsafeStore, match=f"refusing the store {run} belongs to {attacker}"):
        store.save(root, manifest)
    assert victim.read_text() == "precious\n"
    assert sorted(p.name for p in run.iterdir()) == ["manifest.json.tmp"]  # the attacker's, untouched


def test_a_catalog_planted_as_a_link_is_refused_in_one_line(node, shared, attacker, victim):
    root = shared / "store"
    assert profile(node, root, "true").returncode == 0
    (root / "catalog.sqlite").unlink()
    root.chmod(0o777)  # as an older fleet left it under umask 000
    planted = as_account(attacker, "import os, sys; os.symlink(sys.argv[2], sys.argv[1])",
                         str(root / "catalog.sqlite"), str(victim))
    assert planted.returncode == 0, planted.stderr
    for args in (["reports", "ls"], ["reports", "reindex"]):
        out = run_fleet(*args, "--store", str(root))
        assert out.returncode == exitcodes.USAGE, out.stdout + out.stderr
        [line] = out.stderr.splitlines()
        assert f"refusing {root / 'catalog.sqlite'}: it is a symbolic link" in line, line
    assert victim.read_text() == "precious\n"


def test_a_partial_copy_planted_as_a_link_is_not_written_through(cluster, tmp_path, shared, attacker, victim):
    """The transports opened ``NAME.partial`` with "wb"/"ab": a planted link had the report written
    (or appended) into the file it pointed at."""
    import asyncio
    import hashlib

    from fleet.inventory import load
    from fleet.agent.messages import ReportFile
    from fleet.collection.fetch import fetch_verified
    from fleet.transport import Fanout
    from fleet.transport.settings import SSHSettings

    data = os.urandom(100_000)
    node_copy = cluster.scratch("node-reports") / f"planted-{time.time_ns()}.nsys-rep"
    node_copy.write_bytes(data)
    node_copy.chmod(0o644)
    run = shared / "store" / "lab" / "2026-12-01" / "20261201-000000-aaaa"
    (run / "h01").mkdir(parents=True)
    for p in (run / "h01", run):
        p.chmod(0o777)  # as an older fleet left them under umask 000
    dest = run / "h01" / node_copy.name
    planted = as_account(attacker, "import os, sys; os.symlink(sys.argv[2], sys.argv[1])",
                         str(dest) + ".partial", str(victim))
    assert planted.returncode == 0, planted.stderr

    async def go():
        host = load([cluster.inventory]).select(["h01"])[0]
        async with Fanout(SSHSettings(config=str(cluster.ssh_config))) as fan:
            return await fetch_verified(fan, host, ReportFile(str(node_copy), len(data),
                                                              hashlib.sha256(data).hexdigest()), dest)
    entry = asyncio.run(go())
    assert victim.read_text() == "precious\n"
    assert entry["verified"], entry
    assert dest.read_bytes() == data and stat.S_IMODE(dest.stat().st_mode) == 0o600
    assert stat.S_IMODE(dest.parent.stat().st_mode) == stat.S_IMODE(run.stat().st_mode) == 0o700


# --- one bad file ---

def planted_run(root: Path, run_id: str, total: str = "1500000", **changes) -> Path:
    """A run as the store keeps it: a manifest, a kernel summary, a nightly metric; ``changes``
    replace keys of its manifest (``manifest_run_id``: the run id written in it)."""
    directory = store.run_dir(root, "lab", run_id)
    (directory / "h02").mkdir(parents=True)
    csv = directory / "h02" / "h02-1_cuda_gpu_kern_sum.csv"
    csv.write_text(f"Time (%),Total Time (ns),Instances,Name\n100.0,{total},3,gemm_kernel\n"
                   f"0.0,500,1,small_kernel\n")
    report = {"remote": f"/var/tmp/fleet/{run_id}/{csv.name}", "stored": str(csv), "size": csv.stat().st_size,
              "sha256": "ab" * 32, "status": "summary", "verified": True, "summary": "cuda_gpu_kern_sum"}
    day = f"{run_id[0:4]}-{run_id[4:6]}-{run_id[6:8]}"
    doc = {"run_id": run_id, "site": "lab", "day": day, "started": f"{day}T02:00:00+0000", "user": "ana",
           "request": {"tool": "nsys", "command": ["python3", "bench.py"]}, "status": "complete",
           "hosts": [{"host": "h02", "status": "ok", "gpu": "NVIDIA H200", "driver": "580",
                      "tool_version": "2025.3", "reports": [report]}],
           "playbook": {"name": "bench", "metrics": [{"metric": "total GPU kernel time",
                                                      "device": "NVIDIA H200 on h02", "value": f"@{total}@",
                                                      "flags": []}]}}
    if "manifest_run_id" in changes:
        changes["run_id"] = changes.pop("manifest_run_id")
    doc.update(changes)
    text = json.dumps(doc).replace(f'"@{total}@"', total)  # the number as the summary had it: 1e400 too
    (directory / "manifest.json").write_text(text)
    return directory / "manifest.json"


def test_a_kernel_total_of_1e400_is_left_out_and_said_not_an_overflow(node, tmp_path):
    root = tmp_path / "store"
    planted_run(root, "20261128-020000-aaaa")
    planted_run(root, "20261129-020000-bbbb", total="1e400")
    out = run_fleet("reports", "reindex", "--store", str(root))
    assert out.returncode == 0 and "catalogued 2 runs" in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stderr and "gemm_kernel" in out.stderr and "1e400" in out.stderr, out.stderr
    compared = run_fleet("reports", "compare", "20261128-020000-aaaa", "20261129-020000-bbbb", "--store", str(root))
    assert compared.returncode == exitcodes.NO_REPORTS and "Traceback" not in compared.stderr, compared.stderr
    assert "cannot be read: Total Time (ns) is '1e400'" in compared.stderr  # one line naming it, not -100%
    stats = run_fleet("reports", "stats", "20261129-020000-bbbb", "--store", str(root))
    assert stats.returncode == exitcodes.NO_REPORTS and "Traceback" not in stats.stderr, stats.stdout + stats.stderr
    assert "cannot be read: Total Time (ns) is '1e400'" in stats.stderr, stats.stderr
    pb = tmp_path / "bench.yaml"
    pb.write_text(yaml.safe_dump({"name": "bench", "target": {"hosts": "localhost"}, "command": ["true"]}))
    report = run_fleet("nightly", "report", str(pb), "--out", str(tmp_path / "site" / "n.html"),
                       env={"FLEET_STORE": str(root)})
    assert report.returncode == 0 and "Traceback" not in report.stderr, report.stdout + report.stderr
    assert profile(node, root, "true").returncode == 0  # and the store takes more runs


def test_a_damaged_catalog_is_one_line_and_reindex_rebuilds_it(node, tmp_path):
    root = tmp_path / "store"
    assert profile(node, root, "true").returncode == 0
    run_id = only_run(root).name
    (root / "catalog.sqlite").write_bytes(b"this is no database, " * 400)
    out = run_fleet("reports", "ls", "--store", str(root))
    assert out.returncode == exitcodes.USAGE, out.stdout + out.stderr
    [line] = out.stderr.splitlines()
    assert "is damaged" in line and "`fleet reports reindex` rebuilds it" in line, line
    compared = run_fleet("reports", "compare", run_id, run_id, "--store", str(root))  # reads the run's own files
    assert compared.returncode == exitcodes.OK and "Traceback" not in compared.stderr, compared.stderr
    shown = run_fleet("reports", "show", run_id, "--store", str(root))  # the folders still find the run
    assert shown.returncode == 0 and run_id in shown.stdout, shown.stderr
    out = run_fleet("reports", "reindex", "--store", str(root))
    assert out.returncode == 0 and "catalogued 1 runs" in out.stdout, out.stdout + out.stderr
    assert "left out the damaged catalog" in out.stderr and "a new one was built from the manifests" in out.stderr
    listed = fleet_json(run_fleet("reports", "ls", "--store", str(root), "--json").stdout)
    assert {r["run_id"] for r in listed} == {run_id}
    assert stat.S_IMODE((root / "catalog.sqlite").stat().st_mode) == 0o600


HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("held", flush=True)
time.sleep(120)
"""


def test_a_locked_catalog_is_one_line(node, tmp_path):
    root = tmp_path / "store"
    assert profile(node, root, "true").returncode == 0
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(root / "catalog.sqlite")], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        out = run_fleet("reports", "ls", "--store", str(root))
        assert out.returncode == exitcodes.USAGE, out.stdout + out.stderr
        [line] = out.stderr.splitlines()
        assert "is locked by another process" in line and "try again" in line, line
        ran = profile(node, root, "true")
        assert ran.returncode == exitcodes.FAILED, ran.stdout + ran.stderr
        [line] = ran.stderr.splitlines()
        assert "is locked by another process" in line and "once there is room" not in line, line
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
    assert run_fleet("reports", "ls", "--store", str(root)).returncode == 0


def test_a_bad_manifest_is_skipped_and_named_and_blocks_no_other_run_nor_a_new_profile(node, tmp_path):
    """One hand-edited manifest with a wrong type killed reindex, and with no catalog every profile."""
    root = tmp_path / "store"
    planted_run(root, "20261128-020000-aaaa")
    bad = {"20261129-020000-bbbb": {"hosts": 5},
           "20261129-020000-cccc": {"hosts": [{"host": "h02", "status": "ok",
                                               "reports": [{"stored": "x", "size": "12", "status": "summary"}]}]},
           "20261129-020000-dddd": {"request": {"tool": "nsys", "command": "rm -rf /"}},
           "20261129-020000-eeee": {"status": 7},
           "20261129-020000-gggg": {"manifest_run_id": "../../x"}}  # it would be catalogued as another run
    for run_id, change in bad.items():
        planted_run(root, run_id, **change)
    cut = planted_run(root, "20261130-020000-ffff")
    cut.write_text("{not json")
    out = run_fleet("reports", "reindex", "--store", str(root))
    assert out.returncode == 0 and "catalogued 1 runs" in out.stdout, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for run_id in [*bad, "20261130-020000-ffff"]:
        assert f"/{run_id}/manifest.json" in out.stderr, (run_id, out.stderr)
    assert "size is '12'" in out.stderr and "request.command" in out.stderr
    (root / "catalog.sqlite").unlink()  # no catalog: the first profile builds it from the manifests
    assert profile(node, root, "true").returncode == 0
    listed = fleet_json(run_fleet("reports", "ls", "--store", str(root), "--json").stdout)
    assert len({r["run_id"] for r in listed}) == 2
    shown = run_fleet("reports", "show", "20261129-020000-bbbb", "--store", str(root))
    assert shown.returncode == exitcodes.USAGE and "hosts" in shown.stderr, shown.stdout + shown.stderr
    assert len(shown.stderr.splitlines()) == 1


def test_rm_of_a_running_run_is_refused(node, tmp_path):
    """`reports rm` of a running run said "removed", and the run came back whole."""
    root = tmp_path / "store"
    running = subprocess.Popen([sys.executable, "-m", "fleet", "profile", "--store", str(root), "--hosts",
                                "localhost", "--", "sleep", "6"], cwd=REPO, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True,
                               env={**{k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}, **node})
    try:
        deadline = time.monotonic() + 30
        while not list(root.glob("lab/*/*/manifest.json")) and time.monotonic() < deadline:
            time.sleep(0.1)
        run = only_run(root)
        out = run_fleet("reports", "rm", run.name, "--store", str(root))
        assert out.returncode == exitcodes.USAGE, out.stdout + out.stderr
        [line] = out.stderr.splitlines()
        assert f"run {run.name} is still running" in line and "--force" in line, line
        assert (run / "manifest.json").exists()
    finally:
        stdout, stderr = running.communicate(timeout=60)
        shutil.rmtree(NODE_REPORTS / run.name, ignore_errors=True)
    assert running.returncode == 0, stdout + stderr
    out = run_fleet("reports", "rm", run.name, "--store", str(root))
    assert out.returncode == 0 and not run.exists(), out.stdout + out.stderr
    forced = planted_run(root, "20261129-020000-bbbb", status="running")  # its fleet was killed
    assert run_fleet("reports", "rm", forced.parent.name, "--store", str(root)).returncode == exitcodes.USAGE
    assert run_fleet("reports", "rm", forced.parent.name, "--force", "--store", str(root)).returncode == 0
    assert not forced.parent.exists()


# --- what fleet/store and fleet/transport may write with (tests/harness/writes.py) ---


def test_the_store_and_transports_write_only_through_the_checked_helpers():
    assert unchecked_writes() == []
