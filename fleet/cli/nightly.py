"""Nightly profiling from the command line: ``fleet run``, ``fleet schedule``, ``fleet nightly
report``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .. import exitcodes
from .parsing import Day
from .context import Context, fail, store_option, push_when_done
from .output import echo_json, json_option
from .terminal import echo

if TYPE_CHECKING:
    from ..store.manifest import RunManifest


def loaded_playbook(path: str):
    from ..nightly.playbook import load

    return load(path)  # a PlaybookError is a FleetError: the CLI prints file:line and exits 2


def run_playbook(obj: Context, path: str, store_root, dry_run: bool, poll: float = 5.0, *,
                 as_json: bool = False, quiet: bool = False) -> "RunManifest":
    """The playbook's run, its progress printed as ``fleet profile`` prints it (with ``as_json``,
    the workload's lines on stderr), or nothing while it runs when ``quiet`` (a schedule's
    firing)."""
    from ..nightly import run as nightly
    from .. import store
    from ..wrapping.containers import ContainerError
    from ..slurm.jobs import SlurmError, SlurmRejected
    from .output import byte_progress
    from .profile import workload_writer
    from .slurm import job_state_printer

    pb = loaded_playbook(path)

    def go(fan, gathering):
        progress = nightly.Progress() if quiet else nightly.Progress(
            write=workload_writer(as_json), on_state=job_state_printer(as_json),
            gathering=gathering)
        return nightly.run_playbook(fan, obj.inventory, pb, embedded=not obj.inventories,
                                    store_root=store.root(store_root), dry_run=dry_run, poll=poll,
                                    progress=progress)

    try:
        with byte_progress(enabled=not (as_json or quiet or dry_run)) as gathering:
            return obj.over_pool(lambda fan: go(fan, gathering))
    except SlurmRejected as e:
        fail(str(e), exitcodes.USAGE)
    except (SlurmError, ContainerError) as e:
        fail(str(e), exitcodes.of_error(e))


@click.command("run")
@click.argument("playbook", type=click.Path(exists=True, dir_okay=False))
@store_option
@click.option("--dry-run", is_flag=True,
              help="What would run (the batch script on Slurm); nothing is submitted.")
@json_option
@click.pass_obj
def run_cmd(obj: Context, playbook, store_root, dry_run, as_json):
    """Run PLAYBOOK once, as fleet profile would (its progress as it prints it), and catalogue its
    metrics."""
    from .profile import show_lab_run

    m = run_playbook(obj, playbook, store_root, dry_run, as_json=as_json)
    if as_json:
        echo_json(m.to_json())
    elif dry_run and m.slurm is not None:
        echo(m.slurm.script, nl=False)
    # each host's plan, or its outcome, and the run's line, as `fleet profile` says them
    elif m.slurm is None:
        show_lab_run(m, store_root, dry_run, as_json)
    else:
        from ..slurm import runs

        echo(runs.render(m), nl=False)
    if not (as_json or dry_run):
        from ..nightly.report_html import scale

        for row in m.playbook_run.metrics:
            flags = f"  (flagged: {'; '.join(row.flags)})" if row.flags else ""
            div, unit = scale(row.metric)
            echo(f"  {row.metric} on {row.device}: {row.value / div:.4g} {unit}{flags}")
    push_when_done(store_root, m, as_json)
    sys.exit(exitcodes.for_run(m))


@click.group()
def nightly():
    """Trends and verdicts over the catalogued runs of playbooks."""


@nightly.command("report")
@click.argument("playbooks", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--since", type=Day(), help="Only runs started on or after this date (YYYY-MM-DD).")
@click.option("--out", default="fleet-nightly.html", show_default=True,
              type=click.Path(dir_okay=False), help="The HTML page (its JSON twin goes beside it).")
@click.option("--notify",
              help="Run this shell command with the summary on its stdin (mail, chat webhook).")
@store_option
@json_option
def nightly_report(playbooks, since, out, notify, store_root, as_json):
    """One static HTML page: a trend plot per metric and device, the verdicts, the change points
    (each labelled code, environment or unexplained), links to the reports. Exit 7 for a code
    regression, 11 for a recent slowdown nothing recorded explains."""
    from ..nightly import run as nightly_mod
    from .. import store

    summary = nightly_mod.report(store.root(store_root), [loaded_playbook(p) for p in playbooks],
                                 Path(out), since, history=_history(store_root))
    text = "\n".join(_report_lines(summary) + [f"report: {out}"]) + "\n"
    if as_json:
        echo_json(summary)
    else:
        echo(text, nl=False)
    if notify:
        subprocess.run(notify, shell=True, input=text, text=True, check=False)
    sys.exit(exitcodes.for_nightly_report(unexplained=bool(summary["unexplained"]),
                                          regressions=bool(summary["regressions"])))


def _report_lines(summary: dict) -> list[str]:
    """Per playbook: its verdicts, then each change point once (with what changed), then what the
    morning calls for: REGRESSION, UNEXPLAINED and ENVIRONMENT lines."""
    from ..nightly.report_plot import shown_metric
    from ..visible import visible

    lines = []
    for p in summary["playbooks"]:
        lines.append(f"{p['name']}: {len(p['verdicts'])} metric(s) over {p['runs']} run(s); " +
                     ", ".join(f"{v['verdict']}: {shown_metric(v['metric'])} ({v['device']})"
                               for v in p["verdicts"]))
        kept = {c["run_id"] for s in p["changes"] for c in s["contaminated"]}
        for s in p["changes"]:
            for c in s["changes"]:
                what = "; ".join(c["changed"]) or "nothing recorded changed"
                lines.append(f"  change: {shown_metric(s['metric'])} ({s['device']}) "
                             f"{c['rel']:+.1%} at run {c['run_after']}, "
                             f"{c['label']}{' (recent)' if c['recent'] else ''}: {what}")
        if kept:
            lines.append(f"  kept out as contaminated: {len(kept)} run(s) "
                         f"({', '.join(sorted(kept))})")
    lines += [f"REGRESSION {r}" for r in summary["regressions"]] + \
        [f"UNEXPLAINED {r}" for r in summary["unexplained"]] + [f"ENVIRONMENT {r}"
                                                                for r in summary["environment"]]
    # kernel names and devices come from the nodes: one line each
    return [visible(line) for line in lines]


@nightly.command("confirm")
@click.argument("playbook", type=click.Path(exists=True, dir_okay=False))
@click.option("--change", "run_after", metavar="RUN",
              help="The change point at this run (the first after it; "
              "default: the newest change where the workload's version changed).")
@click.option("--versions", nargs=2, metavar="A B", help="Or two versions of the workload, named.")
@click.option("--rounds", type=click.IntRange(1, 5), default=1, show_default=True,
              help="A/B/B/A this many times (two rounds: 8 runs, and a p-value of 1/70 at best).")
@click.option("--gpu", "gpu", type=click.IntRange(0),
              help="Lab servers: the GPU (NVML index) every run uses.")
@click.option("--since", type=Day(),
              help="Only the history from this date (YYYY-MM-DD) is searched for the change.")
@store_option
@json_option
@click.pass_obj
def nightly_confirm(obj: Context, playbook, run_after, versions, rounds, gpu, since, store_root,
                    as_json):
    """Rerun the workload's versions either side of a change, A/B/B/A on the same GPU, and say
    whether the change holds. The playbook's checkout command puts the workload at a version (its
    version command checks it); the workload is put back at its version afterwards. These runs are
    kept with their reports, out of the history. Exit 0: it holds; 12: it did not, or the runs could
    not tell; 1: a run or a checkout failed."""
    from ..nightly import confirm as verdicts
    from ..nightly.confirm_runs import Confirmation, confirm
    from .. import store
    from .terminal import say

    pb = loaded_playbook(playbook)
    target = _confirm_target(pb, versions, run_after, gpu, since, store_root)
    if not as_json:
        say(f"confirming {target.before} (A) against {target.after} (B)" +
            (f", the change at run {target.run_after}" if target.run_after else "")
            + f": {'ABBA' * rounds}")

    def said(side: str, version: str, m) -> None:
        if not as_json:
            say(f"  {side} {version}: run {m.run_id} {m.status}")

    done = Confirmation(target)

    try:
        obj.over_pool(lambda fan: confirm(fan, obj.inventory, pb, done,
                                          embedded=not obj.inventories,
                                          store_root=store.root(store_root), rounds=rounds,
                                          gpus=(gpu,) if gpu is not None else None, on_run=said))
    except verdicts.ConfirmError as e:  # before anything was checked out or run
        fail(str(e))
    # the runs stopped; where the workload was left is said before leaving
    except KeyboardInterrupt:
        _say_confirmed(done, [], as_json=False, err=True)
        raise
    found = [] if done.error else verdicts.judge_all(done.measured, target,
                                                     float(pb.thresholds["change"]))
    _say_confirmed(done, found, as_json)
    sys.exit(exitcodes.for_confirm(failed=bool(done.error or done.restore_error),
                                   held=verdicts.holds(found)))


def _confirm_target(pb, versions, run_after, gpu, since, store_root):
    """What ``nightly confirm`` reruns (its options checked, each a one-line error, exit 2, before
    anything is checked out): the two versions named, or the change found in the history."""
    from ..nightly import confirm as verdicts
    from ..nightly.confirm_runs import checked_version, needs_checkout, target_from_history

    if versions and versions[0] == versions[1]:
        fail(f"--versions: A and B are both {versions[0]}; name two versions")
    if versions and (run_after or since):
        fail("--change and --since find the versions in the history; --versions names them: "
             "give one")
    if gpu is not None and pb.on_slurm:
        fail("--gpu picks a GPU on lab servers; on Slurm the job's GPUs are Slurm's to give")
    try:
        needs_checkout(pb)
        target = (verdicts.Target(*versions) if versions
                  else target_from_history(_history(store_root), pb, run_after, since))
        checked_version(target.before), checked_version(target.after)
    except verdicts.ConfirmError as e:
        fail(str(e))
    return target


def _history(store_root):
    """Where a playbook's history is read: the team store where one is named (every run of the
    playbook that you may see), else the embedded one."""
    from ..nightly.run import EmbeddedHistory
    from .. import store
    from .reports_team import team_store

    team = team_store()
    if team is None:
        return EmbeddedHistory(store.root(store_root))
    from ..store.team.read import TeamHistory

    return TeamHistory(team)


def _say_confirmed(done, found, as_json: bool, err: bool = False) -> None:
    """The verdicts, the error where the runs stopped, and where the workload was left (each one
    line: versions and devices come from the nodes)."""
    from dataclasses import asdict

    from ..nightly.report_html import scale
    from ..nightly.report_plot import shown_metric
    from .terminal import say

    if as_json:
        return echo_json({"target": asdict(done.target), "runs": [dict(zip(("side", "version",
                                                                            "run_id"), r))
                                                                  for r in done.runs],
                          "verdicts": [asdict(v) for v in found], "left_at": done.left_at,
                          "error": done.error, "restore_error": done.restore_error})
    for v in found:
        div, unit = scale(v.metric)
        values = "; ".join(f"{side} " + ", ".join(f"{x / div:.4g}" for x in xs)
                           for side, xs in (("A", v.a), ("B", v.b)))
        say(f"{v.verdict}: {shown_metric(v.metric)} ({v.device}): {v.why}" +
            (f" (p = {v.p_value:.3g})" if v.p_value is not None else "") +
            (f"; {values} {unit}" if values else ""), err)
    for line in (done.error, done.restore_error):
        if line:
            say(f"error: {line}", err)
    if done.left_at:
        say(f"the workload is back at {done.left_at}", err)
