"""What fleet/transport writes: known_hosts, through the checked helpers like the store.

`fleet hosts trust` used to append to the known_hosts file with a plain open(..., "a") and make
its folder with os.makedirs(exist_ok=True): a link planted where it writes was followed. Now the
file is written whole under a new name (O_EXCL, O_NOFOLLOW) and renamed into place, in a folder of
the user's that no other account can write.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleet.transport import hostkeys
from tests.harness.writes import unchecked_writes

OLD = "[127.0.0.1]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOLDOLDOLDOLDOLDOLDOLDOLDOLDOLDOLDOLDOLDOLD\n"
NEW = "[127.0.0.2]:2222 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINEWNEWNEWNEWNEWNEWNEWNEWNEWNEWNEWNEWNEWN"


def test_the_store_and_transports_write_only_through_the_checked_helpers():
    assert unchecked_writes() == []


def offered(file: Path) -> hostkeys.OfferedKey:
    return hostkeys.OfferedKey("h02", str(file), "[127.0.0.2]:2222", NEW, "SHA256:x", "new")


def test_a_key_is_added_to_known_hosts_whole_and_private(tmp_path):
    known = tmp_path / "ssh" / "known_hosts"  # its folder missing: made 0700
    hostkeys.record([offered(known)])
    assert known.read_text() == NEW + "\n"
    assert oct(known.stat().st_mode & 0o777) == oct(0o600) and oct(known.parent.stat().st_mode & 0o777) == oct(0o700)
    known.write_text(OLD.rstrip("\n"))  # a last line without its newline stays a line of its own
    known.chmod(0o644)
    hostkeys.record([offered(known)])
    assert known.read_text() == OLD + NEW + "\n" and known.stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in known.parent.iterdir()) == ["known_hosts"]  # no temporary file left


def test_a_link_planted_at_the_temporary_name_is_not_followed(tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(OLD)
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    planted = tmp_path / f"known_hosts.{os.getpid()}.tmp"
    planted.symlink_to(victim)
    hostkeys.record([offered(known)])
    assert victim.read_text() == "untouched\n"  # the link was removed, never written through
    assert known.read_text() == OLD + NEW + "\n" and not known.is_symlink()
    assert not os.path.lexists(planted)


def test_a_known_hosts_another_account_can_swap_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # every account can write here, with no sticky bit
    known = shared / "known_hosts"
    known.write_text(OLD)
    with pytest.raises(hostkeys.KnownHostsError, match="writable by every account|not a directory of yours"):
        hostkeys.record([offered(known)])
    assert known.read_text() == OLD


def test_a_known_hosts_the_user_linked_elsewhere_is_written_where_it_leads(tmp_path):
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir(mode=0o700)
    (dotfiles / "known_hosts").write_text(OLD)
    link = tmp_path / "known_hosts"
    link.symlink_to(dotfiles / "known_hosts")
    hostkeys.record([offered(link)])
    assert link.is_symlink() and (dotfiles / "known_hosts").read_text() == OLD + NEW + "\n"


def test_a_known_hosts_that_is_another_accounts_link_is_not_written_through(tmp_path):
    """The old append followed any link at the known_hosts path onto the file it named."""
    victim = tmp_path / "victim"
    victim.write_text("untouched\n")
    link = tmp_path / "known_hosts"
    link.symlink_to(victim)
    os.lchown(link, 65534, 65534)  # nobody's link
    with pytest.raises(hostkeys.KnownHostsError, match="Too many levels of symbolic links"):
        hostkeys.record([offered(link)])
    assert victim.read_text() == "untouched\n" and link.is_symlink()


def test_the_transports_import_their_shared_types_from_base_never_the_package():
    """fleet/transport/__init__.py picks a transport; ssh.py and local.py used to import the package
    back (an import cycle). Now the shared types are in base.py, and no transport module imports
    the package."""
    import ast

    from tests.conftest import REPO

    modules = {p.stem for p in (REPO / "fleet" / "transport").glob("*.py")} - {"__init__"}
    for path in sorted((REPO / "fleet" / "transport").glob("*.py")):
        if path.name == "__init__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 and node.module is None:  # `from . import x`: x a sibling module, not the package's name
                    names = {alias.name for alias in node.names}
                    assert names <= modules, f"{path.name}:{node.lineno}: from . import {', '.join(sorted(names - modules))}"
                assert node.module != "fleet.transport", f"{path.name}:{node.lineno}"
        assert len(path.read_text().splitlines()) <= 400, path.name

