"""kernel.perf_event_paranoid as a lab's hosts see it: the one sysctl fleet owns in the tests.

The kernel holds one value for the whole machine, and no namespace has a copy of it. A lab that set
it would have to run alone, one module after another (tests/conftest.py's sysctl group). So most labs
get a value of their own (:class:`PrivateSysctl`): a mount namespace in which a root-owned file of
the lab's is bound over /proc/sys/kernel/perf_event_paranoid. The lab's sshd runs in it, and so does
every session, agent, `sudo` and stand-in profiler under it. They read and write the path they would
on a node, with the kernel's own permissions (root writes, everyone reads). The machine's value is
never touched, and labs run side by side.

A module whose tests are about the sysctl itself (tests/test_profile.py) uses :class:`KernelSysctl`:
the real one, set for the lab and put back after, in the group that runs alone."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from tests.harness.sshd import namespace_holder

NODE_PATH = "/proc/sys/kernel/perf_event_paranoid"  # where a node's processes find it


class PrivateSysctl:
    """A lab's own perf_event_paranoid, seen at NODE_PATH by what runs through :attr:`prefix`.
    The namespace's holder is this test's own process, stopped by pid. Mounts made on the machine
    later still reach the namespace (slave propagation), as a test's tmpfs must."""

    def __init__(self, value: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-sysctl-"))
        self.dir.chmod(0o755)
        self.file = self.dir / "perf_event_paranoid"
        self.file.write_text(value + "\n")
        self.file.chmod(0o644)  # as the kernel's: root alone writes it
        try:
            self.holder = namespace_holder("mnt", "--propagation", "slave")
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        try:
            subprocess.run([*self.prefix, "mount", "--bind", str(self.file), NODE_PATH], check=True)
        except BaseException:
            self.stop()
            raise

    @property
    def prefix(self) -> list[str]:
        """A command line prefix that runs a program in the namespace (sshd, started by the lab)."""
        return ["nsenter", "-t", str(self.holder.pid), "-m"]

    def read(self) -> str:
        return self.file.read_text().strip()

    def stop(self) -> None:
        self.holder.kill()
        self.holder.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class KernelSysctl:
    """The machine's own perf_event_paranoid, set to ``value`` until :meth:`stop` puts the value it
    found back. Its users share tests/conftest.py's sysctl group: they run one after another."""

    prefix: list[str] = []

    def __init__(self, value: str) -> None:
        self.path = Path(NODE_PATH)
        self.original = self.path.read_text().strip()
        self.path.write_text(value)

    def read(self) -> str:
        return self.path.read_text().strip()

    def stop(self) -> None:
        self.path.write_text(self.original)
