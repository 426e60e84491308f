"""What a command imports before it works: only what it needs. Start-up time is most of a small
run's wall time, so asyncssh and cryptography load only for SSH, PyYAML only with an inventory,
rich only for a progress bar on a terminal. These tests check the modules loaded, never timings."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

HEAVY = ("asyncssh", "cryptography", "yaml", "rich")


def modules_after(code: str) -> set[str]:
    """The top-level modules loaded in a fresh interpreter after running ``code``."""
    probe = (f"import sys\n{code}\n"
             "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def run_main(*args: str) -> str:
    return ("from fleet.cli.main import main\n"
            f"try:\n    main({list(args)!r})\nexcept SystemExit:\n    pass")


def test_version_imports_no_ssh_yaml_rich_or_asyncio():
    loaded = modules_after(run_main("--version"))
    assert "click" in loaded
    assert not loaded & {*HEAVY, "asyncio", "sqlite3"}, loaded & {*HEAVY, "asyncio", "sqlite3"}


def test_importing_the_command_line_loads_no_command_module():
    loaded = modules_after("import fleet.cli.main")
    assert not loaded & set(HEAVY)


def test_local_probe_imports_no_ssh_and_no_yaml():
    """Without an inventory fleet works on this machine alone: no SSH stack, no YAML reader."""
    loaded = modules_after(run_main("probe", "--json"))
    assert "asyncio" in loaded  # the probe did run
    assert not loaded & set(HEAVY), loaded & set(HEAVY)


def test_help_still_lists_every_command():
    from click.testing import CliRunner

    from fleet.cli.main import COMMANDS, main

    out = CliRunner().invoke(main, ["--help"]).output
    assert all(f"  {name} " in out for name in COMMANDS)


def test_inventory_commands_import_no_ssh_stack():
    """Reading and checking an inventory connects to nothing: asyncssh and cryptography stay unloaded."""
    inventory = str(REPO / "tests" / "fixtures" / "inventories" / "mixed" / "10-lab.ini")
    for command in (("inventory", "list", "-i", inventory), ("inventory", "check", "-i", inventory)):
        loaded = modules_after(run_main(*command))
        assert "fleet" in loaded and not loaded & {"asyncssh", "cryptography"}, (command, loaded & {"asyncssh", "cryptography"})


def test_reports_commands_import_no_ssh_stack(tmp_path):
    """The store is local: listing it, or a run's stats, loads no SSH stack."""
    for command in (("reports", "ls", "--store", str(tmp_path / "store")),
                    ("reports", "stats", "20260101-000000-0000", "--store", str(tmp_path / "store"))):
        loaded = modules_after(run_main(*command))
        assert "sqlite3" in loaded and not loaded & {"asyncssh", "cryptography"}, (command, loaded & {"asyncssh", "cryptography"})


def test_a_lab_run_loads_no_slurm_or_ray_path(tmp_path):
    """A run on lab servers imports its own path alone: the Slurm and Ray paths' modules (the batch
    script, the job watch, the Ray submission) stay unloaded, as they would add to every lab run's
    start before its probe."""
    code = (run_main("profile", "--hosts", "localhost", "--dry-run", "--store", str(tmp_path / "store"),
                     "--", "true")
            + "\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('fleet.'))))")
    out = subprocess.run([sys.executable, "-c", "import sys\n" + code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    loaded = set(out.stdout.split())
    assert "fleet.lab.profile" in loaded, out.stdout + out.stderr  # the lab run did start
    assert not {m for m in loaded if m.startswith(("fleet.slurm.", "fleet.ray."))}, loaded
