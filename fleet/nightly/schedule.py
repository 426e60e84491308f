"""Schedules: a playbook run unattended, by what the site has.

In order of preference:

1. **scrontab**, Slurm's own cron, where the cluster's Slurm has it and
   ``ScronParameters=enable`` (not in Debian's 22.05 client);
2. **a self-resubmitting batch job**, which works on every Slurm: the job first
   submits its next occurrence (``sbatch --begin=``), then runs the playbook
   with fleet on the login node it was submitted from;
3. **the controller's crontab**, for lab servers or a cluster fleet reaches over SSH.

Every fired schedule is a normal ``fleet run``: reports gathered, catalogued.
A schedule's record (``STORE/schedules/NAME.json``) is the truth: ``fleet schedule
rm`` deletes it first, so a job already running does not resubmit itself.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from croniter import croniter

from ..errors import FleetError
from ..policy.readers import int_of, number_of, str_of, strs_of

from .. import safenames

MARK = "# fleet-schedule:"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


# What crontab(5) and scrontab take besides the five fields (not @reboot: a schedule fires at
# times).
ALIASES = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
NAMES = {"SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT",
         "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"}
# The intervals a crontab line repeats exactly: minutes dividing the hour, hours dividing the day, a
# day.
EXACT = [60 * m for m in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20,
                          30)] + [3600 * h for h in (1, 2, 3, 4, 6, 8, 12)] + [86400]
TOOLS = {"crontab": ("crontab",), "scrontab": ("scrontab",), "resubmit": ("sbatch",)}
RM_TOOLS = {"crontab": ("crontab",), "scrontab": ("scrontab",), "resubmit": ("squeue", "scancel")}


class ScheduleError(FleetError, ValueError):
    """A schedule that cannot be made or found."""


@dataclass(frozen=True)
class ScheduleRecord:
    """A schedule's record (``STORE/schedules/NAME.json``), read once: a file on disk, so a value
    not of its type reads as absent. ``doc`` is the record as read, written back when it fires
    and shown by ``--json`` as it is (an older fleet's keys too)."""
    name: str | None = None
    playbook: str | None = None         # the playbook's absolute path
    backend: str | None = None          # crontab | scrontab | resubmit
    python: str | None = None           # the Python that installed it, and fires it
    dir: str | None = None              # the store's schedules folder: logs, the job's script
    cron: str | None = None
    every: int | None = None            # seconds
    env: dict[str, str] = field(default_factory=dict)   # the firing's environment
    sbatch_args: tuple[str, ...] = ()
    job_id: str | None = None           # the resubmitting job's next occurrence
    fired: int = 0
    installed_ts: float | None = None
    last_fired_ts: float | None = None
    would_install: str | None = None    # a dry run's lines
    doc: dict = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def read(cls, doc: Any) -> "ScheduleRecord":
        doc = doc if isinstance(doc, dict) else {}
        env = doc.get("env") if isinstance(doc.get("env"), dict) else {}
        return cls(str_of(doc.get("name")), str_of(doc.get("playbook")),
                   str_of(doc.get("backend")), str_of(doc.get("python")), str_of(doc.get("dir")),
                   str_of(doc.get("cron")), int_of(doc.get("every")),
                   {k: v for k, v in env.items() if isinstance(k, str) and isinstance(v, str)},
                   strs_of(doc.get("sbatch_args")), str_of(doc.get("job_id")),
                   int_of(doc.get("fired")) or 0, number_of(doc.get("installed_ts")),
                   number_of(doc.get("last_fired_ts")), str_of(doc.get("would_install")), doc)


def check_name(name: str) -> str:
    """A schedule's name is one safe path component, a job name and a word of a crontab line."""
    if not safenames.is_safe(name):
        raise ScheduleError(f"a schedule name is {safenames.RULE}, not {name!r} (give --name)")
    return name


def quote(value) -> str:
    """A value as one word of a crontab line or of the resubmitting job: fleet's one quoting
    function (``safenames.quote``), its refusal a ScheduleError."""
    try:
        return safenames.quote(value, "a crontab line or batch script")
    except safenames.UnsafeValue as e:
        raise ScheduleError(str(e)) from None


def every_seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([smhd]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise ScheduleError(f"--every takes a duration like 30s, 15m, 6h or 1d, not {text!r}")
    return int(m.group(1)) * UNITS[m.group(2) or "s"]


def duration(seconds: int) -> str:
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % n == 0:
            return f"{seconds // n}{unit}"
    return f"{seconds}s"


def every_cron(seconds: int) -> str:
    """The cron expression that fires exactly every ``seconds``, or a ScheduleError naming the
    nearest."""
    if seconds == 86400:
        return "0 0 * * *"
    if seconds % 3600 == 0 and seconds in EXACT:
        return "0 * * * *" if seconds == 3600 else f"0 */{seconds // 3600} * * *"
    if seconds in EXACT:
        return "* * * * *" if seconds == 60 else f"*/{seconds // 60} * * * *"
    near = min(EXACT, key=lambda e: (abs(e - seconds), -e))
    raise ScheduleError(f"cron cannot fire exactly every {duration(seconds)} (it counts minutes of "
                        "the hour and hours of the day): the nearest it can is --every "
                        f"{duration(near)} (--cron '{every_cron(near)}'); the resubmit backend "
                        "takes any interval")


def check_cron(expr: str) -> str:
    """A cron expression as crontab(5) takes it: five fields (names like MON, JAN) or an @alias."""
    text = " ".join(expr.split())
    if "\n" in expr or "\r" in expr:
        raise ScheduleError(f"a cron expression is one line, not {expr!r}")
    if text.startswith("@"):
        if text.lower() not in ALIASES:
            raise ScheduleError(f"{expr!r}: the @ forms are {', '.join(ALIASES)}")
        return text.lower()
    fields = text.split(" ")
    if len(fields) != 5:
        raise ScheduleError("a cron expression has 5 fields (minute hour day month weekday), not "
                            f"{expr!r}")
    for f in fields:  # croniter also knows L, W, #, H and seconds: cron does not
        if not re.fullmatch(r"[0-9A-Za-z*,/-]+", f) or set(re.findall(r"[A-Za-z]+",
                                                                      f.upper())) - NAMES:
            raise ScheduleError(f"{expr!r}: {f!r} is not a cron field (numbers, *, ranges, steps, "
                                f"lists, names like MON or JAN)")
    if not croniter.is_valid(text):
        raise ScheduleError(f"{expr!r} is not a valid cron expression")
    return text


def when(record: ScheduleRecord) -> str | None:
    """The cron expression a crontab or scrontab line carries (None: the resubmitting job's
    interval)."""
    if record.cron:
        return record.cron
    return None if record.backend == "resubmit" else every_cron(record.every)


def next_times(record: ScheduleRecord, count: int = 3,
               now: float | None = None) -> list[datetime]:
    """The next ``count`` firings, in local time (cron's): by croniter, or by the job's interval."""
    now = time.time() if now is None else now
    expr = when(record)
    if expr:
        # implement_cron_bug: like cron, day and weekday are ANDed when either starts with '*'
        it = croniter(expr, datetime.fromtimestamp(now), implement_cron_bug=True)
        return [it.get_next(datetime) for _ in range(count)]
    base = record.last_fired_ts or record.installed_ts or now
    k = max(1, int((now - base) // record.every) + 1)
    return [datetime.fromtimestamp(base + (k + i) * record.every).replace(microsecond=0)
            for i in range(count)]


def next_begin(record: ScheduleRecord, now: float | None = None) -> str:
    """sbatch --begin for the next occurrence."""
    if record.every:
        return f"now+{record.every}"
    return next_times(record, 1, now)[0].strftime("%Y-%m-%dT%H:%M:%S")


def fleet_argv(record: ScheduleRecord) -> list[str]:
    # The resubmitting job runs in the folder it was submitted from, which Python's -m would put
    # first on sys.path: -P (Python 3.11, the controller's) keeps fleet's own modules the installed
    # ones.
    safe = ["-P"] if record.backend == "resubmit" else []
    return [record.python, *safe, "-m", "fleet", "schedule", "fire", check_name(record.name)]


def _env_words(record: ScheduleRecord) -> list[str]:
    return [f"{k}={quote(v)}" for k, v in sorted(record.env.items())
            if re.fullmatch(r"[A-Za-z_]\w*", k)]


def batch_script(record: ScheduleRecord) -> str:
    """The self-resubmitting job: fleet, on the login node, resubmits it and runs the playbook.
    Its sbatch options go on sbatch's command line (``submit_next``), not into the script."""
    env = "".join(f"export {w}\n" for w in _env_words(record))
    return ("#!/bin/bash\n"
            f"# fleet schedule {check_name(record.name)}: "
            f"{quote(record.cron or duration(record.every))}, playbook "
            f"{quote(record.playbook)}\n" + env
            + f"exec {' '.join(map(quote, fleet_argv(record)))}\n")


def crontab_line(record: ScheduleRecord) -> str:
    """One crontab(5) line. cron reads an unescaped % as a newline, so each is written \\%."""
    log = f"{record.dir}/{check_name(record.name)}.log"
    command = " ".join([*_env_words(record), *map(quote, fleet_argv(record)), ">>", quote(log),
                        "2>&1"])
    return f"{when(record)} {command.replace('%', chr(92) + '%')} {MARK}{record.name}\n"


def scrontab_lines(record: ScheduleRecord) -> str:
    out = quote(f"{record.dir}/{check_name(record.name)}-%j.out")
    return (f"#SCRON --job-name=fleet-schedule-{record.name} --output={out}\n"
            + crontab_line(record))


def _sh(*argv: str, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), input=input, capture_output=True, text=True,
                              env={**os.environ, **(env or {})})
    except FileNotFoundError:
        raise ScheduleError(f"{argv[0]} is not installed here (not on PATH)") from None


def _need(tools: tuple[str, ...], backend: str, env: dict) -> None:
    """The tools on the PATH they will run with (Slurm's with the schedule's environment, crontab
    with ours)."""
    path = (env.get("PATH") if backend == "resubmit" else None) or os.environ.get("PATH")
    for tool in tools:
        if shutil.which(tool, path=path) is None:
            raise ScheduleError(f"the {backend} backend needs {tool}, which is not installed here "
                                f"(not on PATH); nothing was changed")


def choose_backend(on_slurm_here: bool) -> str:
    """scrontab where Slurm has it enabled, else the resubmitting job on a Slurm login node, else
    cron."""
    if on_slurm_here:
        config = _sh("scontrol", "show", "config").stdout if shutil.which("scontrol") else ""
        if shutil.which("scrontab") and re.search(r"ScronParameters\s*=.*enable", config):
            return "scrontab"
        return "resubmit"
    return "crontab"


def records_dir(store_root: Path, make: bool = True) -> Path:
    d = store_root / "schedules"
    if make:
        d.mkdir(parents=True, exist_ok=True)
    return d


def load_record(store_root: Path, name: str) -> ScheduleRecord:
    path = records_dir(store_root) / f"{check_name(name)}.json"
    if not path.exists():
        raise ScheduleError(f"no schedule named {name!r} in {path.parent}")
    return ScheduleRecord.read(json.loads(path.read_text()))


def _edit_table(lister: list[str], writer: list[str], name: str, add: str = "") -> None:
    """Replace our lines in a crontab-like table (crontab, scrontab): others' lines stay."""
    listed = _sh(*lister)
    current = listed.stdout if listed.returncode == 0 else ""  # no table yet: an empty one
    keep, skip_next = [], False
    for line in current.splitlines(keepends=True):
        if skip_next:  # the entry line after our #SCRON line
            skip_next = False
            if line.rstrip().endswith(f"{MARK}{name}"):
                continue
        if line.startswith("#SCRON") and f"fleet-schedule-{name} " in line:
            skip_next = True
            continue
        if line.rstrip().endswith(f"{MARK}{name}"):
            continue
        keep.append(line)
    out = _sh(*writer, input="".join(keep) + add)
    if out.returncode != 0:
        raise ScheduleError(f"{' '.join(writer)} failed: {out.stderr.strip()}")


def install(store_root: Path, name: str, playbook: str, *, cron: str | None, every: int | None,
            on_slurm_here: bool, env: dict, sbatch_args: tuple[str, ...] = (),
            backend: str | None = None, dry_run: bool = False) -> ScheduleRecord:
    """Check everything, then set the schedule up; when that fails, nothing stays recorded. With
    ``dry_run``, every check, and the record with what would be installed (``would_install``)
    back; nothing written, submitted or edited."""
    if bool(cron) == bool(every):
        raise ScheduleError("give one of --cron EXPR and --every DURATION")
    check_name(name)
    backend = backend or choose_backend(on_slurm_here)
    d = records_dir(store_root, make=not dry_run)
    doc = {"name": name, "playbook": str(Path(playbook).resolve()),
           "cron": cron and check_cron(cron), "every": every, "backend": backend,
           "python": sys.executable, "env": env, "dir": str(d), "sbatch_args": list(sbatch_args),
           "job_id": None, "fired": 0, "installed_ts": time.time()}
    record = ScheduleRecord.read(doc)
    when(record)  # --every that cron cannot repeat exactly: refused here
    _need(TOOLS[backend], backend, env)
    # quoting refusals here
    lines = (batch_script(record) if backend == "resubmit" else
             scrontab_lines(record) if backend == "scrontab" else crontab_line(record))
    if dry_run:
        doc["would_install"] = lines
        return ScheduleRecord.read(doc)
    path = d / f"{name}.json"
    path.write_text(json.dumps(doc, indent=1))  # before the job: the job reads it when it starts
    try:
        if backend == "resubmit":
            (d / f"{name}.sbatch").write_text(lines)
            doc["job_id"] = submit_next(record)
        elif backend == "scrontab":
            _edit_table(["scrontab", "-l"], ["scrontab", "-"], name, lines)
        else:
            _edit_table(["crontab", "-l"], ["crontab", "-"], name, lines)
    except BaseException:
        path.unlink(missing_ok=True)
        (d / f"{name}.sbatch").unlink(missing_ok=True)
        raise
    path.write_text(json.dumps(doc, indent=1))
    return ScheduleRecord.read(doc)


def submit_next(record: ScheduleRecord) -> str:
    name = check_name(record.name)
    out = _sh("sbatch", "--parsable", f"--begin={next_begin(record)}",
              f"--job-name=fleet-schedule-{name}",
              f"--output={record.dir}/{name}-%j.out", "--ntasks=1", *record.sbatch_args,
              f"{record.dir}/{name}.sbatch", env=record.env)
    if out.returncode != 0:
        raise ScheduleError(f"sbatch of the next occurrence failed: {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]


def fire(store_root: Path, name: str) -> ScheduleRecord:
    """Inside the scheduled job (or cron): the next occurrence first, then this one's run is the
    caller's."""
    record = load_record(store_root, name)
    fired = dict(record.doc)
    if record.backend == "resubmit":
        fired["job_id"] = submit_next(record)
    fired["fired"] = record.fired + 1
    fired["last_fired"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    fired["last_fired_ts"] = time.time()
    path = records_dir(store_root) / f"{name}.json"
    if path.exists():  # removed meanwhile: leave it removed
        path.write_text(json.dumps(fired, indent=1))
    return ScheduleRecord.read(fired)


def remove(store_root: Path, name: str) -> ScheduleRecord:
    """The schedule removed: its record first, then its job or its table's lines; the record
    as it was (``cancelled``: the resubmitting job's occurrences cancelled)."""
    record = load_record(store_root, name)
    # before anything is removed
    _need(RM_TOOLS[record.backend], record.backend, record.env)
    (records_dir(store_root) / f"{name}.json").unlink()  # first: a running job will not resubmit
    if record.backend == "resubmit":
        jobs = _sh("squeue", "-h", "-n", f"fleet-schedule-{name}", "-o", "%i",
                   env=record.env).stdout.split()
        if jobs:
            _sh("scancel", *jobs, env=record.env)
        return ScheduleRecord.read({**record.doc, "cancelled": jobs})
    if record.backend == "scrontab":
        _edit_table(["scrontab", "-l"], ["scrontab", "-"], name)
    else:
        _edit_table(["crontab", "-l"], ["crontab", "-"], name)
    return record
