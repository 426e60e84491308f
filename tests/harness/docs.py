"""The commands shown in the docs, read from their Markdown and run as a reader would run them.

The convention (described for writers in docs/tested-docs.md):

* A fenced block tagged ``console`` is a transcript: a line starting with ``$ `` is a command
  (lines starting with ``> `` continue it, as a shell's second prompt does), and the lines after
  it, up to the next command, are its expected output, stdout and stderr as a terminal shows
  them. A line ``...`` matches any number of lines, ``...`` inside a line any text. A command
  must exit 0 unless it ends with a comment ``# exit N``. A command followed by no output lines
  has its output left unchecked.
* A fenced block tagged ``sh`` or ``bash`` is run whole, as a script under ``set -e``.
* ``<!-- not run: REASON -->`` on the line before a fence keeps that block from running; the
  test counts and lists those.
* Every other fenced block (``json``, ``yaml``, ``ini``, ``text``) is not a command, and must
  carry a tag.

The blocks of one document run in order in one environment, as a reader follows them: each
block in a fresh ``bash`` that starts where the one before left off (its exported variables
and its working directory), with a terminal on stdin on which ``y`` is typed at each prompt.
"""

from __future__ import annotations

import os
import pty
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

COMMAND_TAGS = {"console", "sh", "bash"}
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^(```+|~~~+)\s*([\w+-]*)\s*$")
EXIT = re.compile(r"#\s*exit\s+(\d+)\s*$")
MARK = "\x1efleet-docs"


@dataclass
class Command:
    text: str               # what runs (continuation lines joined with newlines)
    expected: list[str]     # the output shown in the doc (empty: not checked)
    status: int = 0
    line: int = 0           # its line in the document


@dataclass
class Block:
    path: Path
    line: int                            # the line of its opening fence, 1-based
    tag: str
    body: list[str]
    not_run: str | None = None
    body_start: int = 0                  # index of its first body line in the document's lines
    commands: list[Command] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"

    @property
    def runs(self) -> bool:
        return self.tag in COMMAND_TAGS and self.not_run is None


def read_blocks(path: Path, text: str | None = None) -> list[Block]:
    """Every fenced block of a Markdown document, with the not-run mark before it, if any."""
    lines = (path.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, tag = m.group(1), m.group(2)
        j = i + 1
        while j < len(lines) and not lines[j].startswith(fence[0] * len(fence)):
            j += 1
        prev = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
        mark = NOT_RUN.search(prev)
        b = Block(path, i + 1, tag, lines[i + 1:j], mark.group(1) if mark else None, body_start=i + 1)
        if tag == "console":
            b.commands = parse_console(b)
        elif tag in COMMAND_TAGS:
            b.commands = [Command("\n".join(b.body), [], 0, b.line + 1)]
        blocks.append(b)
        i = j + 1
    return blocks


def parse_console(b: Block) -> list[Command]:
    commands: list[Command] = []
    for n, line in enumerate(b.body):
        if line.startswith("$ "):
            m = EXIT.search(line)
            commands.append(Command(line[2:], [], int(m.group(1)) if m else 0, b.line + 1 + n))
        elif line.startswith("> ") and commands and not commands[-1].expected:
            commands[-1].text += "\n" + line[2:]
        elif commands:
            commands[-1].expected.append(line)
        elif line.strip():
            raise ValueError(f"{b.where}: output before the first '$ ' command: {line!r}")
    return commands


def indented_commands(path: Path) -> list[int]:
    """Lines of indented (unfenced) code that show a fleet command: every command goes in a
    fenced block, where the test finds it."""
    lines = path.read_text().splitlines()
    found, fenced = [], False
    for n, line in enumerate(lines):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and re.match(r"^( {4}|\t)\s*(\$ )?fleet\b", line) and n and not lines[n - 1].strip():
            found.append(n + 1)
    return found


# --- output ---

def normalize(line: str) -> str:
    """What varies from run to run, as one word: run ids, dates and times, hashes, key
    fingerprints, loopback addresses, pids; trailing blanks dropped."""
    line = re.sub(r"\b\d{8}-\d{6}-[0-9a-f]{4,}\b", "RUN-ID", line)
    line = re.sub(r"\b\d{4}-\d{2}-\d{2}\b", "DATE", line)
    line = re.sub(r"\b\d{2}:\d{2}:\d{2}(\.\d+)?\b", "TIME", line)
    line = re.sub(r"SHA256:[A-Za-z0-9+/]{43}", "SHA256:FINGERPRINT", line)
    line = re.sub(r"\b[0-9a-f]{64}\b", "HASH", line)
    line = re.sub(r"\b[0-9a-f]{8,63}\b", "HEX", line)
    line = re.sub(r"\b127\.\d+\.\d+\.\d+\b", "ADDR", line)
    line = re.sub(r"\bpid \d+", "pid PID", line)
    line = re.sub(r"(\w)-\d+(?=[._])", r"\1-PID", line)  # report names: HOST-%p
    line = re.sub(r"\d+ bytes\b", "N bytes", line)
    line = re.sub(r"/tmp/fleet-sshd-\w+/", "/tmp/HARNESS/", line)
    line = re.sub(r"/tmp/nsys-report-\w+", "/tmp/nsys-report-XXXX", line)
    line = re.sub(r"\b\d+(\.\d+)? ?(s|ms|GiB|MiB|KiB|GB|MB|kB|B)\b", r"N\2", line)
    return line.rstrip()


def _line_matches(pattern: str, actual: str) -> bool:
    parts = [re.escape(p) for p in pattern.split("...")]
    return re.fullmatch(".*".join(parts), actual, re.S) is not None


def matches(expected: list[str], actual: list[str]) -> bool:
    """Expected lines (with ``...``) against actual ones, both normalized."""
    exp = [normalize(e) for e in expected]
    act = [normalize(a) for a in actual]
    while exp and not exp[-1]:
        exp.pop()
    while act and not act[-1]:
        act.pop()

    def go(i: int, j: int) -> bool:
        if i == len(exp):
            return j == len(act)
        if exp[i].strip() == "...":
            return any(go(i + 1, k) for k in range(j, len(act) + 1))
        return j < len(act) and _line_matches(exp[i], act[j]) and go(i + 1, j + 1)

    return go(0, 0)


# --- running ---

@dataclass
class Result:
    command: Command
    status: int
    output: list[str]

    def problem(self) -> str | None:
        if self.status != self.command.status:
            return f"exit status {self.status}, the doc expects {self.command.status}"
        if self.command.expected and not matches(self.command.expected, self.output):
            return "output differs from the doc"
        return None


class Shell:
    """Runs blocks as a reader's shell would: ``cwd`` and exported variables carry over from one
    block to the next; ``home`` stands for ``~`` in the output."""

    def __init__(self, cwd: Path, env: dict[str, str], home: Path, timeout: float = 120):
        self.cwd, self.env, self.home, self.timeout = cwd, dict(env), home, timeout
        self.state = cwd.parent / f".shell-state-{os.getpid()}"

    def run(self, block: Block) -> list[Result]:
        keep = f"export -p > {self.state}.env; pwd > {self.state}.cwd"
        script = [f"cd {shlex.quote(str(self.cwd))}"]
        if block.tag == "console":
            for n, c in enumerate(block.commands):
                script += [c.text, f"printf '\\n{MARK} %s %s\\n' {n} $?"]
            script.append(keep)
        else:  # run whole: the first command that fails ends it, with its status
            script += [f"trap 'printf \"\\n{MARK} 0 %s\\n\" $?; {keep}' EXIT", "set -e", block.commands[0].text]
        master, slave = pty.openpty()
        os.write(master, b"y\n" * 16)  # a person answering every prompt with y
        try:
            p = subprocess.run(["bash", "--norc", "--noprofile", "-c", "\n".join(script)], stdin=slave,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env,
                               timeout=self.timeout, text=True, start_new_session=True)
        finally:
            os.close(slave)
            os.close(master)
        self._carry_over()
        return self._results(block, p.stdout)

    def _carry_over(self) -> None:
        env_file, cwd_file = Path(f"{self.state}.env"), Path(f"{self.state}.cwd")
        if cwd_file.exists():
            self.cwd = Path(cwd_file.read_text().strip())
        if env_file.exists():
            env = {}
            for line in env_file.read_text().splitlines():
                m = re.match(r'declare -x ([A-Za-z_][A-Za-z0-9_]*)="(.*)"$', line)
                if m:
                    env[m.group(1)] = m.group(2).encode().decode("unicode_escape")
            env.pop("OLDPWD", None)
            env.pop("PWD", None)
            env.pop("SHLVL", None)
            env.pop("_", None)
            self.env = env

    def _results(self, block: Block, out: str) -> list[Result]:
        out = out.replace(str(self.home), "~")
        out = re.sub(r"\[y/N\]: ", "[y/N]: y\n", out)  # the y typed at a prompt, as a terminal echoes it
        results, pending = [], []
        for line in out.split("\n"):
            m = re.fullmatch(f"{MARK} (\\d+) (\\d+)", line)
            if m:
                if pending and pending[-1] == "":
                    pending.pop()
                results.append(Result(block.commands[int(m.group(1))], int(m.group(2)), pending))
                pending = []
            else:
                pending.append(line)
        done = {id(r.command) for r in results}
        results += [Result(c, -1, pending if i == 0 else []) for i, c in
                    enumerate(c for c in block.commands if id(c) not in done)]
        return results


def record(path: Path, results: dict[int, list[Result]]) -> None:
    """Write the actual output into the console blocks of ``path`` (``FLEET_DOCS_RECORD=1``):
    re-recorded transcripts, to be read over before committing."""
    lines = path.read_text().splitlines()
    for b in sorted(read_blocks(path), key=lambda b: -b.line):
        if b.tag != "console" or b.line not in results:
            continue
        body = []
        for r in results[b.line]:
            first, *rest = r.command.text.split("\n")
            body += ["$ " + first, *("> " + x for x in rest), *r.output]
        lines[b.body_start:b.body_start + len(b.body)] = body
    path.write_text("\n".join(lines) + "\n")
