"""A stand-in ``crontab`` command, and a crontab line run as cron runs it: the machine's own
crontab is never read or touched."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path


def standin_crontab(tmp_path: Path) -> tuple[Path, Path]:
    """A `crontab` on PATH that keeps its table in a file: the machine's own crontab is never touched."""
    bin_dir, table = tmp_path / "bin", tmp_path / "crontab.txt"
    bin_dir.mkdir()
    (bin_dir / "crontab").write_text(
        f"#!/bin/sh\nt={shlex.quote(str(table))}\n"
        'case "$1" in -l) [ -f "$t" ] && exec cat "$t"; echo "no crontab for root" >&2; exit 1;;\n'
        '  -) exec cat > "$t";; *) exit 64;; esac\n')
    (bin_dir / "crontab").chmod(0o755)
    return bin_dir, table


def fire_as_cron(line: str, home: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run a crontab line's command as cron(8) does: through /bin/sh, each ``\\%`` made ``%``, with
    cron's own few variables and nothing of the shell that installed it."""
    command = line.split(None, 1 if line.startswith("@") else 5)[-1]  # after "@daily", or the five time fields
    env = {"HOME": str(home), "LOGNAME": "root", "SHELL": "/bin/sh", "PATH": "/usr/bin:/bin"}
    return subprocess.run(["/bin/sh", "-c", command.replace("\\%", "%")], env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)
