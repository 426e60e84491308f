"""Showing results to a person: folded outputs, progress, summaries.

rich is imported only when a terminal is there to draw on, so scripted and
``--json`` runs do not pay for it.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TextIO

import click

from ..hostlist import fold
from ..transport import Result
from ..visible import UNSEEN
from .terminal import echo, visible


def fold_results(results: Iterable[Result]) -> list[tuple[list[str], Result]]:
    """Hosts with identical output, status and error, grouped as ``clush -b`` does."""
    groups: dict[tuple, tuple[list[str], Result]] = {}
    for r in results:
        key = (r.stdout, r.stderr, r.exit_status, r.signal, r.error)
        groups.setdefault(key, ([], r))[0].append(r.host)
    return sorted(groups.values(), key=lambda g: (g[1].error is not None, g[1].exit_status or 0,
                                                  g[0][0]))


def _text(b: bytes) -> str:
    return b.decode("utf-8", "surrogateescape")


def print_gathered(results: list[Result], out: TextIO = sys.stdout,
                   err: TextIO = sys.stderr) -> None:
    """Every distinct output once, under the folded list of hosts that gave it. The command's own
    output is relayed as it came (as ssh and clush do: it is the command the user ran); fleet's
    lines around it (hosts, statuses, errors) are shown through :func:`visible`."""
    if len(results) == 1 and results[0].error is None:  # one host: behave like ssh
        r = results[0]
        out.write(_text(r.stdout))
        err.write(_text(r.stderr))
        return
    for hosts, r in fold_results(results):
        if r.error is not None and not r.stdout and not r.stderr:
            err.write(visible(f"{fold(hosts)}: {r.error}") + "\n")
            continue
        title = visible(f"{fold(hosts)} ({len(hosts)})")
        status = f" exit {r.exit_status}" if r.exit_status else ""
        status += f" signal {r.signal}" if r.signal else ""
        bar = "-" * max(15, len(title) + len(status))
        out.write(f"{bar}\n{title}{status}\n{bar}\n{_text(r.stdout)}")
        if r.stderr:
            out.write(_text(r.stderr))
        if r.error:
            err.write(visible(f"{fold(hosts)}: {r.error}") + "\n")
    out.flush()


def summary(results: list[Result]) -> str:
    ok = [r.host for r in results if r.ok]
    failed = [r.host for r in results if r.reached and not r.ok]
    unreachable = [r.host for r in results if not r.reached]
    parts = [f"{len(results)} hosts: {len(ok)} ok"]
    if failed:
        parts.append(f"{len(failed)} failed ({fold(failed)})")
    if unreachable:
        parts.append(f"{len(unreachable)} unreachable ({fold(unreachable)})")
    return ", ".join(parts)


# --json: every command prints one envelope, {"fleet_json": 1, "command": "reports ls", "data":
# ...}; a streaming command (exec) prints one per line as its results arrive. The version changes
# only when a field's meaning does; new fields may appear without it.
JSON_VERSION = 1

json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print the result as JSON, in fleet's "
                                "envelope (docs/user-guide.md).")


def command_name() -> str:
    """The command being run as typed after ``fleet``: ``reports ls``."""
    names, ctx = [], click.get_current_context(silent=True)
    while ctx is not None and ctx.parent is not None:
        names.insert(0, ctx.info_name)
        ctx = ctx.parent
    return " ".join(names)


def envelope(data) -> dict:
    return {"fleet_json": JSON_VERSION, "command": command_name(), "data": data}


def echo_json(data) -> None:
    """The command's one JSON document, written as it is encoded: for thousands of hosts the
    whole indented text at once (and the list of pieces it is joined from) would be the run's
    largest allocation."""
    encoder = json.JSONEncoder(indent=2, default=str, ensure_ascii=False)
    pieces: list[str] = []
    for piece in encoder.iterencode(envelope(data)):
        pieces.append(piece)
        if len(pieces) >= 4096:
            sys.stdout.write("".join(pieces))
            pieces.clear()
    pieces.append("\n")
    sys.stdout.write("".join(pieces))
    sys.stdout.flush()


def echo_json_line(data) -> None:
    """One line of a streaming command's output: a whole envelope, flushed at once."""
    sys.stdout.write(json.dumps(envelope(data), default=str, ensure_ascii=False) + "\n")
    sys.stdout.flush()


@contextmanager
def progress(total: int, label: str, enabled: bool) -> Iterator[Callable[[Result], None]]:
    """A live bar on stderr while results arrive; a no-op when not on a terminal."""
    if not enabled or total < 2 or not sys.stderr.isatty():
        yield lambda r: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    failed = 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[failed]}"), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total, failed="")

        def advance(r: Result) -> None:
            nonlocal failed
            failed += not r.ok
            bar.update(task, advance=1, failed=f"[red]{failed} failed" if failed else "")

        yield advance


class ByteProgress:
    """A bar of bytes brought home, whose total grows as nodes report what they have."""

    def __init__(self, bar, task):
        self._bar, self._task = bar, task

    def expect(self, n: int) -> None:
        self._bar.update(self._task, total=(self._bar.tasks[0].total or 0) + n, visible=True)

    def advance(self, n: int) -> None:  # called from transfer threads; rich locks
        self._bar.update(self._task, advance=n)


@contextmanager
def byte_progress(enabled: bool) -> Iterator[ByteProgress | None]:
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn

    with Progress(TextColumn("[bold]gathering"), BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), console=Console(stderr=True), transient=True) as bar:
        yield ByteProgress(bar, bar.add_task("gathering", total=0, visible=False))


# Colour of a status word in tables: what worked, what was held back, what broke.
STATUS_STYLES = {"ok": "green", "complete": "green", "finished-from-qdstrm": "green",
                 "COMPLETED": "green",
                 "RUNNING": "cyan", "PENDING": "yellow", "summary": "dim", "refused": "yellow",
                 "partial": "yellow", "running": "cyan", "submitted": "cyan", "missing": "red",
                 "failed": "red",
                 "unreachable": "red", "FAILED": "red", "CANCELLED": "yellow", "TIMEOUT": "red"}


def print_table(headers: list[str], rows: list[list[str]],
                status_column: int | None = None) -> None:
    """Rows under a header. On a terminal a rich table, its statuses coloured (never under
    NO_COLOR); piped, plain columns with whole values, for grep and awk, without importing rich.
    Every cell is shown through :func:`visible`: a kernel's, a host's or a
    GPU's name is another's."""
    columns = _shown_columns(headers, rows)
    if not (sys.stdout.isatty() or os.environ.get("FORCE_COLOR")):
        _print_plain(columns)
        return
    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, header_style="bold", pad_edge=False, show_edge=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in list(zip(*columns))[1:]:
        # Text(), not markup: paths and kernel names may hold brackets
        table.add_row(*(Text(c, style=STATUS_STYLES.get(c, "") if i == status_column else "")
                        for i, c in enumerate(row)))
    Console().print(table)


def _shown_columns(headers: list[str], rows: list[list[str]]) -> list[list[str]]:
    """The table as columns of text, the header first in each, every cell shown through
    :func:`visible`. Column by column, each step over a whole column at once: 100,000 rows in a
    quarter of the time row by row took (``fleet reports ls`` of a team's catalog)."""
    columns = [list(map(str, column)) for column in zip(headers, *rows)]
    # most tables hold no control character
    if any(UNSEEN.search("".join(column)) for column in columns):
        columns = [[visible(c) for c in column] for column in columns]
    return columns


def _print_plain(columns: list[list[str]]) -> None:
    """Columns padded to their widest cell, written in one echo: 100,000 rows in one write, each
    row laid out by one format call, not cell by cell."""
    widths = [max(map(len, column)) for column in columns]
    line = "  ".join(f"{{:<{w}}}" for w in widths).format
    echo("\n".join(line(*row).rstrip() for row in zip(*columns)))


def print_stats(found, top: int, full_names: bool = False) -> None:
    """``reports stats``: each section's table (one column of milliseconds per host or rank, or
    for one, its total, count and mean), then what each column lacks. The hosts not in the
    tables, and those in them whose status is not ok, are said under the title line."""
    from ..store.stats import said

    # a kernel or range name is the workload's: no escape sequence reaches the terminal
    shown = visible

    echo(f"run {found.run_id} ({found.tool}, {found.status}): top {top} by total time")
    if found.left_out:
        echo(shown(f"not in these tables: {said(found.left_out)}"))
    not_ok = [c for c in found.columns if c.status != "ok"]
    if not_ok:
        echo(shown(f"in them, though not ok: {said(not_ok)}"))
    for section in found.sections:
        echo(f"\n{section.title}")
        _print_section(section, section.top(top), found.columns, full_names)
        for label, why in section.notes.items():
            echo(f"{shown(label)}: {shown(why)}")


def _print_section(section, rows, columns, full_names: bool) -> None:
    """One section's table: for one column its total, count and mean; else a
    column a host or rank."""
    # the workload named its kernels and ranges: no escape sequence reaches the terminal
    shown = visible
    if rows and len(columns) == 1:
        print_table(["TOTAL ms", "COUNT", "MEAN ms", "NAME"],
                    [[f"{t / 1e6:.3f}", str(n), f"{t / 1e6 / n:.3f}" if n else "-",
                      shown(section.shown(name, full_names))] for name, by in rows
                     for t, n in by.values()])
    elif rows:
        print_table([f"{shown(c.label)} ms" for c in columns] + ["NAME"],
                    [[f"{by[c.label][0] / 1e6:.3f}" if c.label in by else "-" for c in columns]
                     + [shown(section.shown(name, full_names))] for name, by in rows])


def gpu_words(gpu: dict) -> str:
    """A rank's GPU in a table: NVML's index where fleet knows it, else its bus id."""
    return str(gpu["index"]) if gpu.get("index") is not None else str(gpu.get("bus") or "?")


def print_ranks(run_id: str, found) -> None:
    """``reports ranks``: one line for the run, a row per rank, then each straggler's verdict
    with the evidence of each cause."""
    shown = visible  # labels hold host names from the manifest, evidence an export's names
    echo(f"run {run_id}: {len(found.ranks)} ranks, {found.collectives} collectives from "
         f"{found.source}; {found.lost_s:.3f} rank-seconds lost waiting")
    print_table(["RANK", "HOST", "PID", "GPU", "KERNEL s", "KERNELS", "COLLECTIVE s", "IDLE s",
                 "STEP ms", "LOST rank-s", "LAST"],
                [[shown(r.label), shown(r.host), str(r.pid), gpu_words(r.gpu), f"{r.kernel_s:.3f}",
                  str(r.kernels), f"{r.collective_s:.3f}", f"{r.idle_s:.3f}",
                  f"{r.step_median_s * 1e3:.1f}" if r.step_median_s is not None else "-",
                  f"{r.lost_s:.3f}", f"{r.last} of {found.collectives}"] for r in found.ranks])
    for v in found.verdicts:
        echo(f"straggler: {shown(v['rank'])}, last in {v['last']} of {v['of']} collectives (waited "
             f"{v['wait_ms']:.1f} ms, the others {v['others_wait_ms']:.1f} ms; {v['lost_s']:.3f} "
             f"rank-seconds lost to it)")
        for c in v["causes"]:
            echo(f"  {c['cause']}: {shown(c['evidence'])}")
    for m in found.missing:
        echo(f"no export: {shown(m['label'])} ({shown(m['why'])})")
    for note in found.notes:
        echo(f"note: {shown(note)}")
