"""What Slurm accepts for each value fleet writes into a batch script: checked before anything
is rendered, written or submitted.

A value from the command line, a playbook or the inventory either fits what
sbatch takes for that option (a partition name, a time in one of Slurm's
formats, a GRES list) or is refused with one line naming it. ``--sbatch-arg``
is one ``--option[=value]``, never one of the options fleet sets itself: its
``--output``, ``--signal`` and ``--chdir`` are how the run's log, the stop
before the time limit and the prolog's request work. sbatch, like getopt,
takes a long option's unambiguous prefix (``--out`` is ``--output``), so the
prefixes are refused too.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from ..safenames import UnsafeValue, check_text, sbatch_word

if TYPE_CHECKING:
    from .spec import JobSpec

DEFAULT_STOP_BEFORE = 120  # seconds; less when the time limit is short (``fit_stop_before``)

NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,127}")         # a partition, account or QOS
GRES_ITEM = re.compile(r"[A-Za-z][A-Za-z0-9_.-]*(:[A-Za-z0-9_.-]+)?(:[0-9]+[KMGkmg]?)?")  # name[[:type]:count]
GPUS_ITEM = re.compile(r"([A-Za-z0-9_.-]+:)?[0-9]+")                                      # [type:]count
TIME = re.compile(r"(?:(?P<d>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"          # D-HH[:MM[:SS]]
                  r"|(?P<h>\d+):(?P<hm>\d+):(?P<hs>\d+)"                                  # HH:MM:SS
                  r"|(?P<m>\d+)(?::(?P<ms>\d+))?)")                                       # MM[:SS]
NO_LIMIT = {"infinite", "unlimited"}
OPTION = re.compile(r"--(?P<name>[a-z][a-z0-9-]*)(?:=(?P<value>.*))?", re.S)

# Options fleet sets, or that would take the job out of fleet's hands, and what to do instead.
RESERVED = {
    "output": "fleet sends the job's log to the run directory", "error": "fleet gathers the job's log, stderr too",
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
        raise UnsafeValue(f"{what}: {value!r} is not a Slurm name (letters, digits, '_', '.', '+' or '-'"
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
        raise UnsafeValue(f"--time: {value!r} is not a Slurm time (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, "
                          f"D-HH:MM:SS or UNLIMITED)")
    n = {k: int(v) if v else 0 for k, v in m.groupdict().items()}
    seconds = (n["d"] * 86400 + n["dh"] * 3600 + n["dm"] * 60 + n["ds"] + n["h"] * 3600 + n["hm"] * 60 + n["hs"]
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
            raise UnsafeValue(f"--sbatch-arg: --{m['name']}{said} is set by fleet, not through --sbatch-arg: {why}")
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
        raise UnsafeValue(f"--ranks takes rank numbers (0 or more) separated by commas, not {text!r}")
    return tuple(sorted({int(w) for w in words}))


def fit_stop_before(spec: "JobSpec") -> tuple["JobSpec", str | None]:
    """``spec`` with its stop time set, and a note when the default was shortened. The profilers
    must stop inside the time limit: the default (120 s) becomes half a shorter limit, and a
    ``--stop-before`` that was given and leaves no time to run is refused."""
    limit = time_seconds(spec.time) if spec.time is not None else None
    if spec.stop_before is not None:
        if not isinstance(spec.stop_before, int) or isinstance(spec.stop_before, bool) or spec.stop_before < 1:
            raise UnsafeValue(f"--stop-before: must be 1 second or more, not {spec.stop_before!r} (the profilers "
                              f"are stopped that long before the time limit so their reports are finished)")
        if limit is not None and spec.stop_before >= limit:
            raise UnsafeValue(f"--stop-before {spec.stop_before} is not less than --time {spec.time} ({limit} s): "
                              f"the profilers would be stopped as the job starts; give a longer --time or a "
                              f"smaller --stop-before")
        return spec, None
    if limit is None or DEFAULT_STOP_BEFORE <= limit // 2:
        return replace(spec, stop_before=DEFAULT_STOP_BEFORE), None
    fitted = max(1, limit // 2)
    return replace(spec, stop_before=fitted), (
        f"--time {spec.time} leaves no room for the default --stop-before {DEFAULT_STOP_BEFORE}: the profilers "
        f"stop {fitted} s before the limit (Slurm may signal up to 60 s early; give --stop-before to choose)")


# Each field of a JobSpec (and a playbook's target) that reaches an #SBATCH line, and its check.
FIELDS = {
    "partition": lambda v: name(v, "--partition", many=True),
    "account": lambda v: name(v, "--account"),
    "qos": lambda v: name(v, "--qos"),
    "time": time_seconds,
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


def checked(spec: "JobSpec") -> "JobSpec":
    """``spec`` if sbatch takes every value of it (with its stop time fitted), else UnsafeValue."""
    for field in FIELDS:
        if getattr(spec, field) is not None:
            check_field(field, getattr(spec, field))
    for arg in spec.sbatch_args:
        sbatch_arg(arg)
    if spec.ranks is not None and spec.launcher == "ray":  # actor name patterns (launchers.actor_patterns)
        if not spec.ranks or not all(isinstance(r, str) and r and check_text(r, "--ranks") for r in spec.ranks):
            raise UnsafeValue(f"--ranks: with --launcher ray, actor name patterns, not {list(spec.ranks)!r}")
    elif spec.ranks is not None:
        if not spec.ranks or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 0 for r in spec.ranks):
            raise UnsafeValue(f"--ranks: at least one rank, each 0 or more, not {list(spec.ranks)!r}")
        total = spec.ntasks or (spec.nodes or 1) * (spec.ntasks_per_node or 1)
        shaped_elsewhere = any(a.startswith("--ntasks") for a in spec.sbatch_args)  # --ntasks-per-gpu ...
        if spec.launcher == "srun" and not shaped_elsewhere and max(spec.ranks) >= total:
            raise UnsafeValue(f"--ranks: the job has {total} rank(s), 0 to {total - 1}; rank {max(spec.ranks)} "
                              f"would never be profiled")
    if spec.workdir is not None:
        check_text(spec.workdir, "--workdir")
    if spec.container is not None:
        check_text(spec.container.image, "the container image")
    return fit_stop_before(spec)[0]
