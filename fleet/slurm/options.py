"""What Slurm accepts for each value fleet writes into a batch script: checked once, before
anything is rendered, written or submitted, into a :class:`CheckedJobSpec`.

A value from the command line, a playbook or the inventory either fits what
sbatch takes for that option (a partition name, a time in one of Slurm's
formats, a GRES list) or is refused with one line naming it. ``--sbatch-arg``
is one ``--option[=value]``, never one of the options fleet sets itself: its
``--output``, ``--signal`` and ``--chdir`` are how the run's log, the stop
before the time limit and the prolog's request work. sbatch, like getopt,
takes a long option's unambiguous prefix (``--out`` is ``--output``), so the
prefixes are refused too.

:func:`checked` is the one check of a job's shape against the request it runs (the launcher
with the tool, the command and the container): the CLI and nightly call it where they build a
spec, so every usage error is found before the login node is asked anything (exit status 2),
and what is rendered, submitted and recorded takes the checked spec and never checks it again.
"""

from __future__ import annotations

import re
from dataclasses import KW_ONLY, asdict, dataclass, field, fields
from typing import TYPE_CHECKING

from ..errors import FleetError
from ..safenames import UnsafeValue, check_text, quote, sbatch_word
from ..userflags import profiler_args_error
from . import launchers
from .spec import JobSpec

if TYPE_CHECKING:
    from ..plan import ProfileRequest

DEFAULT_STOP_BEFORE = 120  # seconds; less when the time limit is short (``fit_stop_before``)

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")         # a partition, account or QOS
# name[[:type]:count]
GRES_ITEM = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*(:[A-Za-z0-9_.-]+)?(:[0-9]+[KMGkmg]?)?")
# [type:]count
GPUS_ITEM = re.compile(r"([A-Za-z0-9_.-]+:)?[0-9]+")
# D-HH[:MM[:SS]]
TIME = re.compile(r"(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                  r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)"                                  # HH:MM:SS
                  r"|(?P<m>\d+)(?::(?P<ms>\d+))?)")                                       # MM[:SS]
NO_LIMIT = {"infinite", "unlimited"}
OPTION = re.compile(r"--(?P<name>[a-z][a-z0-9-]*)(?:=(?P<value>.*))?", re.S)

# Options fleet sets, or that would take the job out of fleet's hands, and what to do instead.
RESERVED = {
    "output": "fleet sends the job's log to the run directory",
    "error": "fleet gathers the job's log, stderr too",
    "input": "the job reads no file as its input", "signal": "use --stop-before",
    "chdir": "the job starts in its run directory, where the prolog looks; use --workdir",
    "job-name": "fleet names the job after its run", "wrap": "fleet writes the batch script",
    "uid": "the job runs as you", "gid": "the job runs as you", "array": "one run is one job",
    "wait": "fleet watches the job itself", "clusters": "use --cluster and the inventory",
    "parsable": "fleet reads sbatch's answer", "test-only": "use --dry-run",
    "partition": "use --partition", "nodes": "use --nodes", "ntasks": "use --ntasks",
    "ntasks-per-node": "use --ntasks-per-node", "gpus": "use --gpus", "gres": "use --gres",
    "time": "use --time", "account": "use --account", "qos": "use --qos",
    "exclusive": "use --exclusive or --shared",
}


def name(value: str, what: str, *, many: bool = False) -> str:
    """A partition, account or QOS name (``many``: a comma-separated list, as --partition takes)."""
    check_text(value, what)
    if not all(NAME.fullmatch(n) for n in (value.split(",") if many else [value])):
        raise UnsafeValue(f"{what}: {value!r} is not a Slurm name (letters, digits, '_', '.', '+' "
                          "or '-'"
                          + (", several separated by commas)" if many else ")"))
    return value


def time_seconds(value: str) -> int | None:
    """Slurm's --time in seconds (None: no limit), or UnsafeValue for a form Slurm does not take:
    MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED."""
    check_text(value, "--time")
    if value.lower() in NO_LIMIT:
        return None
    m = TIME.fullmatch(value)
    if not m:
        raise UnsafeValue(f"--time: {value!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, "
                          f"D-HH:MM, D-HH:MM:SS or UNLIMITED)")
    n = {k: int(v) if v else 0 for k, v in m.groupdict().items()}
    seconds = (n["d"] * 86400 + n["dh"] * 3600 + n["dm"] * 60 + n["ds"] + n["h"] * 3600
               + n["hm"] * 60 + n["hs"]
               + n["m"] * 60 + n["ms"])
    return seconds or None  # Slurm: a time limit of 0 is none


def resources(value: str, what: str, item: re.Pattern, example: str) -> str:
    check_text(value, what)
    if not all(item.fullmatch(i) for i in value.split(",")):
        raise UnsafeValue(f"{what}: {value!r} is not what sbatch takes (e.g. {example})")
    return value


def sbatch_arg(arg: str) -> str:
    """One ``--option[=value]`` for an #SBATCH line, not one fleet sets."""
    check_text(arg, "--sbatch-arg")
    m = OPTION.fullmatch(arg)
    if not m:
        raise UnsafeValue(f"--sbatch-arg: {arg!r} is not one --option or --option=value (e.g. "
                          f"--sbatch-arg=--constraint=h100)")
    for option, why in RESERVED.items():
        if option.startswith(m["name"]):  # sbatch takes an unambiguous prefix for the option
            said = "" if option == m["name"] else f" (sbatch reads it as --{option})"
            raise UnsafeValue(f"--sbatch-arg: --{m['name']}{said} is set by fleet, "
                              f"not through --sbatch-arg: {why}")
    if m["value"] is not None:
        sbatch_word(m["value"], f"--sbatch-arg {arg!r}")
    return arg


def count(value, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise UnsafeValue(f"{what}: must be a whole number, 1 or more, not {value!r}")
    return value


def parse_ranks(text: str) -> tuple[int, ...]:
    """``0,3`` → (0, 3); at least one rank, none negative."""
    check_text(text, "--ranks")
    words = [w.strip() for w in text.split(",")]
    if not all(w.isdigit() for w in words):
        raise UnsafeValue("--ranks takes rank numbers (0 or more) "
                          f"separated by commas, not {text!r}")
    return tuple(sorted({int(w) for w in words}))


def fit_stop_before(stop_before, time: str | None, limit: int | None) -> tuple[int, str | None]:
    """The seconds before the time limit (``limit``, --time ``time`` parsed) that the profilers are
    stopped, and a note when the default was shortened. They must stop inside the limit: the
    default (120 s) becomes half a shorter limit, and a ``--stop-before`` that was given and
    leaves no time to run is refused."""
    if stop_before is not None:
        if not isinstance(stop_before, int) or isinstance(stop_before, bool) or stop_before < 1:
            raise UnsafeValue(f"--stop-before: must be 1 second or more, not {stop_before!r} (the "
                              "profilers are stopped that long before the time limit "
                              "so their reports are finished)")
        if limit is not None and stop_before >= limit:
            raise UnsafeValue(f"--stop-before {stop_before} is not less than --time {time} "
                              f"({limit} s): the profilers would be stopped as the job starts; "
                              f"give a longer --time or a smaller --stop-before")
        return stop_before, None
    if limit is None or DEFAULT_STOP_BEFORE <= limit // 2:
        return DEFAULT_STOP_BEFORE, None
    fitted = max(1, limit // 2)
    return fitted, (
        f"--time {time} leaves no room for the default --stop-before {DEFAULT_STOP_BEFORE}: the "
        f"profilers stop {fitted} s before the limit (Slurm may signal up to 60 s early; "
        "give --stop-before to choose)")


# Each field of a JobSpec (and a playbook's target) that reaches an #SBATCH line, and its check.
FIELDS = {
    "partition": lambda v: name(v, "--partition", many=True),
    "account": lambda v: name(v, "--account"),
    "qos": lambda v: name(v, "--qos"),
    "time": lambda v: time_seconds(v),  # by name: one home for the parse
    "gres": lambda v: resources(v, "--gres", GRES_ITEM, "gpu:2 or gpu:h100:4"),
    "gpus": lambda v: resources(str(v), "--gpus", GPUS_ITEM, "4 or h100:4"),
    "nodes": lambda v: count(v, "--nodes"),
    "ntasks": lambda v: count(v, "--ntasks"),
    "ntasks_per_node": lambda v: count(v, "--ntasks-per-node"),
}


def check_field(field: str, value) -> None:
    """UnsafeValue when sbatch would not take ``value`` for ``field`` (a JobSpec field name)."""
    if field in FIELDS:
        FIELDS[field](value)
    elif isinstance(value, str):
        check_text(value, field)


class JobSpecError(FleetError, ValueError):
    """The job cannot run the request as asked (a launcher with a tool, a command or a container it
    cannot take): a usage error, found before the login node is asked anything."""


_MADE_BY_CHECKED = object()  # only checked() holds it: a CheckedJobSpec is never made unchecked


@dataclass(frozen=True)
class CheckedJobSpec(JobSpec):
    """A JobSpec that sbatch takes and that can run its request, made only by :func:`checked`:
    its stop time fitted to the time limit, and that limit parsed. What renders, submits and
    records a job takes this, and checks nothing of it again."""
    stop_before: int = DEFAULT_STOP_BEFORE  # fitted (fit_stop_before)
    _: KW_ONLY
    time_limit: int | None = None           # --time in seconds (None: no limit)
    stop_note: str | None = None            # why the default stop time was shortened, to say once
    made_by: object = field(default=None, repr=False, compare=False)

    def __post_init__(self):
        if self.made_by is not _MADE_BY_CHECKED:
            raise TypeError("a CheckedJobSpec is made by "
                            "fleet.slurm.options.checked, from a JobSpec")

    def to_json(self) -> dict:
        """The job's shape as the manifest keeps it: the JobSpec's fields, as checked."""
        return asdict(JobSpec(**{f.name: getattr(self, f.name) for f in fields(JobSpec)}))


def checked(raw: JobSpec, req: "ProfileRequest") -> CheckedJobSpec:
    """``raw`` checked once against what sbatch takes and against ``req`` (the tool, the command,
    the profiler's options): a CheckedJobSpec with its stop time fitted, else UnsafeValue or
    JobSpecError, before the cluster is asked anything."""
    if isinstance(raw, CheckedJobSpec):
        raise TypeError("this JobSpec is checked already: pass the CheckedJobSpec on")
    limit = None
    for key in FIELDS:  # in FIELDS' order: the first bad value is the one named
        if (value := getattr(raw, key)) is None:
            continue
        if key == "time":
            limit = time_seconds(value)  # parsed once, kept
        else:
            check_field(key, value)
    for arg in raw.sbatch_args:
        sbatch_arg(arg)
    _check_ranks(raw)
    if raw.workdir is not None:
        check_text(raw.workdir, "--workdir")
    if raw.container is not None:
        check_text(raw.container.image, "the container image")
    if why := launch_problem(raw, req):
        raise JobSpecError(why)
    stop_before, note = fit_stop_before(raw.stop_before, raw.time, limit)
    shape = {f.name: getattr(raw, f.name) for f in fields(JobSpec)}
    return CheckedJobSpec(**dict(shape, stop_before=stop_before), time_limit=limit, stop_note=note,
                          made_by=_MADE_BY_CHECKED)


def _check_ranks(raw: JobSpec) -> None:
    """The ranks to profile, where some are chosen: actor name patterns with Ray, else rank numbers
    that the job has (where its shape is fleet's to read)."""
    if raw.ranks is None:
        return
    if raw.launcher == "ray":  # actor name patterns (launchers.actor_patterns)
        _check_actor_patterns(raw.ranks)
        return
    if not raw.ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0
                                for r in raw.ranks):
        raise UnsafeValue(f"--ranks: at least one rank, each 0 or more, not {list(raw.ranks)!r}")
    _check_ranks_exist(raw)


def _check_actor_patterns(ranks) -> None:
    """With --launcher ray, --ranks is at least one actor name pattern, each one line of text."""
    if not ranks or not all(isinstance(r, str) and r and check_text(r, "--ranks") for r in ranks):
        raise UnsafeValue(f"--ranks: with --launcher ray, actor name patterns, not {list(ranks)!r}")


def _check_ranks_exist(raw: JobSpec) -> None:
    """srun's ranks are the job's tasks: a rank past them would never be profiled. Not checked
    where --sbatch-arg shapes the tasks (--ntasks-per-gpu ...), or another launcher starts them."""
    total = raw.ntasks or (raw.nodes or 1) * (raw.ntasks_per_node or 1)
    # --ntasks-per-gpu ...
    shaped_elsewhere = any(a.startswith("--ntasks") for a in raw.sbatch_args)
    if raw.launcher == "srun" and not shaped_elsewhere and max(raw.ranks) >= total:
        raise UnsafeValue(f"--ranks: the job has {total} rank(s), 0 to {total - 1}; rank "
                          f"{max(raw.ranks)} would never be profiled")


def launch_problem(raw: JobSpec, req: "ProfileRequest") -> str | None:
    """Why the job's launcher cannot run ``req`` as fleet promises, or None: what the batch script's
    renderer would otherwise find only once the login node had answered."""
    if raw.launcher not in launchers.LAUNCHERS:
        return f"--launcher: one of {', '.join(launchers.LAUNCHERS)}, not {raw.launcher!r}"
    for word in req.command:  # the renderer's own rule for the command's words (a NUL cannot pass)
        quote(word, "the command", lines=True)
    return (profiler_args_error(req.tool, tuple(req.profiler_args))
            or launchers.unsupported(raw.launcher, req.tool, req.profiler_args, req.gpu_metrics)
            or launchers.command_problem(raw.launcher, req.command)
            or launchers.container_problem(raw.launcher, raw.container)
            or _window_problem(raw, req))


def _window_problem(raw: JobSpec, req: "ProfileRequest") -> str | None:
    """--window on Slurm: each rank's agent stays with its workload once nsys has gone, which it
    can where it started that nsys itself (srun's ranks); not yet beside another
    launcher, or in a container."""
    if req.window and (raw.launcher != "srun" or raw.container is not None):
        return "--window on Slurm is for srun's ranks yet, without a container"
    return None
