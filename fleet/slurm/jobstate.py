"""What Slurm says of its jobs and of itself, read into types: a job's state (``JobState``) from
``squeue`` (fixed-format text, or ``--json`` whose field names differ between Slurm versions),
``sacct`` and ``scontrol``; the cluster's facts (``ClusterInfo``); the job's shape as a run's
manifest keeps it (``JobShape``); and the marks the job left in its run folder (``JobMarks``).
Reading is defensive: a field missing or of another shape reads as unknown, never as a crash."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Iterable

from ..policy.readers import int_of, ints_of, str_of
from ..rundir import RunDir

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "REVOKED", "SPECIAL_EXIT", "GONE"}
DEFAULT_MIN_JOB_AGE = 300  # Slurm's default MinJobAge: how long slurmctld keeps an ended job


@dataclass
class JobState:
    job_id: str
    state: str                      # Slurm's state name, or GONE (left every record)
    reason: str | None = None
    nodes: str | None = None
    elapsed: str | None = None
    exit_code: str | None = None
    # times the job went back in line after it ran (as fleet watched it)
    requeues: int = 0

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


@dataclass
class ClusterInfo:
    version: tuple[int, int]
    version_text: str
    home: str
    accounting: bool
    # ClusterName from slurm.conf, as the cluster's own scontrol says it
    name: str | None = None
    min_job_age: int = DEFAULT_MIN_JOB_AGE  # seconds slurmctld remembers an ended job
    python: str | None = None       # the login node's `command -v python3`, when absolute
    # sinfo's GRES of the partition asked about, one per configuration
    gres: tuple[str, ...] = ()


def no_reason(reason) -> str | None:
    """Slurm's reason for a job's state, or None where Slurm says there is none (squeue and
    scontrol write the word "None", or "(null)")."""
    return None if reason in (None, "", "None", "(null)") else str(reason)


def parse_squeue_text(text: str) -> dict[str, JobState]:
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 2 and parts[0]:
            job, state, reason, nodes, elapsed = (parts + [None] * 5)[:5]
            out[job] = JobState(job, state.split()[0] if state else "UNKNOWN", no_reason(reason),
                                nodes or None, elapsed or None)
    return out


def _first(value):
    """v0.0.38 gives a state as a string; v0.0.40 on as a list of flags; some fields as {"number":
    N}."""
    if isinstance(value, list):
        return value[0] if value else None
    if isinstance(value, dict) and "number" in value:
        return value["number"] if value.get("set", True) else None
    return value


def parse_squeue_json(text: str) -> dict[str, JobState]:
    doc = json.loads(text)
    out = {}
    for job in doc.get("jobs") or []:
        job_id = str(_first(job.get("job_id")))
        state = _first(job.get("job_state")) or "UNKNOWN"
        out[job_id] = JobState(job_id, str(state), no_reason(job.get("state_reason")),
                               job.get("nodes") or None)
    return out


def parse_sacct(text: str) -> dict[str, JobState]:
    """``sacct -n -P -X -o JobID,State,ExitCode,NodeList,Elapsed``; "CANCELLED by 0" reads
    CANCELLED."""
    out = {}
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) >= 5 and parts[0]:
            out[parts[0]] = JobState(parts[0], parts[1].split()[0], None, parts[3] or None,
                                     parts[4] or None, parts[2] or None)
    return out


def parse_scontrol(text: str) -> JobState | None:
    """``scontrol -o show job ID``: one line of KEY=VALUE."""
    fields = dict(re.findall(r"(\w+)=(\S*)", text))
    if "JobId" not in fields:
        return None
    return JobState(fields["JobId"], fields.get("JobState", "UNKNOWN"),
                    no_reason(fields.get("Reason")),
                    fields.get("NodeList") or None, fields.get("RunTime"), fields.get("ExitCode"))


@dataclass(frozen=True)
class JobShape:
    """The job's shape as a Slurm run's manifest keeps it (``SlurmInfo.spec``, the checked
    JobSpec): what the run's end reads of it, read here alone."""
    launcher: str = "srun"
    ranks: tuple[int, ...] | None = None        # --ranks: the ranks chosen (not Ray's patterns)
    ntasks: int | None = None
    nodes: int | None = None
    ntasks_per_node: int | None = None

    @classmethod
    def read(cls, spec: dict) -> "JobShape":
        ranks = spec.get("ranks")  # JSON's list once read back; the spec's tuple in this process
        return cls(str_of(spec.get("launcher")) or "srun",
                   ints_of(list(ranks)) if isinstance(ranks, (list, tuple)) else None,
                   int_of(spec.get("ntasks")), int_of(spec.get("nodes")),
                   int_of(spec.get("ntasks_per_node")))


@dataclass(frozen=True)
class JobMarks:
    """The job's own files in its run folder, as ``SlurmClient.read_results`` lists them: what the
    batch script marked of its end (its exit status, a stop before the time limit, its own check's
    refusal, a stop fleet asked for, the times Slurm started it again), sbatch's log, Ray's files
    and the reports of ranks killed before their result (each listed as SIZE SHA256 PATH), and
    the result files not taken, with why. The job can write any of them: a mark that is not of
    its shape reads as absent."""
    job_exit: int | None = None
    stopped: bool = False
    script_refused: bool = False
    stop_asked: bool = False
    restarts: int = 0
    log: str = ""
    ray: tuple[str, ...] = ()
    orphans: tuple[str, ...] = ()
    refused_results: tuple[tuple[str, str], ...] = ()

    @classmethod
    def read(cls, listed: list[tuple[str, str]],
             refused_results: Iterable[tuple[str, str]] = ()) -> "JobMarks":
        """From the listing's (name, value) lines: a job file's name and its first bytes, or
        ``slurm``, ``ray`` or ``orphan`` and a file as listed (of sbatch's logs, the last)."""
        marks = {name: value for name, value in listed if name not in ("ray", "orphan")}
        exit_mark = marks.get(RunDir.JOB_EXIT, "")
        restarts = marks.get(RunDir.JOB_RESTARTS, "")
        return cls(int(exit_mark) if re.fullmatch(r"-?[0-9]+", exit_mark) else None,
                   RunDir.JOB_STOPPED in marks, RunDir.JOB_REFUSED in marks,
                   RunDir.JOB_STOP_ASKED in marks,
                   int(restarts) if re.fullmatch(r"[0-9]{1,5}", restarts) else 0,
                   marks.get("slurm", ""), tuple(v for k, v in listed if k == "ray"),
                   tuple(v for k, v in listed if k == "orphan"), tuple(refused_results))
