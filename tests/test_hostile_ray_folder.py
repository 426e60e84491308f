"""Folders fleet did not make are refused: the Ray run's folder, and what it lists for gathering.

Another account on a Ray head could make a run's folder first (the run id is public once the job
is submitted): made 0777, it swapped ``ray/`` and fleet gathered its planted reports as "ok,
verified"; made 0755, every report was lost without a word. Here the attacker is a second account
of this machine (the tenant), the user a third (fleet's test user) for the hook, which runs as the
user Ray runs as, and this test's own account for the listing on the head."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from fleet.inventory import local_inventory
from fleet.ray import submit as ray_submit
from fleet.slurm import launchers
from fleet.transport import Fanout
from tests.harness.procs import TENANT_USER
from tests.harness.sshd import TEST_USER, ensure_user


@pytest.fixture
def base():
    """A folder every account can reach, root's and writable by none but root: the attacker's and
    the user's folders are made in it, as in /tmp (owned then as if each account had made its own)."""
    ensure_user(TENANT_USER)
    ensure_user(TEST_USER)
    folder = Path(tempfile.mkdtemp(prefix="fleet-rayfolder-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        shutil.rmtree(folder)


def owned(path: Path, user: str, mode: int) -> Path:
    path.mkdir()
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(mode)
    return path


def hook_as_user(base: Path, node_dir: Path) -> subprocess.CompletedProcess:
    """The hook's worker side, as the user Ray runs as: where whose it is goes (the block's folder)."""
    hook = base / "hook"
    hook.mkdir(exist_ok=True)
    shutil.copy(launchers.RAY_HOOK, hook / "fleet_ray_hook.py")
    block = {"_nsight": {"o": f"{node_dir}/ray/worker-%h-%p"}}
    pw = pwd.getpwnam(TEST_USER)
    return subprocess.run(["/usr/bin/python3", "-c", "import fleet_ray_hook; print(fleet_ray_hook._reports_dir())"],
                          env={"PYTHONPATH": str(hook), "FLEET_RAY_RUNTIME_ENV": json.dumps(block), "HOME": pw.pw_dir},
                          user=pw.pw_uid, group=pw.pw_gid, extra_groups=[], cwd="/", capture_output=True, text=True)


@pytest.mark.parametrize("mode", [0o777, 0o755])
def test_a_run_folder_another_account_made_first_is_refused_by_the_hook_naming_it(base, mode):
    attacker = owned(base / "fleet-ray-RUN", TENANT_USER, mode)
    done = hook_as_user(base, attacker)
    assert done.returncode != 0 and "fleet: refusing the Ray run's folder: " + str(attacker) in done.stderr, done
    assert not (attacker / "ray").exists()


@pytest.mark.parametrize("owner,mode", [(TENANT_USER, 0o755), ("root", 0o777)])
def test_a_run_folder_below_one_another_account_could_rename_in_is_refused_by_the_hook(base, owner, mode):
    """The user's own run folder, below a folder another account owns (or root's, open to all
    without the sticky bit): that account could rename the user's folder and put its own there."""
    above = owned(base / "above", owner, mode)
    mine = owned(above / "mine", TEST_USER, 0o700)
    done = hook_as_user(base, mine / "run")
    assert done.returncode != 0, done
    assert f"fleet: refusing the Ray run's folder: {above} is not this user's (or root's, above" in done.stderr, done
    assert not (mine / "run").exists()  # refused before anything was made


def test_a_run_folder_reached_through_another_accounts_link_is_refused_by_the_hook(base):
    """The user's own folder, reached through a link another account made in a folder all may
    write (sticky, as /tmp): that account could point the link elsewhere once it was checked."""
    mine = owned(base / "mine", TEST_USER, 0o700)
    sticky = owned(base / "shared", "root", 0o1777)
    link = sticky / "link"
    link.symlink_to(mine)
    tenant = pwd.getpwnam(TENANT_USER)
    os.lchown(link, tenant.pw_uid, tenant.pw_gid)
    done = hook_as_user(base, link / "run")
    assert done.returncode != 0 and f"fleet: refusing the Ray run's folder: {link} is a link of uid" in done.stderr, done
    assert not (mine / "run").exists()


def test_the_users_own_run_folder_is_made_private_by_the_hook(base):
    mine = owned(base / "mine", TEST_USER, 0o755)
    done = hook_as_user(base, mine / "run")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(mine / "run" / "ray")
    assert (mine / "run" / "ray").stat().st_mode & 0o777 == 0o700 and (mine / "run").stat().st_mode & 0o777 == 0o700


def head_says(script_call):
    async def go():
        async with Fanout() as fan:
            return await script_call(fan, next(iter(local_inventory().hosts.values())))
    return asyncio.run(go())


@pytest.mark.parametrize("where", ["run folder", "folder above"])
def test_a_run_folder_another_account_could_swap_is_refused_on_the_head_before_the_job(base, where):
    """``fleet ray submit`` checks the head's folders before it submits: the run's folder, or one
    above it, of another account is refused, naming it, and nothing is made in it."""
    attacker = owned(base / "theirs", TENANT_USER, 0o777)
    node_dir = attacker if where == "run folder" else owned(attacker / "mine", "root", 0o700)
    refused = head_says(lambda fan, head: ray_submit.folder_refused(fan, head, str(node_dir / "run")
                                                                      if where == "folder above" else str(node_dir)))
    assert refused and f"{attacker} belongs to uid {pwd.getpwnam(TENANT_USER).pw_uid}" in refused, refused
    assert sorted(p.name for p in attacker.rglob("*")) == ([] if where == "run folder" else ["mine"])  # nothing made
    ok = head_says(lambda fan, head: ray_submit.folder_refused(fan, head, str(owned(base / "ok", "root", 0o755) / "r")))
    assert ok is None and (base / "ok" / "r" / "ray").stat().st_mode & 0o777 == 0o700


def plant(folder: Path, name: str, user: str, mode: int) -> Path:
    path = folder / name
    path.write_bytes(b"planted " + name.encode())
    pw = pwd.getpwnam(user)
    os.chown(path, pw.pw_uid, pw.pw_gid)
    path.chmod(mode)
    return path


def test_reports_listed_for_gathering_are_checked_for_owner_and_mode(base, tmp_path):
    """A report or whose file in the run's folder that is another account's, or that others may
    write, or a link, is refused by name and never brought home; the user's own come home."""
    run = owned(base / "run", "root", 0o700)
    ray = owned(run / "ray", "root", 0o700)
    mine = plant(ray, "worker-node1-11.nsys-rep", "root", 0o600)
    theirs = plant(ray, "worker-node1-12.nsys-rep", TENANT_USER, 0o644)
    open_one = plant(ray, "worker-node1-13.whose.json", "root", 0o666)
    (ray / "worker-node1-14.nsys-rep").symlink_to(mine)
    hosts = head_says(lambda fan, head: ray_submit.reports_home(fan, head, str(run), tmp_path / "store"))
    said = " | ".join(h.missing_why or "" for h in hosts)
    assert f"{theirs} has owner {pwd.getpwnam(TENANT_USER).pw_uid}" in said and f"{open_one} has owner 0 and mode 666" in said
    assert f"{ray / 'worker-node1-14.nsys-rep'} is a symbolic link" in said
    home = [r for h in hosts for r in h.reports if r.verified]
    assert [Path(r.stored).name for r in home] == [mine.name]
    assert hashlib.sha256(Path(home[0].stored).read_bytes()).hexdigest() == hashlib.sha256(mine.read_bytes()).hexdigest()
    everything = owned(base / "open", TENANT_USER, 0o777)
    owned(everything / "ray", "root", 0o700)
    plant(everything / "ray", "worker-node1-15.nsys-rep", "root", 0o600)
    hosts = head_says(lambda fan, head: ray_submit.reports_home(fan, head, str(everything), tmp_path / "store2"))
    assert [h.status for h in hosts] == ["failed"] and str(everything) in hosts[0].missing_why
    assert not (tmp_path / "store2").exists() or not list((tmp_path / "store2").rglob("*.nsys-rep"))


def test_the_default_run_folder_is_in_the_home_of_the_user_ray_runs_as():
    job = ray_submit.RayJob(address="http://127.0.0.1:8265", entrypoint=("python", "x.py"),
                            node_dir=f"{ray_submit.NODE_DIR}/20261201-120000-ab01")
    assert job.node_dir.startswith("~/") and job.problem() is None
    assert ray_submit.NODE_DIR == "~/.cache/fleet-ray-runs"


def test_a_whose_file_nested_past_the_stack_names_no_actor_and_raises_nothing(tmp_path):
    """A worker's whose file is the job's to write: 64 KB of ``[[[[`` is within its size bound and
    nests past the stack json.loads uses; the worker keeps its plain name."""
    from fleet.slurm.raygather import whose_of
    from fleet.store.manifest import ReportEntry

    whose = tmp_path / "worker-node1-11.whose.json"
    whose.write_text("[" * 60_000)
    rep = ReportEntry(remote=str(whose), stored=str(whose), size=60_000, verified=True, status="complete")
    assert whose_of([rep]) is None
