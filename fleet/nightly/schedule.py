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
import shlex
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

MARK = "# fleet-schedule:"
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class ScheduleError(ValueError):
    """A schedule that cannot be made or found."""


def every_seconds(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([smhd]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise ScheduleError(f"--every takes a duration like 30s, 15m, 6h or 1d, not {text!r}")
    return int(m.group(1)) * UNITS[m.group(2) or "s"]


def _field(spec: str, lo: int, hi: int) -> set[int]:
    out: set[int] = set()
    for part in spec.split(","):
        m = re.fullmatch(r"(\*|\d+(?:-\d+)?)(?:/(\d+))?", part)
        if not m:
            raise ScheduleError(f"not a cron field: {spec!r}")
        a, b = (lo, hi) if m.group(1) == "*" else (map(int, m.group(1).split("-")) if "-" in m.group(1)
                                                    else (int(m.group(1)), int(m.group(1))))
        if not lo <= a <= b <= hi:
            raise ScheduleError(f"cron field {spec!r} is outside {lo}-{hi}")
        out.update(range(a, b + 1, int(m.group(2) or 1)))
    return out


def next_cron(expr: str, after: datetime) -> datetime:
    """The first minute after ``after`` that the 5-field cron expression names."""
    fields = expr.split()
    if len(fields) != 5:
        raise ScheduleError(f"a cron expression has 5 fields (minute hour day month weekday), not {expr!r}")
    minute, hour, day, month, weekday = (_field(f, lo, hi) for f, (lo, hi) in
                                         zip(fields, ((0, 59), (0, 23), (1, 31), (1, 12), (0, 7))))
    weekday = {d % 7 for d in weekday}
    t = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(366 * 24 * 60):
        if (t.minute in minute and t.hour in hour and t.month in month and t.day in day
                and (t.isoweekday() % 7) in weekday):
            return t
        t += timedelta(minutes=1)
    raise ScheduleError(f"{expr!r} names no time in the coming year")


def next_begin(record: dict, now: float | None = None) -> str:
    """sbatch --begin for the next occurrence."""
    now = time.time() if now is None else now
    if record.get("every"):
        return f"now+{record['every']}"
    return next_cron(record["cron"], datetime.fromtimestamp(now)).strftime("%Y-%m-%dT%H:%M:%S")


def fleet_argv(record: dict) -> list[str]:
    return [record["python"], "-m", "fleet", "schedule", "fire", record["name"]]


def batch_script(record: dict) -> str:
    """The self-resubmitting job: fleet, on the login node, resubmits it and runs the playbook."""
    env = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(record["env"].items()))
    return ("#!/bin/bash\n"
            f"#SBATCH --job-name=fleet-schedule-{record['name']}\n"
            f"#SBATCH --output={record['dir']}/{record['name']}-%j.out\n"
            "#SBATCH --ntasks=1\n"
            + "".join(f"#SBATCH {a}\n" for a in record.get("sbatch_args", []))
            + f"# fleet schedule {record['name']}: {record.get('cron') or 'every %ss' % record['every']}, "
              f"playbook {record['playbook']}\n" + env + f"exec {shlex.join(fleet_argv(record))}\n")


def crontab_line(record: dict) -> str:
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(record["env"].items()))
    when = record.get("cron") or f"*/{max(1, record['every'] // 60)} * * * *"
    return f"{when} {env} {shlex.join(fleet_argv(record))} >> {record['dir']}/{record['name']}.log 2>&1 " \
           f"{MARK}{record['name']}\n"


def scrontab_lines(record: dict) -> str:
    return (f"#SCRON --job-name=fleet-schedule-{record['name']} --output={record['dir']}/{record['name']}-%j.out\n"
            + crontab_line(record))


def _sh(*argv: str, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), input=input, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def choose_backend(on_slurm_here: bool) -> str:
    """scrontab where Slurm has it enabled, else the resubmitting job on a Slurm login node, else cron."""
    if on_slurm_here:
        config = _sh("scontrol", "show", "config").stdout
        if _sh("sh", "-c", "command -v scrontab").returncode == 0 and re.search(r"ScronParameters\s*=.*enable",
                                                                               config):
            return "scrontab"
        return "resubmit"
    return "crontab"


def records_dir(store_root: Path) -> Path:
    d = store_root / "schedules"
    d.mkdir(parents=True, exist_ok=True)
    return d


def load_record(store_root: Path, name: str) -> dict:
    path = records_dir(store_root) / f"{name}.json"
    if not path.exists():
        raise ScheduleError(f"no schedule named {name!r} in {path.parent}")
    return json.loads(path.read_text())


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
            on_slurm_here: bool, env: dict, sbatch_args: tuple[str, ...] = (), backend: str | None = None) -> dict:
    if bool(cron) == bool(every):
        raise ScheduleError("give one of --cron EXPR and --every DURATION")
    if cron:
        next_cron(cron, datetime.now())  # checks the expression
    d = records_dir(store_root)
    record = {"name": name, "playbook": str(Path(playbook).resolve()), "cron": cron, "every": every,
              "backend": backend or choose_backend(on_slurm_here), "python": sys.executable, "env": env,
              "dir": str(d), "sbatch_args": list(sbatch_args), "job_id": None, "fired": 0}
    (d / f"{name}.json").write_text(json.dumps(record, indent=1))
    if record["backend"] == "resubmit":
        (d / f"{name}.sbatch").write_text(batch_script(record))
        record["job_id"] = submit_next(record)
    elif record["backend"] == "scrontab":
        _edit_table(["scrontab", "-l"], ["scrontab", "-"], name, scrontab_lines(record))
    else:
        _edit_table(["crontab", "-l"], ["crontab", "-"], name, crontab_line(record))
    (d / f"{name}.json").write_text(json.dumps(record, indent=1))
    return record


def submit_next(record: dict) -> str:
    out = _sh("sbatch", "--parsable", f"--begin={next_begin(record)}", f"{record['dir']}/{record['name']}.sbatch",
              env=record["env"])
    if out.returncode != 0:
        raise ScheduleError(f"sbatch of the next occurrence failed: {out.stderr.strip()}")
    return out.stdout.strip().split(";")[0]


def fire(store_root: Path, name: str) -> dict:
    """Inside the scheduled job (or cron): the next occurrence first, then this one's run is the caller's."""
    record = load_record(store_root, name)
    if record["backend"] == "resubmit":
        record["job_id"] = submit_next(record)
    record["fired"] += 1
    record["last_fired"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    path = records_dir(store_root) / f"{name}.json"
    if path.exists():  # removed meanwhile: leave it removed
        path.write_text(json.dumps(record, indent=1))
    return record


def remove(store_root: Path, name: str) -> dict:
    record = load_record(store_root, name)
    (records_dir(store_root) / f"{name}.json").unlink()  # first: a running job will not resubmit
    if record["backend"] == "resubmit":
        jobs = _sh("squeue", "-h", "-n", f"fleet-schedule-{name}", "-o", "%i", env=record["env"]).stdout.split()
        if jobs:
            _sh("scancel", *jobs, env=record["env"])
        record["cancelled"] = jobs
    elif record["backend"] == "scrontab":
        _edit_table(["scrontab", "-l"], ["scrontab", "-"], name)
    else:
        _edit_table(["crontab", "-l"], ["crontab", "-"], name)
    return record
