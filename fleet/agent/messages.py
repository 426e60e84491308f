"""The agent's answers as types: a profile's result read once, on the controller, into dataclasses
(:class:`ProfileResult` and its parts), a live look's sample (:class:`LookGpu` and its parts) and
``fleet repair``'s answer (:class:`RepairAnswer`), so that nothing downstream looks into a node's
dict. (The probe's answer, which the policy reads on the node too, is ``policy.nodestate``.)

The node still writes the dict that :data:`wire.RESULT` holds to its shape; this reads it. Reading
never fails: a value not of its type reads as absent, so a result from an older agent, or from a
manifest in the store, reads as well as a fresh answer that :func:`wire.read` checked. Written to
the agent's rules (standard library, Python 3.8; tests/test_bundle.py holds it to them), so that the
node can build the same types: it travels once a shipped module imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

try:
    import fleet_agent_wire as wire
    from fleet_policy_nodefacts import NodeFacts
    from fleet_policy_readers import dict_of, dicts_of, int_of, is_int, number_of, str_of, strs_of
except ImportError:
    from . import wire
    from ..policy.nodefacts import NodeFacts
    from ..policy.readers import dict_of, dicts_of, int_of, is_int, number_of, str_of, strs_of


AgentStatus = wire.AgentStatus  # the agent's word for its run, which the node sets


@dataclass(frozen=True)
class ReportFile:
    """A file the agent made for fleet to bring home (wire.FILE): a report, an export, a summary."""
    path: str
    size: int | None = None
    sha256: str | None = None
    status: str | None = None
    # the summary's kind (cuda_gpu_kern_sum, ...), None for a report
    summary: str | None = None
    truncated: str | None = None        # why the report is cut, None where it is whole
    finished_from_qdstrm: bool = False  # the report finished from the data of a killed profiler
    kind: str | None = None             # "export" for a report's SQLite export

    @classmethod
    def read(cls, d):
        return cls(d["path"], int_of(d.get("size")), str_of(d.get("sha256")),
                   str_of(d.get("status")),
                   str_of(d.get("summary")), str_of(d.get("truncated")),
                   d.get("finished_from_qdstrm") is True, str_of(d.get("kind")))


@dataclass(frozen=True)
class Running:
    """A workload left running on the node (wire.RUNNING)."""
    pids: tuple
    started: tuple
    boot: str | None
    output: str | None
    session: int | None

    @classmethod
    def read(cls, d):
        pids = d.get("pids")
        return cls(tuple(pids) if isinstance(pids, list) else (),
                   tuple(d["started"]) if isinstance(d.get("started"), list) else (),
                   str_of(d.get("boot")), str_of(d.get("output")), int_of(d.get("session")))


@dataclass(frozen=True)
class Workload:
    """How the wrapped command ended (wire.WORKLOAD): its exit status, or the
    signal that killed it."""
    exit_status: int | None = None
    signal: str | None = None
    running: Running | None = None

    @classmethod
    def read(cls, d):
        running = d.get("running")
        return cls(int_of(d.get("exit_status")), str_of(d.get("signal")),
                   Running.read(running) if isinstance(running, dict) else None)


@dataclass(frozen=True)
class Newcomer:
    """Who arrived on the run's GPU while it ran, and what the agent did (wire.NEWCOMER)."""
    gpu: int | None = None
    pid: int | None = None
    user: str | None = None
    used_memory: int | None = None
    unseen: bool = False
    appeared_s: float | None = None
    overlap_s: float | None = None
    action: str | None = None

    @classmethod
    def read(cls, d):
        return cls(int_of(d.get("gpu")), int_of(d.get("pid")), str_of(d.get("user")),
                   int_of(d.get("used_memory")),
                   d.get("unseen") is True, number_of(d.get("appeared_s")),
                   number_of(d.get("overlap_s")), str_of(d.get("action")))


@dataclass(frozen=True)
class Conditions:
    """The clocks, temperature, power and throttle reasons of a GPU at a sample (wire.CONDITIONS: a
    live look's, and the run watch's in a result); each None where the node could not read it."""
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    throttle: tuple | None = None   # NVML's reasons, as words
    temperature_c: float | None = None
    power_w: float | None = None

    @classmethod
    def read(cls, d):
        throttle = d.get("throttle")
        return cls(number_of(d.get("sm_clock_mhz")), number_of(d.get("mem_clock_mhz")),
                   tuple(str(t) for t in throttle) if isinstance(throttle, list) else None,
                   number_of(d.get("temperature_c")), number_of(d.get("power_w")))

    def to_json(self):
        """As the node writes them: only what it could read."""
        doc = {"sm_clock_mhz": self.sm_clock_mhz, "mem_clock_mhz": self.mem_clock_mhz,
               "throttle": list(self.throttle) if self.throttle is not None else None,
               "temperature_c": self.temperature_c, "power_w": self.power_w}
        return {k: v for k, v in doc.items() if v is not None}


@dataclass(frozen=True)
class SampledProcess:
    """A process one of the run watch's samples listed on its GPU; ``own``:
    below the run's profiler."""
    pid: int
    user: str | None = None
    name: str | None = None
    own: bool | None = None

    @classmethod
    def read(cls, d):
        own = d.get("own")
        return cls(d["pid"], str_of(d.get("user")), str_of(d.get("name")),
                   own if isinstance(own, bool) else None)


@dataclass(frozen=True)
class Sample:
    """One of the run watch's samples of one GPU: its processes (those with a pid), and its clocks,
    temperature, power and throttle reasons at ``t`` (the node's clock)."""
    gpu: int | None
    processes: tuple
    t: float | None = None
    conditions: Conditions = Conditions()

    @classmethod
    def read(cls, d):
        return cls(int_of(d.get("gpu")), tuple(SampledProcess.read(p)
                                               for p in dicts_of(d.get("processes"))
                                             if is_int(p.get("pid"))), number_of(d.get("t")),
                   Conditions.read(d))

    @property
    def busy(self):
        """Whether the GPU was not idle at the sample (NVML's gpu_idle reason is not among them)."""
        return "gpu_idle" not in (self.conditions.throttle or ())


@dataclass(frozen=True)
class ProfileResult:
    """What an agent said of one run (wire.RESULT), typed. ``said`` is its word as written,
    ``status`` that word where fleet knows it (None: an agent's word this fleet does not know)."""
    said: str | None = None
    status: AgentStatus | None = None
    reasons: tuple = ()
    notes: tuple = ()
    given_up: tuple = ()
    reports: tuple = ()             # ReportFile
    summaries: tuple = ()           # ReportFile
    exit_status: int | None = None  # the profiler's (which passes the workload's on)
    stopped: bool = False           # the agent saw fleet's stop
    profiler_errors: tuple = ()
    workload: Workload | None = None
    newcomer: Newcomer | None = None
    samples: tuple = ()             # Sample: the run watch's
    watched_gpus: tuple = ()        # (NVML index or None, UUID) of each GPU the run watch named
    user: str | None = None         # whose run it was (its ``whose``)
    missing_ranks: tuple = ()       # a launcher's ranks that left no report, as the node says
    unfinished: tuple = ()          # a line for each of nsys's data left without its report
    # A Slurm rank's result says whose it is and what it saw of its node (agent/task.py).
    host: str | None = None         # the rank's label (rankN)
    slurm_node: str | None = None   # Slurm's name of its node
    rank: int | None = None
    tenants: tuple = ()             # who refused it, as lines
    nonce: str | None = None        # the run's, which gather takes results by
    facts: NodeFacts = NodeFacts()

    @classmethod
    def read(cls, d):
        said, workload, newcomer = str_of(d.get("status")), d.get("workload"), d.get("newcomer")
        return cls(
            said, AgentStatus(said) if said in wire.RESULT_STATUSES else None,
            strs_of(d.get("reasons")), strs_of(d.get("notes")), strs_of(d.get("given_up")),
            _files(d.get("reports")), _files(d.get("summaries")), int_of(d.get("exit_status")),
            d.get("stopped") is True, strs_of(d.get("profiler_errors")),
            Workload.read(workload) if isinstance(workload, dict) else None,
            Newcomer.read(newcomer) if isinstance(newcomer, dict) else None,
            tuple(Sample.read(s) for s in dicts_of(dict_of(d.get("conditions")).get("samples"))),
            tuple((int_of(g.get("index")),
                   u) for g in dicts_of(dict_of(d.get("conditions")).get("gpus"))
                  if (u := str_of(g.get("uuid")))),
            str_of(dict_of(d.get("whose")).get("user")),
            tuple(r for r in d.get("missing_ranks") or [] if is_int(r) and r >= 0)
            if isinstance(d.get("missing_ranks"), list) else (), strs_of(d.get("unfinished")),
            str_of(d.get("host")), str_of(d.get("slurm_node")), int_of(d.get("rank")),
            _tenant_lines(d.get("tenants")), str_of(d.get("nonce")), NodeFacts.read(d))

    @property
    def node(self):
        """The rank's node: Slurm's name of it, else the name its agent found."""
        return self.slurm_node or self.facts.node

    @property
    def gpu_uuids(self):
        return tuple(uuid for _, uuid in self.watched_gpus)

    @property
    def made_reports(self):
        """Whether the agent says it made reports to bring home (it ran, or yielded mid-run)."""
        return self.status in (AgentStatus.OK, AgentStatus.YIELDED)


def _tenant_lines(v):
    """Tenants as lines: an agent writes them so; an older one wrote each as an object."""
    return tuple(t if isinstance(t, str) else "GPU %s: pid %s (%s) %s" % (
        t.get("gpu"), t.get("pid"), t.get("user") or "unknown user", t.get("why"))
        for t in v if isinstance(t, (str, dict))) if isinstance(v, list) else ()


def _files(v):
    return tuple(ReportFile.read(f) for f in dicts_of(v) if isinstance(f.get("path"), str))


@dataclass(frozen=True)
class Repaired:
    """What ``fleet repair``'s agent put back, or would (``--dry-run``): sysctl -> the value it put
    back, whether DCGM profiling was resumed, and sysctl -> who still holds it changed."""
    restored: dict
    dcgm_resumed: bool = False
    held: dict = field(default_factory=dict)

    def to_json(self):
        return {"restored": dict(self.restored), "dcgm_resumed": self.dcgm_resumed,
                "held": dict(self.held)}


@dataclass(frozen=True)
class RepairAnswer:
    """A "repair" answer (wire.REPAIR): what was put back, or the agent's one-line error."""
    # None: no value of its shape (an object with a ``restored`` object)
    value: Repaired | None = None
    error: str | None = None

    @classmethod
    def read(cls, d):
        value = dict_of(d.get("value"))
        restored = value.get("restored")
        held = {str(k): list(v) for k, v in dict_of(value.get("held")).items()
                if isinstance(v, list)}
        return cls(Repaired(dict(restored), value.get("dcgm_resumed") is True, held)
                   if isinstance(restored, dict) else None, str_of(d.get("error")))


@dataclass(frozen=True)
class LookProcess:
    """A process one of the live look's samples lists on a GPU (wire.LOOK_PROCESS). ``left_running``
    is the controller's: the fleet run that left it running (fleet top marks it)."""
    pid: int
    user: str | None = None
    uid: int | None = None
    used_memory: int | None = None
    name: str | None = None
    command: str | None = None
    container: str | None = None
    slurm_job: str | None = None
    foreign: bool = True            # unsaid: someone else's
    why: str | None = None
    session: int | None = None
    kinds: tuple = ()
    left_running: str | None = None

    @classmethod
    def read(cls, d):
        foreign = d.get("foreign")
        return cls(d["pid"], str_of(d.get("user")), int_of(d.get("uid")),
                   int_of(d.get("used_memory")),
                   str_of(d.get("name")), str_of(d.get("command")), str_of(d.get("container")),
                   str_of(d.get("slurm_job")),
                   foreign if isinstance(foreign, bool) else True, str_of(d.get("why")),
                   int_of(d.get("session")), strs_of(d.get("kinds")))

    def to_json(self):
        return {"pid": self.pid, "user": self.user, "uid": self.uid,
                "used_memory": self.used_memory,
                "name": self.name, "command": self.command, "container": self.container,
                "slurm_job": self.slurm_job, "foreign": self.foreign, "why": self.why,
                "session": self.session,
                "kinds": list(self.kinds),
                **({"left_running": self.left_running} if self.left_running else {})}


ACTIVITY_METRICS = ("sm_activity", "sm_occupancy", "tensor_activity", "dram_bandwidth",
                    "fp32_activity", "fp16_activity", "fp64_activity")


@dataclass(frozen=True)
class Activity:
    """How hard a GPU worked over a look's interval (wire.ACTIVITY): GPM's metrics, each a
    percentage (None where GPM has none), or only the plain utilization (``source``
    "utilization") and why."""
    source: str
    utilization: float | None = None
    why: str | None = None
    metrics: dict = field(default_factory=dict)  # ACTIVITY_METRICS -> percentage or None

    @classmethod
    def read(cls, d):
        return cls(d["source"], number_of(d.get("utilization")), str_of(d.get("why")),
                   {k: number_of(d.get(k)) for k in ACTIVITY_METRICS} if d["source"] == "gpm"
                   else {})

    def metric(self, name):
        return self.metrics[name] if name in self.metrics else None

    def to_json(self):
        plain = {"source": self.source, "utilization": self.utilization}
        return dict(plain, **self.metrics) if self.source == "gpm" else dict(plain, why=self.why)


@dataclass(frozen=True)
class LookGpu:
    """One GPU of a live look's sample (wire.LOOK_GPU), besides who is on it as the policy reads it
    (``policy.Gpu.read`` of the same dict)."""
    index: int
    memory_used: int | None
    memory_total: int | None
    activity: Activity
    conditions: Conditions
    processes: tuple                # LookProcess
    # The GPU as it came, for the policy's own reader (policy.Gpu.read); never read here.
    document: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def read(cls, d):
        """``d`` is of the wire's shape (wire.problems checked it)."""
        return cls(d["index"], int_of(d.get("memory_used")), int_of(d.get("memory_total")),
                   Activity.read(d["activity"]), Conditions.read(dict_of(d.get("conditions"))),
                   tuple(LookProcess.read(p) for p in d["processes"]), d)


@dataclass(frozen=True)
class LookSample:
    """One sample of a live look (wire.LOOK): its GPUs, and in a look's first sample the node's
    probed state as the agent wrote it (for ``policy.NodeState.read``)."""
    seq: int
    host: str | None = None
    time: float | None = None       # the node's clock
    gpus: tuple = ()                # LookGpu
    state: dict | None = None

    @classmethod
    def read(cls, d):
        """``d`` is of the wire's shape (wire.problems checked it)."""
        state = d.get("state")
        return cls(d["seq"], str_of(d.get("host")), number_of(d.get("time")),
                   tuple(LookGpu.read(g) for g in d["gpus"]),
                   state if isinstance(state, dict) and state else None)
