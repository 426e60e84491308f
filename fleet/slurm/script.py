"""The batch script of a profiled job, rendered from the request: pure text, no I/O.

What the script does, in order: ``#SBATCH`` lines from the options; the
user's command kept as a bash array of single-quoted words (so it reaches the
task byte for byte, whatever its quoting); fleet's task wrapper
(:mod:`fleet.agent.task`) put at the real exec point, which is each Slurm
task for ``srun``, each worker for ``torchrun --no-python`` and each rank for
``mpirun``; and a ``USR1`` trap. ``--signal=B:USR1@N`` makes Slurm signal the
batch shell N seconds before the time limit (it reaches only that shell), and
the trap sends SIGTERM to the job's steps with ``scancel``: every profiler
then stops its application and finishes its report before Slurm's SIGTERM and
SIGKILL at the limit. The job's exit status is left in ``job.exit``.

Every value was checked against what sbatch takes before (:func:`.options.checked`, which
alone makes the ``CheckedJobSpec`` rendered here) and is written through
:func:`fleet.safenames.quote` on its way into the script. fleet's own
``#SBATCH`` lines come first: sbatch stops reading them at the first command.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from .. import policy
from ..rundir import RunDir
from ..safenames import quote, sbatch_word
from . import launchers
from .options import CheckedJobSpec
from .spec import JobSpec  # noqa: F401 (where callers have always found it)

AGENT_FILE = RunDir.AGENT
SCRIPT_FILE = RunDir.SCRIPT
REQUEST_FILE = RunDir.REQUEST  # read by fleet's Slurm prolog (fleet/agent/slurmd.py)


@dataclass(frozen=True)
class JobFiles:
    """Where the job's files are on the cluster's shared filesystem."""
    run_dir: str                            # absolute; the agent, the script, the reports
    report_root: str                        # run_dir's parent: the task's report_dir
    # on the compute nodes, by absolute path where fleet found one
    python: str = "python3"
    tools: dict = field(default_factory=dict)  # nsys_path / ncu_path from the inventory
    # node-local directory the ranks write to, copied over at the end
    scratch: str | None = None
    # the nodes run fleet's prolog: a rank without its verdict refuses counters
    prolog: bool = False
    python_note: str = ""                   # where ``python`` came from, said in the job's log
    # the run's: each rank's result carries it (fleet/slurm/results.py)
    nonce: str = ""

    @property
    def task_root(self) -> str:
        return self.scratch or self.report_root


def task_args(req, spec: CheckedJobSpec, files: JobFiles) -> dict:
    """What every task's agent is told (fleet/agent/task.py reads it)."""
    # The command is the script's own array, after the agent's arguments: not repeated here.
    return {"mode": "task", "request": dict(req.for_rank(), command=[]),
            "report_dir": files.task_root,
            "launcher": spec.launcher, "ranks": list(spec.ranks) if spec.ranks is not None
            else None,
            "tools": dict(files.tools), "prolog_expected": files.prolog,
            "stop_before": spec.stop_before,
            **({"nonce": files.nonce} if files.nonce else {}),
            **({"window": list(req.window)} if req.window else {})}


def _window_lines(req) -> list[str]:
    """With --window: the moment the window counts from, one for every rank (each rank's nsys is
    given the delay from its own start to START seconds after it: fleet/agent/task.py)."""
    if not req.window:
        return []
    return ["# --window counts from here, the same moment for every rank, wherever srun starts it.",
            "FLEET_WINDOW_FROM=$(date +%s)",
            "export FLEET_WINDOW_FROM",
            "case ${SLURM_EXPORT_ENV:-ALL} in [Aa][Ll][Ll]*) ;; "
            "*) export SLURM_EXPORT_ENV=\"$SLURM_EXPORT_ENV,FLEET_WINDOW_FROM\" ;; esac"]


def request_doc(req, files: JobFiles) -> dict:
    """What the job asks of a node's fleet prolog (``REQUEST_FILE`` in the run's directory): only
    *whether* to hold the owned sysctls and pause DCGM; the values are the node's own."""
    return {"fleet": 1, "run_id": req.run_id, "tool": req.tool, "allow_own": req.allow_own,
            "sysctls": policy.held_sysctls(req.tool), "pause_dcgm": req.pause_dcgm,
            "gpu_metrics": req.gpu_metrics}


def sbatch_lines(req, spec: CheckedJobSpec, files: JobFiles) -> list[str]:
    """fleet's own options first, then the job's shape, then ``--sbatch-arg``: every value checked
    (``options.checked``) and quoted, so each is one ``#SBATCH`` line that sbatch reads as bash
    would."""
    _require_checked(spec)
    run_dir = "the run directory (report_dir of the login host)"
    # The job starts in the run's directory, where its request is: that is how a node's prolog
    # (fleet slurm install) sees that the job opted in. The command runs in the workdir.
    opts: list[str] = [f"--job-name={sbatch_word(f'fleet-{req.run_id}', 'the run id')}",
                       f"--output={sbatch_word(RunDir(files.run_dir).batch_log, run_dir)}",
                       f"--signal=B:USR1@{spec.stop_before}",
                       f"--chdir={sbatch_word(files.run_dir, run_dir)}"]
    for name, value in (("partition", spec.partition), ("nodes", spec.nodes),
                        ("ntasks", spec.ntasks),
                        ("ntasks-per-node", spec.ntasks_per_node), ("gpus", spec.gpus),
                        ("gres", spec.gres),
                        ("time", spec.time), ("account", spec.account), ("qos", spec.qos)):
        if value is not None:
            opts.append(f"--{name}={sbatch_word(value, f'--{name}')}")
    if policy.exclusive_node(spec.exclusive, req.uses_counters):
        opts.append("--exclusive")
    opts += [sbatch_word(a, "--sbatch-arg") for a in spec.sbatch_args]
    return [f"#SBATCH {o}" for o in opts]


def _array(name: str, words) -> str:
    return f"{name}=(" + " ".join(quote(w, "the command", lines=True) for w in words) + ")"


def _copy_back(files: JobFiles) -> list[str]:
    """One step on every node: its ranks' files from node-local scratch to the shared run directory
    (the scratch copy goes only once the copy succeeded)."""
    scratch = quote(f"{files.scratch}/{os.path.basename(files.run_dir)}", "slurm_scratch")
    return ["# Reports were written to node-local scratch: bring each node's "
            "to the shared run directory.",
            "srun --ntasks-per-node=1 --nodes=\"$SLURM_JOB_NUM_NODES\" --kill-on-bad-exit=0 sh -c "
            + quote(f'd={scratch}/"$SLURMD_NODENAME"; [ ! -d "$d" ] || '
                          f'{{ cp -a "$d" "$1"/ && rm -rf "$d"; }}') + ' sh "$RUN_DIR"']


def _python_check(files: JobFiles) -> list[str]:
    """The agent's Python, checked on the first compute node before any rank starts, and said in
    the job's log: a job under --export=NONE has no PATH, so it is named by absolute path."""
    said = quote(f" ({files.python_note})",
                 "the agent Python's origin") if files.python_note else ""
    return [f"FLEET_PYTHON={quote(files.python, 'the agent Python (ansible_python_interpreter)')}",
            "if command -v -- \"$FLEET_PYTHON\" >/dev/null 2>&1; then",
            "    echo \"fleet: the agent runs with $FLEET_PYTHON on "
            f"${{SLURMD_NODENAME:-this node}}\"{said} >&2",
            "else",
            "    echo \"fleet: $FLEET_PYTHON, the agent's Python, is not on compute node "
            "${SLURMD_NODENAME:-?}: set ansible_python_interpreter to the nodes' python3\" >&2",
            *launchers.REFUSE,
            "fi"]


def _require_checked(spec) -> None:
    # a caller's slip, not the user's: never rendered unchecked
    if not isinstance(spec, CheckedJobSpec):
        raise TypeError("a batch script is rendered from options.checked's "
                        f"CheckedJobSpec, not {type(spec).__name__}")


def _stop_trap() -> list[str]:
    """USR1 (sbatch --signal, before the time limit): each rank's profiler stopped with SIGTERM, so
    that its report is finished, and the moment marked."""
    return ["stop_profilers() {",
            "    echo \"fleet: time limit near: stopping the profilers (SIGTERM) so their reports "
            "are finished\" >&2",
            f"    date +%s > \"{launchers.IN_SCRIPT.job_stopped}\"",
            "    scancel --signal=TERM \"$SLURM_JOB_ID\"",
            "}",
            "trap stop_profilers USR1"]


def _job_end_lines() -> list[str]:
    """The job's end (FLEET_JOB_END), exported to every rank, under --export=NONE too."""
    return ["# The job's end, for each rank's nsys to stop its workload itself before that trap "
            "would",
            "# (--duration keeps the kernels that a signal loses).",
            "end=$(TZ=UTC SLURM_TIME_FORMAT=standard squeue -h -j \"$SLURM_JOB_ID\" -o %e "
            "2>/dev/null | head -1)",
            "case $end in [0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]T*) "
            "FLEET_JOB_END=$(TZ=UTC date -d \"$end\" +%s) ;; "
            "*) FLEET_JOB_END= ;; esac",
            "export FLEET_JOB_END",
            "# Under --export=NONE (or a list of names) srun passes its tasks Slurm's variables "
            "and those",
            "# named alone (SLURM_EXPORT_ENV, which sbatch sets from --export): add the job's "
            "end to them.",
            "case ${SLURM_EXPORT_ENV:-ALL} in [Aa][Ll][Ll]*) ;; "
            "[Nn][Oo][Nn][Ee]) export SLURM_EXPORT_ENV=FLEET_JOB_END ;; "
            "*) export SLURM_EXPORT_ENV=\"$SLURM_EXPORT_ENV,FLEET_JOB_END\" ;; esac"]


def _wait_lines() -> list[str]:
    """The step waited for: a trapped signal (USR1) ends `wait` early, so it waits again."""
    return ["step=$!",
            "# A trapped signal (USR1) ends `wait` early: wait again while the step lives.",
            "while :; do",
            "    wait \"$step\"; status=$?",
            "    [ \"$status\" -gt 128 ] && kill -0 \"$step\" 2>/dev/null || break",
            "done"]


def render(req, spec: CheckedJobSpec, files: JobFiles) -> str:
    """The exact batch script ``fleet profile --partition`` submits (and ``--dry-run`` prints);
    UnsafeValue (fleet.safenames) for a value from the cluster or the inventory that sbatch or
    bash would read as something else."""
    _require_checked(spec)
    # first: a bad value is named as the option it was given as
    directives = sbatch_lines(req, spec, files)
    agent = [files.python, RunDir(files.run_dir).agent,
             json.dumps(task_args(req, spec, files), separators=(",", ":"), sort_keys=True)]
    launch = launchers.launch(spec.launcher, list(req.command), agent, files.run_dir,
                              spec.container, tool=req.tool, profiler_args=req.profiler_args,
                              scratch=files.scratch,
                              actors=spec.ranks if spec.launcher == "ray" and spec.ranks else ())
    who = "every rank" if spec.ranks is None else (
        "actors " if spec.launcher == "ray" else "ranks ") + ",".join(map(str, spec.ranks))
    lines = ["#!/bin/bash", *directives,
             f"# fleet run {req.run_id}: {req.tool} on {who} ({spec.launcher}); reports and "
             "results go to",
             f"# {RunDir(files.run_dir).node('NODE').file(RunDir.label('N'))}.*, and the job's "
             f"exit status to {RunDir.JOB_EXIT}.",
             "set -u",
             f"RUN_DIR={quote(files.run_dir, 'the run directory')}",
             "# Slurm's count of this job's starts before this one (a requeue), for fleet to say "
             "even when",
             "# the job went back in line and ran again between two of its looks at the queue.",
             f"echo \"${{SLURM_RESTART_COUNT:-0}}\" > \"{launchers.IN_SCRIPT.job_restarts}\"",
             *_python_check(files),
             *([f"cd -- {quote(spec.workdir, '--workdir')} || exit 1"] if spec.workdir else []),
             _array("COMMAND", req.command),
             *launch.setup,
             "",
             *_stop_trap(),
             *_job_end_lines(),
             *_window_lines(req),
             "",
             f"{launch.line} &",
             *_wait_lines(),
             # The workload's status first: what runs after it (Ray's end, a copy back) may meet
             # the time limit.
             f"echo \"$status\" > \"{launchers.IN_SCRIPT.job_exit}\"",
             *launch.after,
             *(_copy_back(files) if files.scratch else []),
             "exit \"$status\"", ""]
    return "\n".join(lines)
