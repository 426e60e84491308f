"""The node's cache of the agent's compiled modules (fleet/agent/codecache.py): used when it is
the user's own, and never when anything in it could be another account's choice.

The agent runs as the transports run it (the node's ``python3``, the bundle on stdin), with
``XDG_CACHE_HOME`` in a temporary folder. To tell a used entry from one compiled afresh, the
tests plant an entry for the probe's own module whose ``main`` answers "planted": when the agent
prints that, it ran the cached code; when it prints the real probe, it compiled the source.
Every refusal is checked beside the same entry being used when nothing is wrong with it.
"""

from __future__ import annotations

import json
import os
import pwd
import stat
import subprocess
from pathlib import Path

import pytest

from fleet.agent import bundle, codecache, wire

NODE_PYTHON = "/usr/bin/python3"
PROBE = bundle.MODES["probe"]
PLANTED = "def main(args):\n    print('planted')\n    return 0\n"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files of another account")


def run_agent(cache_home: Path, **env) -> str:
    """The probe, run by the node's Python from stdin; what it printed."""
    full = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(cache_home), **env}
    out = subprocess.run([NODE_PYTHON, "-c", bundle.BOOTSTRAP, json.dumps({"tools": {}, "environment_check": False})],
                         input=bundle.bundle(), env=full, capture_output=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    return out.stdout.decode()


def answered_by(text: str) -> str:
    if text.strip() == "planted":
        return "cache"
    assert wire.read(text, "probe")["agent"] == 1, text[-500:]  # the real probe, compiled from its source
    return "source"


def node_python(code: str, cache_home: Path) -> str:
    """Run ``code`` with the node's Python, fleet's shipped modules importable, the cache home set."""
    env = {"PATH": "/usr/bin:/bin", "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run([NODE_PYTHON, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def plant(cache_home: Path, module: str = PROBE, source: str = PLANTED) -> Path:
    """An entry for ``module``'s real source holding other code, written by the cache itself (as
    the user would have written it: the node's Python, this interpreter's format); its path."""
    code = ("from fleet.agent import codecache\n"
            "c = codecache.CodeCache.open()\n"
            f"c.code({module!r}, {bundle.digests()[module]!r}, 'planted', lambda: {source!r})\n"
            f"print([n for n in __import__('os').listdir(c.fd) if n.startswith({module!r} + '.')][0])")
    name = node_python(code, cache_home).strip()
    return cache_home / "fleet" / "agent-code" / name


def nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


@pytest.fixture
def cache_home(tmp_path) -> Path:
    home = tmp_path / "cache"
    home.mkdir(mode=0o700)
    return home


def test_the_agent_keeps_its_compiled_modules_private_and_answers_the_same_from_them(cache_home):
    first = wire.read(run_agent(cache_home), "probe")
    folder = cache_home / "fleet" / "agent-code"
    entries = sorted(folder.iterdir())
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 and stat.S_IMODE(folder.parent.stat().st_mode) == 0o700
    tag = subprocess.run([NODE_PYTHON, "-c", "import sys; print(sys.implementation.cache_tag)"],
                         capture_output=True, text=True).stdout.strip()
    assert {p.name.split(".")[0] for p in entries} >= {PROBE, "fleet_agent_procs", "fleet_agent_wire"}
    assert all(p.name.endswith(f".{tag}.code") and stat.S_IMODE(p.stat().st_mode) == 0o600
               and p.stat().st_uid == os.geteuid() for p in entries)
    mtimes = {p: p.stat().st_mtime_ns for p in entries}
    second = wire.read(run_agent(cache_home), "probe")
    assert {p: p.stat().st_mtime_ns for p in sorted(folder.iterdir())} == mtimes  # read, not written again
    for doc in (first, second):
        doc.pop("elapsed_ms")
        doc.pop("report_dir")  # its free bytes move
        doc.pop("perf_event_paranoid")  # the machine's sysctl, which a test beside this one may set
    assert first == second


def test_an_entry_of_the_users_own_is_used(cache_home):
    plant(cache_home)
    assert answered_by(run_agent(cache_home)) == "cache"


def test_an_entry_of_another_account_is_not_used(cache_home):
    entry = plant(cache_home)
    assert answered_by(run_agent(cache_home)) == "cache"
    os.chown(entry, nobody().pw_uid, nobody().pw_gid)
    assert answered_by(run_agent(cache_home)) == "source"
    assert entry.stat().st_uid == os.geteuid()  # and written afresh in its place


def test_an_entry_open_to_others_is_not_used(cache_home):
    entry = plant(cache_home)
    entry.chmod(0o666)
    assert answered_by(run_agent(cache_home)) == "source"


def test_a_link_in_place_of_an_entry_is_not_followed(cache_home, tmp_path):
    entry = plant(cache_home)
    elsewhere = tmp_path / "elsewhere"
    entry.rename(elsewhere)
    entry.symlink_to(elsewhere)
    assert answered_by(run_agent(cache_home)) == "source"
    assert not entry.is_symlink()  # replaced by an entry of its own, the link's target untouched
    assert elsewhere.read_bytes().startswith(codecache.FORMAT)


def test_a_cache_folder_of_another_account_is_not_used(cache_home):
    entry = plant(cache_home)
    for path in (entry, entry.parent):
        os.chown(path, nobody().pw_uid, nobody().pw_gid)
    assert answered_by(run_agent(cache_home)) == "source"
    assert entry.stat().st_uid == nobody().pw_uid  # nothing written into it


def test_a_cache_folder_linked_to_another_accounts_folder_is_not_used(cache_home, tmp_path):
    entry = plant(cache_home)
    theirs = tmp_path / "theirs"
    entry.parent.rename(theirs)
    os.chown(theirs, nobody().pw_uid, nobody().pw_gid)
    (cache_home / "fleet" / "agent-code").symlink_to(theirs)
    os.lchown(cache_home / "fleet" / "agent-code", nobody().pw_uid, nobody().pw_gid)
    assert answered_by(run_agent(cache_home)) == "source"


def test_a_cache_under_a_folder_others_can_swap_is_not_used(cache_home):
    plant(cache_home)
    cache_home.chmod(0o777)  # writable by every account, no sticky bit: fleet/ could be replaced
    assert answered_by(run_agent(cache_home)) == "source"
    cache_home.chmod(0o700)
    assert answered_by(run_agent(cache_home)) == "cache"


def test_a_cache_folder_of_the_users_own_left_open_is_narrowed_then_used(cache_home):
    plant(cache_home)
    folder = cache_home / "fleet" / "agent-code"
    folder.chmod(0o755)
    assert answered_by(run_agent(cache_home)) == "cache"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_an_entry_cut_short_is_compiled_again_and_rewritten(cache_home):
    entry = plant(cache_home)
    data = entry.read_bytes()
    entry.write_bytes(data[: len(data) // 2])
    assert answered_by(run_agent(cache_home)) == "source"
    assert entry.stat().st_size > len(data) // 2
    assert answered_by(run_agent(cache_home)) == "source"  # the real module's code now


def test_an_entry_whose_header_names_another_source_is_not_used(cache_home):
    entry = plant(cache_home)
    entry.write_bytes(entry.read_bytes().replace(bundle.digests()[PROBE].encode(), b"0" * 64, 1))
    assert answered_by(run_agent(cache_home)) == "source"


def test_no_cache_is_written_when_python_is_told_not_to_write_bytecode(cache_home):
    assert answered_by(run_agent(cache_home, PYTHONDONTWRITEBYTECODE="1")) == "source"
    assert not (cache_home / "fleet").exists()


def test_an_unusable_cache_home_costs_only_the_compile(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    assert answered_by(run_agent(not_a_folder)) == "source"


def test_entries_for_sources_no_longer_sent_are_removed(cache_home):
    old = plant(cache_home)
    stale = old.with_name(old.name.replace(bundle.digests()[PROBE], "f" * 64))
    old.rename(stale)
    run_agent(cache_home)
    names = [p.name for p in old.parent.iterdir() if p.name.startswith(PROBE + ".")]
    assert names == [old.name]
