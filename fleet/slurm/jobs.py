"""Talking to slurmctld through the login node: submit, batched status, cancel.

Every Slurm command goes through fleet's transport to the cluster's login host
(SSH, or this machine when fleet runs there). Status is gentle on slurmctld:
one ``squeue`` call per poll interval for all of a run's jobs, terminal states
cached and never asked again, and a job that has left ``squeue`` (after
``MinJobAge``) asked once of ``sacct`` when accounting exists, else of
``scontrol``. ``squeue --json`` is read where its filters work (23.11 and
later; before that they are ignored and the whole queue would come back);
older Slurm is read from fixed-format text. JSON field names differ between
Slurm versions, so both are parsed defensively.
"""

from __future__ import annotations

import io
import re
import secrets
import tarfile
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .. import exitcodes
from ..errors import FleetError
from ..rundir import RunDir
from . import results
from .jobstate import (DEFAULT_MIN_JOB_AGE, ClusterInfo, JobMarks, JobState, parse_sacct,
                       parse_scontrol, parse_squeue_json, parse_squeue_text)

if TYPE_CHECKING:
    from ..inventory import Host
    from ..transport import Fanout, Result

SQUEUE_FORMAT = "%i|%T|%r|%N|%M"  # id, state, reason, nodes, time used
JSON_FILTERS_FROM = (23, 11)
SLURMCTLD_BOUND = 10  # seconds a command that asks slurmctld may take (it retries for far longer)
# Bounds a command that asks slurmctld, where coreutils' timeout exists (exit 124 past it).
BOUNDED = ('bounded() { if command -v timeout >/dev/null 2>&1; then timeout %d "$@"; '
           'else "$@"; fi; }; ' % SLURMCTLD_BOUND)
# How squeue and scontrol say that a job id is not theirs (the job left, or never was).
INVALID_JOB = re.compile(r"Invalid job id", re.I)

# The job's own files, as read_results lists them in the run folder (the call's shell is in it):
# the exit, stop and refusal marks with what they hold, then sbatch's log, Ray's reports, whose and
# unfinished files, and the reports of ranks that left no result beside them, each as "KIND SIZE
# SHA256 PATH" (KIND: orphan, else the name up to its first - or /: slurm, ray). RunDir's names are
# plain words; the * are the shell's.
_HERE, _ANY_RANK = RunDir(""), RunDir("").node("*").file(RunDir.label("*"))
JOB_FILES = (f'for f in {_HERE.job_exit} {_HERE.job_stopped} {_HERE.job_refused} '
             f'{_HERE.job_stop_asked} {_HERE.job_restarts}; do [ -f "$f" ] && echo "$m $f $(head '
             f'-c 64 "$f")"; done; for f in {_HERE.batch_log_of("*")} '
             f'{_HERE.ray_file("*.nsys-rep")} {_HERE.ray_file("*" + RunDir.WHOSE)} '
             f'{_HERE.ray_file("*" + RunDir.UNFINISHED)} '
             f'{" ".join(map(_HERE.ray_file, RunDir.ray_extra_patterns()))} {_ANY_RANK}.nsys-rep '
             f'{_ANY_RANK}.ncu-rep; do [ -f "$f" ] || continue; case $f in {_ANY_RANK}) [ ! -e '
             f'"${{f%.*}}{RunDir.RESULT}" ] || continue; k=orphan ;; *) k=${{f%%[-/]*}} ;; esac; '
             'echo "$m $k $(stat -c %s "$f") $(sha256sum < "$f" | cut -d" " -f1) $PWD/$f"; done; '
             'true')



class SlurmError(FleetError, RuntimeError):
    """A Slurm command failed; the message is Slurm's own."""

    exit_status = exitcodes.FAILED


class LoginUnreachable(SlurmError):
    """The cluster's login node could not be reached: nothing was asked of Slurm."""

    exit_status = exitcodes.UNREACHABLE


class SlurmctldSilent(SlurmError):
    """The login node answered, but slurmctld did not (down, restarting, or too busy within the
    bound): a job's state is unknown, never "gone"."""


class SlurmRejected(SlurmError):
    """sbatch refused the job's options (an unknown partition, account or QOS, a shape no node has):
    a usage error, nothing was left on the cluster."""


class NoGPUs(SlurmError):
    """The job would read a GPU's counters on a partition whose nodes have none (sinfo's GRES):
    refused before it is submitted."""

    exit_status = exitcodes.REFUSED


class UsageError(SlurmError):
    """The request cannot be a job at all (options the launcher cannot take, say), found before
    the login node is asked anything: exit status 2, nothing was touched."""

    exit_status = exitcodes.USAGE


# How sbatch says that the request itself is wrong, not that Slurm could not be reached.
REJECTED = re.compile(r"invalid|unrecognized option|not available|violates|not permitted|denied",
                      re.I)


def parse_version(text: str) -> tuple[int, int]:
    m = re.search(r"(\d+)\.(\d+)", text)
    if not m:
        raise SlurmError(f"cannot read a Slurm version from {text.strip()!r}")
    return int(m.group(1)), int(m.group(2))


def tar_of(files: dict[str, bytes]) -> bytes:
    """The run's files, dated now: a scratch purge by age must not take them while the job is
    queued."""
    buf, now = io.BytesIO(), time.time()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


@dataclass
class SlurmClient:
    fan: "Fanout"
    login: "Host"
    info: ClusterInfo | None = None
    # every Slurm command issued (the benchmark counts them)
    calls: list[str] = field(default_factory=list)
    _terminal: dict[str, JobState] = field(default_factory=dict)

    async def _sh(self, label: str, script: str, *args: str, input: bytes | None = None,
                  timeout: float = 120) -> "Result":
        self.calls.append(label)
        return await self.fan.run(self.login, ["sh", "-c", script, "sh", *args], input=input,
                                  timeout=timeout)

    def _check(self, r: "Result", what: str) -> str:
        if r.error and not r.reached:
            raise LoginUnreachable(f"{self.login.name} (login node) unreachable: {r.error}")
        if r.exit_status != 0:
            err = (r.stderr.decode(errors="replace").strip()
                   or r.stdout.decode(errors="replace").strip()
                   or r.error or f"exit status {r.exit_status}")
            raise SlurmError(f"{what} failed on {self.login.name}: {err}")
        return r.stdout.decode(errors="replace")

    async def cluster_info(self, partition: str | None = None) -> ClusterInfo:
        """One round trip: the Slurm version, the login user's home, whether accounting exists,
        the cluster's name, how long slurmctld keeps ended jobs, the login node's python3, and the
        GRES of ``partition``'s nodes (slurmctld's part bounded: with slurmctld down the rest still
        comes back)."""
        r = await self._sh("sinfo", BOUNDED + 'sinfo --version && echo "$HOME" && '
                           'echo "FleetPython3 = $(command -v python3)" && (bounded scontrol show '
                           'config 2>/dev/null | grep -i -e "^AccountingStorageType" -e '
                           '"^ClusterName" -e "^MinJobAge" || true) && { [ -z "$1" ] || bounded '
                           'sinfo -h -p "$1" -o "FleetGres:%G" 2>/dev/null || true; }',
                           partition or "")
        lines = self._check(r, "sinfo --version").splitlines()
        if len(lines) < 2:
            raise SlurmError(f"unexpected answer from {self.login.name}: {lines}")
        gres = tuple(line[len("FleetGres:"):].strip()[:200] for line in lines[2:]
                     if line.startswith("FleetGres:"))
        config = {key.strip().lower(): value.strip() for key, _, value in (line.partition("=")
                                                                           for line in lines[2:]
                                                                           if not line.startswith(
                                                                               "FleetGres:"))}
        accounting = ("accountingstoragetype" in config
                      and "none" not in config["accountingstoragetype"].lower())
        age = re.match(r"\d+", config.get("minjobage", ""))
        python = config.get("fleetpython3") or ""
        self.info = ClusterInfo(parse_version(lines[0]), lines[0].strip(), lines[1].strip(),
                                accounting,
                                config.get("clustername") or None, int(age.group()) if age
                                else DEFAULT_MIN_JOB_AGE,
                                python if python.startswith("/") else None, gres[:64])
        return self.info

    async def submit(self, run_dir: str, files: dict[str, bytes], script: str) -> str:
        """Put the run's files in place and sbatch the script, in one round trip; the job id. The
        run directory is made new here (a run id is never reused), so when sbatch refuses the job it
        goes again, whole: nothing is left on the login node (SlurmRejected when the options were
        wrong)."""
        r = await self._sh("sbatch",
                           'set -e; umask 077; mkdir -p -- "${1%/*}"; mkdir -- "$1"; cd -- "$1"; '
                           'if tar -x -f - && sbatch --parsable -- "$2"; then exit 0; fi; '
                           'cd /; rm -rf -- "$1"; exit 1', run_dir, script, input=tar_of(files))
        if r.reached and r.exit_status not in (0,
                                               None) and REJECTED.search(
                                                   r.stderr.decode(errors="replace")):
            said = "; ".join(line.strip() for line in r.stderr.decode(errors="replace").splitlines()
                             if line.strip())
            raise SlurmRejected(f"sbatch refused the job on {self.login.name}: {said}; "
                                "nothing was left there")
        out = self._check(r, "sbatch").strip()
        job = out.splitlines()[-1].split(";")[0] if out else ""
        if not job.isdigit():
            raise SlurmError(f"sbatch gave no job id: {out!r}")
        return job

    def _silent(self, r: "Result", what: str) -> None:
        """SlurmctldSilent when a command that asks slurmctld got no answer from it: it failed
        otherwise than by saying a job id is not its own (or the login node was not reached)."""
        if r.error and not r.reached:
            self._check(r, what)
        if r.exit_status not in (0,
                                 None) and not INVALID_JOB.search(
                                     r.stderr.decode(errors="replace")):
            said = r.stderr.decode(errors="replace").strip().splitlines()
            why = "no answer within %d s" % SLURMCTLD_BOUND if r.exit_status == 124 else (
                said[-1] if said else f"exit status {r.exit_status}")
            raise SlurmctldSilent(f"slurmctld not answering ({what} on {self.login.name}: {why})")

    async def states(self, job_ids: list[str],
                     submitted: dict[str, float] | None = None) -> dict[str, JobState]:
        """The state of every job: cached terminal ones free, the rest in one ``squeue`` call.
        SlurmctldSilent when slurmctld does not answer. A job no record knows any more is GONE,
        unless it was submitted (``submitted``: job id -> time.time()) within MinJobAge: then
        slurmctld has not yet let it go, and its state is UNKNOWN."""
        ask = [j for j in job_ids if j not in self._terminal]
        found: dict[str, JobState] = {}
        if ask:
            found = self._not_gone_yet(await self._squeue(ask), submitted)
        for job, st in found.items():
            if st.terminal:
                self._terminal[job] = st
        return {j: self._terminal.get(j) or found.get(j) or JobState(j, "UNKNOWN") for j in job_ids}

    async def _squeue(self, ask: list[str]) -> dict[str, JobState]:
        """The jobs' states in one ``squeue`` call; those that have left it, from
        :meth:`_after_squeue`."""
        use_json = self.info is not None and self.info.version >= JSON_FILTERS_FROM
        if use_json:
            r = await self._sh("squeue", BOUNDED + 'bounded squeue --json --states=all --jobs="$1"',
                               ",".join(ask))
        else:
            r = await self._sh("squeue", BOUNDED
                               + 'bounded squeue --noheader --states=all --jobs="$1" '
                               '--format="$2"', ",".join(ask), SQUEUE_FORMAT)
        # squeue exits 1 ("Invalid job id") when every job asked for has left it.
        self._silent(r, "squeue")
        text = r.stdout.decode(errors="replace")
        found = (parse_squeue_json(text) if use_json and text.strip().startswith("{")
                 else parse_squeue_text(text))
        gone = [j for j in ask if j not in found]
        if gone:
            found.update(await self._after_squeue(gone))
        return found

    def _not_gone_yet(self, found: dict[str, JobState],
                      submitted: dict[str, float] | None) -> dict[str, JobState]:
        """``found``, where a job GONE was submitted within MinJobAge: UNKNOWN, as slurmctld has
        not let it go yet."""
        age = self.info.min_job_age if self.info is not None else DEFAULT_MIN_JOB_AGE
        for job, st in list(found.items()):
            since = (submitted or {}).get(job)
            waited = time.time() - since if since is not None else None
            if st.state == "GONE" and waited is not None and waited < age:
                found[job] = JobState(job, "UNKNOWN",
                                      f"not in slurmctld's records {int(waited)} s after "
                                      f"submission (it keeps a job {age} s, MinJobAge)")
        return found

    async def _after_squeue(self, jobs: list[str]) -> dict[str, JobState]:
        """Jobs no longer in squeue: once, from accounting, or from scontrol while it remembers
        them."""
        if self.info is None:  # not asked yet (`fleet jobs`): whether the cluster keeps accounting
            await self.cluster_info()
        if self.info is not None and self.info.accounting:
            r = await self._sh("sacct", BOUNDED
                               + 'bounded sacct --noheader --parsable2 --allocations --jobs="$1" '
                               '--format=JobID,State,ExitCode,NodeList,Elapsed', ",".join(jobs))
            if r.exit_status == 0:
                found = parse_sacct(r.stdout.decode(errors="replace"))
                if found:
                    return found
        out = {}
        for job in jobs:  # rare: only a job that left squeue, once
            r = await self._sh("scontrol", BOUNDED + 'bounded scontrol -o show job "$1"', job)
            self._silent(r, "scontrol show job")
            st = parse_scontrol(r.stdout.decode(errors="replace")) if r.exit_status == 0 else None
            out[job] = st or JobState(job, "GONE",
                                      "no longer known to slurmctld (MinJobAge passed)")
        return out

    async def cancel(self, job_ids: list[str], signal: str | None = None,
                     run_dirs: list[str] = ()) -> None:
        """scancel the jobs (only ``signal`` to their steps, if given), fleet's stop first recorded
        in each run's folder (``run_dirs``: RunDir.JOB_STOP_ASKED, never through a file already
        there), so that a rank its signal killed reads as fleet's stop however the signal raced its
        agent."""
        args = ['scancel', *([f"--signal={signal}"] if signal else []), "--", *job_ids]
        dirs = " ".join('"${%d}"' % (i + 2) for i in range(len(run_dirs)))  # $2.. : the run folders
        mark = (f'set -C; for d in {dirs}; do date +%s 2>/dev/null > "$d/{RunDir.JOB_STOP_ASKED}" '
                '|| true; done; set +C; ') if run_dirs else ""
        r = await self._sh("scancel", mark + 'shift "$1"; exec "$@"', str(len(run_dirs) + 1),
                           *run_dirs, *args)
        self._check(r, "scancel")

    async def read_results(self, run_dir: str) -> tuple[list[results.RankResult], JobMarks]:
        """Every rank's result document and the job's own files (exit status, stop time, the job's
        log, the reports Ray's nsys wrote, and the reports of ranks killed before they wrote a
        result, each with its size and sha256), in one call. fleet's own lines carry a nonce made
        for this call, so no line a job wrote into a file of its run reads as one of them. A
        result file that is not the agent's own (:mod:`.results`) is in the marks'
        ``refused_results``, as (its path, why)."""
        nonce = secrets.token_hex(16)
        r = await self._sh("results", 'cd -- "$1" 2>/dev/null || exit 0; m="@@$2"; ' + results.READ
                           + JOB_FILES, run_dir, nonce, str(results.RESULT_MAX))
        text = self._check(r, "reading the run's results")
        files, refused, other = results.split(text, f"@@{nonce} ")
        found = []
        for path, content in files:
            result, why = results.from_file(path, content)
            if result is None:
                refused.append((path, why))
            else:
                found.append(result)
        # the job's own files, as this call's shell found them
        return found, JobMarks.read(other, refused)


FILE_MARK = re.compile(r"(\d{1,15}) ([0-9a-f]{64}) (/.+)")


def file_mark(value: str) -> dict | None:
    """A file as :meth:`SlurmClient.read_results` listed it (size, sha256, path), or None."""
    m = FILE_MARK.fullmatch(value or "")
    return {"size": int(m.group(1)), "sha256": m.group(2), "path": m.group(3)} if m else None
