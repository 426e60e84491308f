"""What the user asks of a profile: ``ProfileRequest``, with the lab servers' choices (``LabPart``)
and what a Slurm rank fills in on its node (``RankPart``). :mod:`fleet.plan` turns it, with a
node's state, into what the node runs. Shipped to Slurm tasks with the plan (standard library,
Python 3.8: fleet/agent/bundle.py)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

try:  # as shipped to a Slurm task by fleet (fleet/agent/task.py), modules travel under flat names
    import fleet_policy as policy
except ImportError:
    from . import policy


@dataclass(frozen=True)
class LabPart:
    """What only a run on lab servers asks (the Slurm path refuses these options):
    never sent to a rank."""
    gpus: tuple[int, ...] | None = None         # --gpu: NVML indices; None: every GPU
    timeout: float | None = None                # seconds the workload may run (nsys: --duration)
    lock_wait: float = 0.0                      # seconds to wait for another run's GPU lock
    # the workload runs in this image (fleet.wrapping.containers)
    docker_image: str | None = None
    # --launcher: what starts the ranks (mpirun), None: the command itself
    launcher: str | None = None
    starts: tuple[str, ...] = ()                # with it, what starts a profiler per rank
                                                # (fleet.wrapping.launchers.lab_launch)
    program: tuple[str, ...] = ()               # ... and what each profiler runs
    # ... and how many ranks its command line says (None: not known)
    ranks: int | None = None
    # --window START:DURATION: nsys collects then, the workload goes on
    window: tuple[int, int] | None = None
    # --detach: with it, fleet leaves once the window's report is home
    detach: bool = False


@dataclass(frozen=True)
class RankPart:
    """What a Slurm rank fills in on its node from its job (agent/task.py): never sent either."""
    # planned inside this job (its ranks are not tenants)
    job: str | None = None
    # the job's GPUs here, NVML's indices; None: every GPU
    gpus: tuple[int, ...] | None = None
    output_name: str | None = None              # NODE/rankN under the run's directory
    timeout: float | None = None                # until the job's end, less --stop-before (nsys)
    # --window: (this rank's delay to the job's common start, duration)
    window: tuple[int, int] | None = None
    # ... that start, epoch seconds: the same for every rank
    window_at: int | None = None


# A window the workload opens travels to the ranks only where asked: a job
# without one reads as before.
WINDOW_FIELDS = ("nvtx_window", "cuda_profiler_window", "repeat")

# The keys of the flat record (``to_json``, a run's manifest), in its order.
RECORD = ("tool", "command", "run_id", "gpus", "gpu_metrics", "allow_own", "pause_dcgm",
          "profiler_args",
          "timeout", "lock_wait", "clock_control", "output_name", "job", "docker_image", "launcher",
          "starts",
          "program", "ranks", "window", "detach", "nvtx_window", "cuda_profiler_window", "repeat")


@dataclass(frozen=True)
class ProfileRequest:
    """What the user asks for. Its own fields are what every node needs, on lab servers and in
    each Slurm rank, where they travel as JSON (``for_rank``/``from_json``); ``lab`` holds the
    lab servers' choices, ``rank`` what a rank completes on its node. The planner reads the
    GPUs, the time bound and the job through the properties below, whichever part gave them."""
    tool: str                                   # nsys | ncu
    command: tuple[str, ...]
    run_id: str
    gpu_metrics: bool = False                   # nsys --gpu-metrics-devices
    allow_own: bool = False
    pause_dcgm: bool = False
    profiler_args: tuple[str, ...] = ()         # passed through to nsys/ncu
    clock_control: str = "base"                 # ncu; always explicit
    # --nvtx-window RANGE[@DOMAIN]: nsys collects within it (fleet.wrapping.windows)
    nvtx_window: str | None = None
    # --cuda-profiler-window: from cudaProfilerStart() to Stop()
    cuda_profiler_window: bool = False
    # --repeat N: that many of those windows, a report each
    repeat: int | None = None
    lab: LabPart | None = None
    rank: RankPart | None = None

    @property
    def uses_counters(self) -> bool:
        return policy.uses_counters(self.tool, self.gpu_metrics)

    @property
    def gpus(self) -> tuple[int, ...] | None:
        return self.rank.gpus if self.rank else self.lab.gpus if self.lab else None

    @property
    def timeout(self) -> float | None:
        return self.rank.timeout if self.rank else self.lab.timeout if self.lab else None

    @property
    def lock_wait(self) -> float:
        return self.lab.lock_wait if self.lab else 0.0

    @property
    def docker_image(self) -> str | None:
        return self.lab.docker_image if self.lab else None

    @property
    def job(self) -> str | None:
        return self.rank.job if self.rank else None

    @property
    def launcher(self) -> str | None:
        return self.lab.launcher if self.lab else None

    @property
    def starts(self) -> tuple[str, ...]:
        return self.lab.starts if self.lab else ()

    @property
    def program(self) -> tuple[str, ...]:
        return self.lab.program if self.lab else ()

    @property
    def ranks(self) -> int | None:
        return self.lab.ranks if self.lab else None

    @property
    def window(self) -> tuple[int, int] | None:
        return self.rank.window if self.rank else self.lab.window if self.lab else None

    @property
    def detach(self) -> bool:
        return self.lab.detach if self.lab else False

    @property
    def output_name(self) -> str | None:
        return self.rank.output_name if self.rank else None

    def for_rank(self) -> dict:
        """What travels to every rank: the fields every node needs, no lab choice,
        nothing the rank fills."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("lab", "rank")
                and not (f.name in WINDOW_FIELDS and getattr(self, f.name) == f.default)}

    def to_json(self) -> dict:
        """The request as a run's manifest records it: one flat document,
        whichever part gave a value."""
        return {key: getattr(self, key) for key in RECORD}

    @classmethod
    def from_json(cls, doc: dict) -> "ProfileRequest":
        """The inverse of ``to_json`` and the reader of ``for_rank``: keys it does not know are left
        out, and so are the rank's own (a rank fills them from its job, never from the document)."""
        own = {f.name for f in fields(cls)} - {"lab", "rank"}
        kw = {k: v for k, v in doc.items() if k in own}
        for key in ("command", "profiler_args"):
            kw[key] = tuple(kw.get(key) or ())
        lab = LabPart(**{f.name: doc[f.name] for f in fields(LabPart) if f.name in doc})
        lab = replace(lab, gpus=tuple(lab.gpus) if lab.gpus is not None else None,
                      starts=tuple(lab.starts or ()),
                      program=tuple(lab.program or ()), window=tuple(lab.window) if lab.window
                      else None)
        return cls(**kw, lab=lab if lab != LabPart() else None)
