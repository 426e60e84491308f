"""Every command shown in README.md, docs/user-guide.md and docs/ranks.md, run as a reader would run it.

The blocks run in the order of each document, in one environment prepared as a reader's machine
would be (tests/harness/docs.py says how blocks are read):

* a copy of the checkout as the working directory, a HOME of the test's own (so fleet's store,
  ``~/.ssh/known_hosts`` and ``~/.local`` are the test's);
* sixteen lab servers ``gpu01``..``gpu16``, real sshd on loopback addresses, that ``ssh gpu01``
  reaches through ``~/.ssh/config`` as the reader's own config would (user, key, address); each
  has two simulated H200 GPUs (the fake NVML) and the stand-in nsys and ncu on its PATH;
* this machine the same: the fake NVML and the stand-ins, for fleet without an inventory;
* ``apt-get`` is a stand-in that checks what it is asked to install is a Debian package already
  installed here, so a block that installs packages runs without changing the machine.

``FLEET_DOCS_RECORD=1`` writes the actual output into the console blocks (re-recorded
transcripts), to be read over before committing.
"""

from __future__ import annotations

import json
import os
import socket
import shutil
import subprocess
from pathlib import Path

import pytest

from fleet.nightly import playbook
from tests.conftest import REPO, announce, perf_event_paranoid
from tests.harness import docs, fakenvml
from tests.harness.sshd import SSHCluster

DOCS = [REPO / "README.md", REPO / "docs" / "user-guide.md", REPO / "docs" / "ranks.md"]
RECORD = os.environ.get("FLEET_DOCS_RECORD") == "1"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

APT_GET = """#!/bin/sh
# Stand-in for apt-get in the doc test: 'update' does nothing; 'install' checks that every package
# named is Debian's and already installed here, and installs nothing.
case "$1" in update) exit 0 ;; install) ;; *) echo "apt-get stand-in: $1 not known" >&2; exit 100 ;; esac
shift
for p in "$@"; do
  case "$p" in -*) continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" \\
    || { echo "E: $p is not installed on the test machine (or is no Debian package)" >&2; exit 100; }
done
"""


def checkout_copy(dest: Path) -> Path:
    """The files of the checkout (tracked, and new ones git does not ignore), as a reader's clone."""
    names = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, names):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture(scope="module")
def reader(pytestconfig, tmp_path_factory):
    """The reader's machine: its environment, checkout and lab servers; yields a factory of a
    fresh shell per document."""
    root = tmp_path_factory.mktemp("docs")
    home = root / "home"
    (home / ".ssh").mkdir(parents=True, mode=0o700)
    checkout = checkout_copy(root / "fleet")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "apt-get").write_text(APT_GET)
    (bin_dir / "apt-get").chmod(0o755)
    c = SSHCluster(16, prefix="gpu")
    with perf_event_paranoid("2"):
        lib = fakenvml.build(c.dir / "fakenvml")
        scenario = c.dir / "scenario.txt"
        fakenvml.write_scenario(scenario, {"gpus": [{"index": 0}, {"index": 1}]})
        scenario.chmod(0o644)
        tools = c.standins()
        state, locks = c.dir / "state", c.dir / "locks"
        for d in (state, locks):
            d.mkdir(mode=0o777)
            d.chmod(0o1777)
        node_env = {**fakenvml.env(lib, scenario), "FLEET_STATE_DIR": state, "FLEET_LOCK_DIR": locks,
                    "PATH": f"{tools}:{SYSTEM_PATH}"}
        for h in c.hosts:
            h.options["SetEnv"] = " ".join(f"{k}={v}" for k, v in node_env.items())
        try:
            c.start()
        except BaseException:
            c.stop()
            raise
        (home / ".ssh" / "config").write_text(
            "".join(f"Host {h.name}\n  HostName {h.address}\n  Port {h.port}\n" for h in c.hosts)
            + f"Host *\n  User {c.user}\n  IdentityFile {c.user_key}\n  IdentitiesOnly yes\n")
        announce(pytestconfig, f"doc test: {len(c.hosts)} sshd lab servers gpu01..gpu16 on "
                               f"{c.hosts[0].address}..{c.hosts[-1].address}")
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("FLEET_", "SSH_", "VIRTUAL_ENV", "PYTEST", "PYTHON", "LD_", "FAKE_"))}
        env.update({"HOME": str(home), "PATH": f"{bin_dir}:{tools}:{SYSTEM_PATH}", "NO_COLOR": "1",
                    "COLUMNS": "100", "TERM": "dumb", "LC_ALL": "C.UTF-8",
                    **{k: str(v) for k, v in fakenvml.env(lib, scenario).items()},
                    "FLEET_STATE_DIR": str(state), "FLEET_LOCK_DIR": str(locks)})
        try:
            yield lambda: docs.Shell(checkout, env, home)
        finally:
            remote_reports = Path(os.path.expanduser(f"~{c.user}")) / "fleet-reports"
            store = home / ".local" / "share" / "fleet" / "store"
            for run in (store.glob("*/*/*") if store.exists() else []):
                shutil.rmtree(remote_reports / run.name, ignore_errors=True)  # the runs this test made
            c.stop()


def run_document(shell: docs.Shell, path: Path) -> tuple[list[str], list[docs.Block]]:
    """Run the document's blocks in order; return the problems found and the blocks not run."""
    problems, not_run, recorded = [], [], {}
    for b in docs.read_blocks(path):
        if b.tag in docs.COMMAND_TAGS and b.not_run:
            not_run.append(b)
        if not b.runs:
            continue
        results = shell.run(b)
        recorded[b.line] = results
        for r in results:
            why = r.problem()
            if why:
                problems.append(f"{path.name}:{r.command.line}: $ {r.command.text}\n  {why}; it printed:\n"
                                + "\n".join("    " + line for line in r.output))
    if RECORD:
        docs.record(path, recorded)
    return problems, not_run


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_command_in_the_doc_runs(reader, path, pytestconfig):
    problems, not_run = run_document(reader(), path)
    blocks = [b for b in docs.read_blocks(path) if b.tag in docs.COMMAND_TAGS]
    announce(pytestconfig, f"{path.name}: {sum(len(b.commands) for b in blocks if b.runs)} commands run, "
                           f"{len(not_run)} blocks not run: "
                           + "; ".join(f"{b.where} ({b.not_run})" for b in not_run))
    assert not problems, "\n\n".join(problems)


def test_a_broken_command_or_a_changed_output_fails_the_doc(reader, tmp_path):
    """The test sees what a reader would: a copy of the guide's transcript whose command no
    longer exists, whose output is not what is printed, or a script block that fails."""
    guide = (REPO / "docs" / "user-guide.md").read_text()
    shown = "$ fleet -i inventory/ exec gpu01 python3 -c 'import sys; print(sys.argv[1:])' -n 4 --json\n"
    assert shown in guide
    mutants = {
        "exit status 2, the doc expects 0": guide.replace(shown, shown.replace("exec gpu01", "exec --gpu01")),
        "output differs": guide.replace("['-n', '4', '--json']", "['-n', '4']"),
        "exit status 1, the doc expects 0": guide.replace(". .venv/bin/activate", ". .venv/bin/activat"),
    }
    shell = reader()
    for b in docs.read_blocks(REPO / "docs" / "user-guide.md"):
        if b.runs and ". .venv/bin/activate" in b.body:
            shell.run(b)  # fleet on PATH, as after the guide's install
    reached = 0  # how far into the guide a mutant's failure was: the blocks before it set up its shell
    for expected, text in mutants.items():
        copy = tmp_path / "user-guide.md"
        copy.write_text(text)
        blocks = [b for b in docs.read_blocks(copy, text) if b.runs and "install" not in "\n".join(b.body)]
        problems = []
        for n, b in enumerate(blocks):  # in order, as a reader would, up to the block that fails as expected
            problems += [r.problem() for r in shell.run(b)]
            if any(p and p.startswith(expected) for p in problems):
                reached = max(reached, n + 1)
                break
        assert any(p and p.startswith(expected) for p in problems), (expected, problems)
    unchanged = [b for b in docs.read_blocks(REPO / "docs" / "user-guide.md")
                 if b.runs and "install" not in "\n".join(b.body)]
    # The same blocks as the guide has them pass in the same shell: what failed above was the mutants'.
    assert not [r.problem() for b in unchanged[:reached] for r in shell.run(b) if r.problem()]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_block_says_what_it_is(path):
    """A command hidden in an untagged or indented block would escape the test; the blocks not
    run are few, each with its reason."""
    blocks = docs.read_blocks(path)
    assert all(b.tag for b in blocks), [b.where for b in blocks if not b.tag]
    assert not docs.indented_commands(path)
    not_run = [b for b in blocks if b.tag in docs.COMMAND_TAGS and b.not_run]
    assert len(not_run) <= 2 and all(len(b.not_run) > 10 for b in not_run), [b.where for b in not_run]
    assert sum(len(b.commands) for b in blocks if b.runs) >= 5


def test_the_example_inventory_and_playbooks_hold(reader):
    """inventory/ passes `fleet inventory check`; every playbook loads, its lab hosts are the
    example inventory's and `fleet run --dry-run` plans them on the servers; a Slurm playbook's
    partition is one the example cluster lists."""
    shell = reader()
    console = docs.Block(REPO / "playbooks", 0, "console", [])
    console.commands = [docs.Command(". .venv/bin/activate", []),
                        docs.Command("fleet -i inventory/ inventory check", ["...", "ok: 17 hosts in 2 groups (inventory/example.yaml)"]),
                        docs.Command("fleet -i inventory/ hosts trust lab --yes >/dev/null", []),
                        docs.Command("fleet -i inventory/ inventory list --json", [])]
    books = [playbook.load(path) for path in sorted((REPO / "playbooks").glob("*.yaml"))]
    assert books and any(b.on_slurm for b in books) and not all(b.on_slurm for b in books)
    lab = [b for b in books if not b.on_slurm]
    here = [b for b in lab if b.target.get("hosts") == "localhost"]  # reference.yaml: this machine, no inventory
    for book in lab:
        inventory = "" if book in here else "-i inventory/ "
        console.commands.append(docs.Command(f"fleet {inventory}run --dry-run --json playbooks/{Path(book.path).name}", []))
    results = shell.run(console)
    assert [r.problem() for r in results[:4]] == [None] * 4, [(r.command.text, r.output) for r in results]
    hosts = json.loads("\n".join(results[3].output))["data"]["hosts"]
    names = {h["name"] for h in hosts}
    partitions = {p for h in hosts for p in h["vars"].get("slurm_partitions", [])}
    for book in books:
        if book.on_slurm:
            assert book.target["partition"] in partitions, book.path
    for book, r in zip(lab, results[4:]):
        assert r.problem() is None, (book.path, r.output)
        manifest = json.loads("\n".join(r.output))["data"]
        planned = [h["host"] for h in manifest["hosts"] if h["status"] == "planned"]
        assert planned and set(planned) <= (names if book not in here else {socket.gethostname()}), (book.path, r.output)
