"""Every file of a run's folder, by name: the one place that spells them.

Shipped with the agent (standard library, Python 3.8) and imported by the controller, so the
node that writes a file and the controller that reads it name it alike. Names only, no I/O
(as submitit's ``JobPaths``). Where fleet parses a name back (the node and rank a result
file's place says, a Ray worker's host), the inverse sits beside the forward spelling.

A run's folder holds, on a lab server, each host's result and private TMPDIR beside its
reports; on Slurm, the job's own files (the agent, the script, the prolog's request, the exit
and stop marks, sbatch's log, Ray's folder) and one folder per node, in which each rank's
files are named as a lab host's are in the run folder: ``RunDir(run).node(NODE).result(rankN)``.

Every name here is a plain word to a shell (no character a shell would quote or expand,
tests/test_rundir.py checks), so the batch script and the login node's listing spell them from
these constants as they are; the folder a ``RunDir`` is made of is the caller's to quote.
"""

from __future__ import annotations

import glob
import posixpath
import re

# Where each launcher puts the worker's global rank, by which its label and files are named.
RANK_VARS = {"srun": ("SLURM_PROCID",), "torchrun": ("RANK",),
             "mpirun": ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")}
# ... and its rank on this node. Open MPI's names as its mpirun gives them to each rank
# (tests/fixtures/openmpi-env/), torchrun's as its documentation and its workers' environment say.
LOCAL_RANK_VARS = {"srun": ("SLURM_LOCALID",), "torchrun": ("LOCAL_RANK",),
                   "mpirun": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "PMIX_LOCAL_RANK",
                              "SLURM_LOCALID")}
# The placeholders nsys (and ncu) expand in an output name: %p the pid, %q{VAR} a variable's value.
PLACEHOLDER = re.compile(r"%p|%q\{[^}]*\}")


class RunDir:
    """The files of one run's folder (``path``: absolute, or "" for names relative to it)."""

    AGENT = "fleet-agent.py"             # the agent as one file (fleet/agent/bundle.py's script)
    SCRIPT = "job.sbatch"                # the batch script
    # what the job asks of a node's fleet prolog (agent/slurmd.py)
    REQUEST = "fleet-request.json"
    # the job's exit status, written by the batch script once its workload ended
    JOB_EXIT = "job.exit"
    # when the USR1 trap stopped the profilers before the time limit
    JOB_STOPPED = "job.stopped"
    JOB_REFUSED = "job.refused"          # the batch script's own check refused to start anything
    # fleet cancel or Ctrl-C: written before their signal is sent
    JOB_STOP_ASKED = "job.stop-asked"
    # Slurm's restart count as the batch script last started (requeues)
    JOB_RESTARTS = "job.restarts"
    BATCH_LOG = "slurm-%j.out"           # sbatch's --output pattern: %j is the job id
    # HOST.result.json: a host's or rank's result (a "profile" answer)
    RESULT = ".result.json"
    # .tmp-HOST: the private TMPDIR of a host's or rank's profiler
    TMP = ".tmp-"
    # rankN: a rank's label; its reports and result are named by it
    RANK = "rank"
    PID = "pid"                          # pidN: the label of a task whose launcher gave it no rank
    RAY = "ray"                          # Ray's workers' reports, whose files and fleet's hook
    RAY_HOOK = "fleet_ray_hook.py"       # fleet/slurm/ray_hook.py, as the batch script writes it
    RAY_HOOK_BLOCK = "fleet_ray_hook.json"  # the _nsight block the hook reads
    # REPORT_NAME.csv beside each nsys report
    NSYS_SUMMARIES = ("cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum")
    NSYS_EXPORT = ".sqlite"              # REPORT.sqlite: an nsys report's SQLite export, beside it
    # worker-HOST-PID.nsys-rep: Ray's nsight plugin, from RAY_REPORTS
    RAY_WORKER = "worker-"
    RAY_REPORTS = RAY_WORKER + "%h-%p"   # nsys's -o for Ray's workers: %h the host, %p the pid
    # worker-HOST-PID.whose.json: whose a Ray worker is, beside its report
    WHOSE = ".whose.json"
    # worker-HOST-PID.unfinished: its nsys still ran when the job stopped waiting
    UNFINISHED = ".unfinished"
    NSYS_REPORT = ".nsys-rep"            # what nsys adds to its -o
    # HOST.workload.out: the output of a workload left running (--detach)
    WORKLOAD_OUT = ".workload.out"

    def __init__(self, path: object):
        self.path = str(path)

    def __repr__(self) -> str:
        return "RunDir(%r)" % self.path

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RunDir) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def file(self, name: str) -> str:
        """A file of this folder by its name (joined as written: a name from a job's file that
        starts with / stays under the folder, where os.path.join would start again at it)."""
        return self.path + ("" if not self.path or self.path.endswith("/") else "/") + name

    def node(self, name: str) -> RunDir:
        """A Slurm node's folder: its ranks' reports and results, named as a lab host's are."""
        return RunDir(self.file(name))

    # --- a host's or a rank's files (``host``: the lab host's name, or a rank's label) ---

    def result(self, host: str) -> str:
        return self.file(host + self.RESULT)

    def tmp(self, host: str) -> str:
        return self.file(self.TMP + host)

    def workload_out(self, host: str) -> str:
        return self.file(host + self.WORKLOAD_OUT)

    @classmethod
    def label(cls, rank: int | str | None, pid: int | None = None) -> str:
        """A rank's label (``rank3``), or, without a rank, its task's by pid (``pid4242``)."""
        return "%s%s" % (cls.RANK, rank) if rank is not None else "%s%s" % (cls.PID, pid)

    @classmethod
    def rank_report(cls, launcher: str) -> str:
        """A rank's report name on a lab server, where the launcher starts each rank under nsys
        itself: ``rank%q{OMPI_COMM_WORLD_RANK}``, which nsys expands in each rank from the variable
        the launcher gave it, to the rank's label (``rank3``). No plain word: it reaches nsys as one
        word of its argv, never through a shell."""
        return "%s%%q{%s}" % (cls.RANK, RANK_VARS[launcher][0])

    @staticmethod
    def output_glob(output: str) -> str:
        """A profiler's output name as a glob of the files it names, each placeholder as ``*``."""
        return PLACEHOLDER.sub("*", glob.escape(output))

    @staticmethod
    def output_as(output: str, word: str) -> str:
        """A profiler's output name with ``word`` for its placeholders: a name of
        fleet's beside its reports."""
        return PLACEHOLDER.sub(word, output)

    @classmethod
    def rank_of(cls, label: str) -> int | None:
        """The rank a label says (``rank3`` -> 3), or None."""
        rank = label[len(cls.RANK):]
        return (int(rank) if label.startswith(cls.RANK) and rank.isdigit() and len(rank) < 10
                else None)

    @classmethod
    def report_rank(cls, path: str) -> int | None:
        """The rank a report's file name says (``NODE/rank3.nsys-rep`` -> 3, a window's
        ``NODE/rank3.2.nsys-rep`` too), or None."""
        return cls.rank_of(posixpath.basename(path).split(".")[0])

    @classmethod
    def result_place(cls, path: str) -> tuple[str, str]:
        """(folder, host) of a result file's path (``NODE/rank3.result.json`` -> ``NODE``,
        ``rank3``); host is "" where the name is no result file's."""
        folder, _, name = path.rpartition("/")
        return folder, name[: -len(cls.RESULT)] if name.endswith(cls.RESULT) else ""

    # --- the job's own files ---

    @property
    def agent(self) -> str:
        return self.file(self.AGENT)

    @property
    def script(self) -> str:
        return self.file(self.SCRIPT)

    @property
    def request(self) -> str:
        return self.file(self.REQUEST)

    @property
    def job_exit(self) -> str:
        return self.file(self.JOB_EXIT)

    @property
    def job_stopped(self) -> str:
        return self.file(self.JOB_STOPPED)

    @property
    def job_refused(self) -> str:
        return self.file(self.JOB_REFUSED)

    @property
    def job_stop_asked(self) -> str:
        return self.file(self.JOB_STOP_ASKED)

    @property
    def job_restarts(self) -> str:
        return self.file(self.JOB_RESTARTS)

    @property
    def batch_log(self) -> str:
        """sbatch's --output, with its %j."""
        return self.file(self.BATCH_LOG)

    def batch_log_of(self, job_id: object) -> str:
        return self.file(self.BATCH_LOG.replace("%j", str(job_id)))

    # --- Ray ---

    @property
    def ray(self) -> str:
        return self.file(self.RAY)

    def ray_file(self, name: str) -> str:
        return self.node(self.RAY).file(name)

    @property
    def ray_reports(self) -> str:
        """nsys's -o for every Ray worker (its placeholders kept)."""
        return self.ray_file(self.RAY_REPORTS)

    @property
    def ray_hook(self) -> str:
        return self.ray_file(self.RAY_HOOK)

    @property
    def ray_hook_block(self) -> str:
        return self.ray_file(self.RAY_HOOK_BLOCK)

    @classmethod
    def ray_worker(cls, host: str, pid: object) -> str:
        """A Ray worker's report name without its extension, as nsys expands RAY_REPORTS."""
        return "%s%s-%s" % (cls.RAY_WORKER, host, pid)

    @classmethod
    def ray_worker_host(cls, path: str) -> str:
        """The host a Ray worker's report or whose file names (``.../worker-node1-123.nsys-rep``
        -> ``node1``); "" where it names none."""
        return posixpath.basename(cls.ray_base(path))[len(cls.RAY_WORKER):].rsplit("-", 1)[0]

    @classmethod
    def ray_base(cls, path: str) -> str:
        """A Ray worker's report, whose or unfinished file without its suffix: worker-HOST-PID."""
        for suffix in (cls.NSYS_REPORT, cls.WHOSE, cls.UNFINISHED):
            if path.endswith(suffix):
                return path[: -len(suffix)]
        return path

    @classmethod
    def whose_beside(cls, report: str) -> str:
        """The whose file fleet's Ray hook writes beside a worker's report."""
        base = report[: -len(cls.NSYS_REPORT)] if report.endswith(cls.NSYS_REPORT) else report
        return base + cls.WHOSE

    @classmethod
    def ray_extra_patterns(cls) -> tuple:
        """The names of the files made of Ray workers' reports, as shell patterns
        (listed beside them)."""
        return tuple(cls.ray_extras(cls.RAY_WORKER + "*"))

    @classmethod
    def ray_extras(cls, base: str) -> dict:
        """The files made of a Ray worker's report (worker-HOST-PID, its path without the
        suffix) beside it (fleet/agent/rayend.py): each path -> (its summary name, its kind)."""
        extras = {base + cls.NSYS_EXPORT: ("sqlite", "export")}
        extras.update(("%s_%s.csv" % (base, name), (name, None)) for name in cls.NSYS_SUMMARIES)
        return extras

    @classmethod
    def is_whose(cls, path: str) -> bool:
        return path.endswith(cls.WHOSE)

    @classmethod
    def is_unfinished(cls, path: str) -> bool:
        return path.endswith(cls.UNFINISHED)
