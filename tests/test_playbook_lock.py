"""One run of a playbook at a time per store (fleet/nightly/lock.py): a scheduled run refused while a
confirmation has the workload checked out at another version, and the other way round; the lock
goes with its holder however it ends; a link planted for its file is refused."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from fleet import exitcodes
from fleet.errors import FleetError
from fleet.nightly import confirm_runs
from fleet.nightly.lock import PlaybookBusy, playbook_lock
from fleet.nightly.run import run_playbook
from tests.conftest import REPO

PLAYBOOK = SimpleNamespace(name="reference")  # the lock is taken before anything else of it is read


def test_a_run_is_refused_at_once_while_a_confirmation_holds_the_playbook_and_the_other_way_round(tmp_path):
    with playbook_lock(tmp_path, "reference", "a confirmation"):
        with pytest.raises(PlaybookBusy) as refused:
            asyncio.run(run_playbook(None, None, PLAYBOOK, embedded=True, store_root=tmp_path))
        assert refused.value.exit_status == exitcodes.REFUSED
        assert str(refused.value).startswith(f"playbook reference is busy: a confirmation by pid {os.getpid()} since ")
        assert str(refused.value).endswith("; a run was not started (it can start once that ends)")
        with playbook_lock(tmp_path, "other", "a run"):  # another playbook is not held
            pass
    with playbook_lock(tmp_path, "reference", "a run"):
        with pytest.raises(PlaybookBusy, match="busy: a run by pid"):
            asyncio.run(confirm_runs.confirm(None, None, PLAYBOOK, None, embedded=True, store_root=tmp_path))
    with playbook_lock(tmp_path, "reference", "a run"):  # free again once its holder let go
        pass
    assert oct((tmp_path / ".locks").stat().st_mode & 0o777) == "0o700"


def test_the_lock_goes_with_a_holder_killed_by_sigkill(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from fleet.nightly.lock import playbook_lock\n"
         "with playbook_lock(Path(sys.argv[1]), 'reference', 'a run'):\n    print('held', flush=True); time.sleep(60)",
         str(tmp_path)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(PlaybookBusy, match=f"a run by pid {holder.pid} since"):
            with playbook_lock(tmp_path, "reference", "a confirmation"):
                pass
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
    deadline = time.monotonic() + 10
    with playbook_lock(tmp_path, "reference", "a confirmation"):
        assert time.monotonic() < deadline


def test_a_link_planted_for_the_lock_file_is_refused_and_its_target_untouched(tmp_path):
    (tmp_path / ".locks").mkdir(mode=0o700)
    target = tmp_path / "elsewhere"
    target.write_text("keep")
    (tmp_path / ".locks" / "playbook-reference.lock").symlink_to(target)
    with pytest.raises(FleetError, match="refusing the lock .*playbook-reference.lock: Too many levels of symbolic links"):
        with playbook_lock(tmp_path, "reference", "a run"):
            pass
    assert target.read_text() == "keep"
