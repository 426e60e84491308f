"""``fleet top --job J``: the live look inside a running job of yours, on each of its nodes.

One ``srun --jobid=J --overlap`` from the login node, one task a node, each running the look's
agent (fleet/agent/look.py; its bundle on stdin, which ``--input=all`` gives every task). The
step is inside the job, so it sees the job's GPUs as Slurm allows, and the agent keeps to those
Slurm gave the job (``SLURM_STEP_GPUS``/``SLURM_JOB_GPUS``). Slurm itself refuses a step in
another user's job. ``--label`` tells the tasks' lines apart, and srun cuts a long line into
labelled pieces (1024 bytes): a task's pieces are joined again from the frame's mark on. The step
ends with the look: Ctrl-C, ``--count``, or the job's end.

``fleet top --partition P`` is the admin's look: the partition's nodes as slurmctld names them
(:func:`partition_nodes`), each looked at over SSH as the inventory reaches it, outside any job.
"""

from __future__ import annotations

import asyncio
import re
from typing import TYPE_CHECKING, Callable

from ..agent import wire
from ..agent.bundle import bundle
from ..agentcall import agent_args, agent_argv
from ..look import CLOSE_GRACE, START_BOUND, HostView, Lines, sample_of, take_sample
from .cluster import Cluster
from .jobs import BOUNDED, LoginUnreachable, SlurmError
from .options import name

if TYPE_CHECKING:
    from ..transport import Fanout

LABELLED = re.compile(r"^\s*(\d{1,6}): ?(.*)$")
JOB_ID = re.compile(r"\d{1,12}")
# a node as sinfo names it; anything else is not believed
NODE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
# nodes of one partition: more than any cluster fleet would look at from one client
NODES_LIMIT = 10_000
# bytes of one task's frame being joined: past it, that task's look is not believed
PIECES_LIMIT = 4 << 20
# The job's node count from slurmctld, then the step: one task a node, the look's agent in each.
SRUN = (BOUNDED
        + 'j="$1"; shift; n=$(bounded squeue -h -j "$j" -t RUNNING -o %D 2>/dev/null | head -1); '
        '[ -n "$n" ] || { echo "job $j is not running (or not yours to see)" >&2; exit 3; }; '
        'exec srun --jobid="$j" --overlap --nodes="$n" --ntasks-per-node=1 --ntasks="$n" '
        '--input=all --label --job-name=fleet-top -- "$@"')


class Tasks:
    """The step's labelled lines, joined into each task's frames, each task a HostView."""

    def __init__(self, on_view: Callable[[HostView], None]):
        self.pieces: dict[str, str] = {}
        self.views: dict[str, HostView] = {}
        self.on_view = on_view

    def line(self, text: str) -> None:
        m = LABELLED.match(text)
        if not m:
            return
        task, piece = m.group(1), m.group(2)
        if piece.startswith(wire.MARK):
            self.pieces[task] = piece
        elif task in self.pieces:
            self.pieces[task] += piece
        else:
            return
        if len(self.pieces[task]) > PIECES_LIMIT:
            self._view(task, f"task {task}").error = ("sent a frame past its bound: its look is "
                                                      "not believed")
            del self.pieces[task]
            return
        found = wire.answers(self.pieces[task], "look")
        if found:
            del self.pieces[task]
            sample, why = sample_of(found[-1])
            take_sample(self._view(task, sample.host if sample is not None else None), sample, why,
                        self.on_view)

    def _view(self, task: str, host: str | None) -> HostView:
        """The task's view, named once by the node its first frame names: a name not of a node
        name's shape is the task's number, and a name another task took already says its task, so
        that no task's look stands in for another's."""
        if task not in self.views:
            name = host if host is not None and NODE_NAME.fullmatch(host) else f"task {task}"
            if any(v.host == name for v in self.views.values()):
                name = f"{name} (task {task})"
            self.views[task] = HostView(name)
        return self.views[task]


async def look_job(fan: "Fanout", cluster: Cluster, job_id: str, *, interval: float = 1.0,
                   samples: int | None = None, lifetime: float = 8 * 3600.0,
                   on_view: Callable[[HostView], None] = lambda v: None,
                   stop: asyncio.Event | None = None) -> list[HostView]:
    """Each node of the running job ``job_id``, looked at from a step inside it."""
    if not JOB_ID.fullmatch(job_id or ""):
        raise SlurmError(f"--job {job_id!r}: a Slurm job id is its number")
    login = cluster.login
    args = dict(agent_args(login, environment_check=False, versions=()), mode="look",
                interval=interval, lifetime=lifetime, samples=samples)
    tasks = Tasks(on_view)
    lines = Lines(lambda text: tasks.line(text))
    r = await fan.run(login, ["sh", "-c", SRUN, "sh", job_id, *agent_argv(login, args)],
                      input=bundle(),
                      sink=lines.feed, stop=stop, timeout=lifetime + START_BOUND, grace=CLOSE_GRACE)
    if r.error and not r.reached:
        raise LoginUnreachable(f"{login.name} (login node) unreachable: {r.error}")
    if not tasks.views and not (stop is not None and stop.is_set()):
        said = [line for line in r.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise SlurmError(f"no look inside job {job_id} from {login.name}: "
                         + (said[-1] if said else f"exit status {r.exit_status}"))
    return list(tasks.views.values())


async def partition_nodes(fan: "Fanout", cluster: Cluster, partition: str) -> list[str]:
    """The nodes of ``partition`` (several, comma-separated, as sbatch takes them), one each, in
    sinfo's order; a name not of a node name's shape is refused, never passed on to SSH."""
    name(partition, "--partition", many=True)
    r = await fan.run(cluster.login, ["sh", "-c", BOUNDED + 'bounded sinfo -h -N -p "$1" -o %N',
                                      "sh", partition],
                      timeout=120)
    if r.error and not r.reached:
        raise LoginUnreachable(f"{cluster.login.name} (login node) unreachable: {r.error}")
    said = r.stdout.decode(errors="replace")
    if r.exit_status != 0:
        err = [line for line in r.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise SlurmError(f"sinfo -p {partition} failed on {cluster.login.name}: "
                         + (err[-1] if err else f"exit status {r.exit_status}"))
    nodes = list(dict.fromkeys(line.strip() for line in said.splitlines() if line.strip()))
    wrong = [n for n in nodes if not NODE_NAME.fullmatch(n)]
    if wrong or len(nodes) > NODES_LIMIT:
        raise SlurmError(f"sinfo on {cluster.login.name} named " + (f"{wrong[0][:80]!r}, not a "
                                                                    "node's name" if wrong
                                                                      else "more than "
                                                                           f"{NODES_LIMIT} nodes"))
    if not nodes:
        raise SlurmError(f"partition {partition} has no nodes on {cluster.name} (sinfo -p "
                         f"{partition})")
    return nodes
