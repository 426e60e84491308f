"""``fleet reports ranks``: which rank of a run was slow, and why (docs/ranks.md), from its
exports in the store or from the run recorded on an H200 (``--example``); as a table, JSON, or one
HTML page."""

from __future__ import annotations

import click

from .context import fail, store_option, stored_run
from .output import echo_json, json_option
from .terminal import echo


@click.command("ranks")
@click.argument("run_id", required=False)
@store_option
@click.option("--example", type=click.Path(file_okay=False), metavar="DIR",
              help="Try it on the two ranks' exports recorded on an H200, in DIR "
                   "(tests/fixtures/ranks-h200/recorded of fleet's checkout), filed in a store of "
                   "their own: yours is neither read nor written.")
@click.option("--sync-range", metavar="NAME",
              help="The NVTX range around the workload's blocking sync (e.g. a gloo all-reduce); "
                   "default: the NCCL kernels.")
@click.option("--sync-call", metavar="NAME",
              help="A blocking call that is the sync, from the OS or CUDA runtime trace (e.g. "
                   "pthread_cond_wait, cudaStreamSynchronize).")
@click.option("--step-range", metavar="NAME", default="step", show_default=True,
              help="The NVTX range the workload marks each step with.")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="A `fleet top --record FILE` kept beside the run: each rank's GPU's clocks, "
                   "throttling and tenants in it join what fleet recorded on the node.")
@click.option("--html", "html_out", type=click.Path(dir_okay=False),
              help="Also write the picture as one HTML page.")
@json_option
def reports_ranks(run_id, store_root, example, sync_range, sync_call, step_range, record_path,
                  html_out, as_json):
    """Which rank was slow, and why: per rank GPU kernel, collective and idle time, NVTX steps,
    rank-seconds lost waiting, how often it arrived last; a verdict on each straggler. RUN_ID, or
    --example DIR to try it on a run recorded on an H200."""
    if sync_range and sync_call:
        fail("--sync-range and --sync-call name the sync two ways: give one")
    if (example is None) == (run_id is None):
        fail("give a RUN-ID, or --example DIR to try it on the run recorded on an H200 (DIR: "
             "tests/fixtures/ranks-h200/recorded of fleet's checkout)" if run_id is None else
             f"give RUN-ID {run_id} or --example, not both")
    record = _record(record_path) if record_path else None
    found = _example_ranks(example, sync_range, sync_call, step_range,
                           record) if example is not None else \
        _run_ranks(store_root, run_id, sync_range, sync_call, step_range, record)
    if example is not None:
        from ..analysis.example import RUN_ID

        run_id = RUN_ID
    if html_out:
        from ..analysis import page

        try:
            _write_page(html_out, page.render(run_id, found))
        except OSError as e:
            fail(f"could not write {html_out}: {e.strerror or e}")
    if as_json:
        return echo_json(dict(found.to_json(), run_id=run_id, html=html_out))
    from .output import print_ranks

    print_ranks(run_id, found)
    if html_out:
        echo(f"page: {html_out}")


def _record(path: str):
    from ..analysis import record

    try:
        return record.read(path)
    except record.RecordError as e:
        fail(str(e))


def _run_ranks(store_root, run_id: str, sync_range, sync_call, step_range, record=None):
    from .. import store
    from ..analysis import load, ranks
    from .reports_team import local_store

    store_root = local_store(store_root, [run_id])
    m = stored_run(store_root, run_id)
    try:
        return load.analyze_run(store.root(store_root), m, ranks.Source(sync_range, sync_call),
                                step_range, record)
    # the run, or an export in it, not in the store (an unreadable export: a FleetError)
    except LookupError as e:
        fail(str(e))


def _example_ranks(exports: str, sync_range, sync_call, step_range, record=None):
    """The recorded H200 run's analysis from ``exports``, in a store of its own, removed after (its
    NVTX sync range unless another sync is named)."""
    import tempfile
    from pathlib import Path

    from ..analysis import example, load, ranks

    if (why := example.missing(Path(exports))):
        fail(why)
    with tempfile.TemporaryDirectory(prefix="fleet-example-") as tmp:
        root = Path(tmp) / "store"
        source = ranks.Source(sync_range or (None if sync_call else example.SYNC_RANGE), sync_call)
        return load.analyze_run(root, example.filed(root, Path(exports)), source, step_range,
                                record)


def _write_page(path: str, text: str) -> None:
    """A page written beside its final name (never through a link) and renamed into place."""
    import os

    tmp = f"{path}.{os.getpid()}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644),
                   "w") as f:
        f.write(text)
    os.replace(tmp, path)
