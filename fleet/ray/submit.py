"""``fleet ray submit``: a Ray job submitted to a running Ray cluster, as Ray documents it (``ray
job submit --runtime-env-json``), with fleet's runtime_env: every worker of the job (or only the
actors ``--ranks`` names) under nsys, each report named by whose it is, brought home from the head.

fleet does not put ``_nsight`` in the job's runtime_env itself: Ray starts the job's supervisor
actor with that runtime_env, and the job's driver runs as the supervisor's child, so nsys would
wrap the supervisor and the driver (the mistake of wrapping the launcher) besides the workers.
The job's runtime_env carries fleet's hook instead (``py_modules``: Ray uploads it to the nodes;
``env_vars``: ``RAY_RUNTIME_ENV_HOOK`` and the ``_nsight`` block), and the driver's ``ray.init``
calls the hook, which gives the workers ``_nsight`` (fleet/slurm/ray_hook.py, as in a Slurm job).

Each worker's report is ``NODE_DIR/ray/worker-HOST-PID.nsys-rep`` on the node it ran on, with its
``.whose.json`` beside it; fleet brings home those on the head (``--head``: this machine for a
loopback address). A worker on another node leaves its report on that node, unless ``--node-dir``
is a folder every node shares.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import secrets
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from .. import outcome, store
from ..agent.bundle import bundle
from ..rundir import RunDir
from ..agentcall import agent_argv
from ..errors import FleetError
from ..statuses import HostStatus, RunStatus
from ..safenames import check_text
from ..slurm import launchers
from ..slurm.jobs import file_mark
from ..slurm.ray_hook import ACTORS_ENV, BLOCK_ENV
from ..slurm.raygather import driver_failed, workers_home
from ..store.manifest import HostEntry, RunManifest

if TYPE_CHECKING:
    from ..inventory import Host
    from ..plan import ProfileRequest
    from ..transport import Fanout

# the module name RAY_RUNTIME_ENV_HOOK and worker_process_setup_hook name
HOOK_PACKAGE = "fleet_ray_hook"
LIST_TIMEOUT = 120.0  # seconds for the head to list and hash the reports
# seconds for the head to wait for the workers' nsys and summarize their reports
END_TIMEOUT = 3600.0
# Where a run's folder is on the nodes unless --node-dir says: the home of the user Ray runs as (its
# ~ said on the head, by fleet's hook and by the listing), never a folder
# every account shares (/tmp).
NODE_DIR = "~/.cache/fleet-ray-runs"
# The folders another account could swap, checked on the head in NODE_DIR ($1, ~/ the home of the
# user Ray runs as; $2 the call's nonce): ray/ the user's and private, NODE_DIR the user's and not
# writable by others, and every folder above up to / the user's and not writable by others, or
# root's with no account able to rename what is not its own in it (/tmp: sticky). One that is not
# refuses it all.
HOME_DIR = 'case $1 in "~/"*) set -- "$HOME/${1#"~/"}" "$2" ;; esac; '
# The walk up from folder $d, at $level below ray/ (0: ray/ itself), to /, refusing the first folder
# that fails the rules above.
WALK = ('me=$(id -u); while :; do '
        '  if [ -L "$d" ] || [ ! -d "$d" ]; then echo "@@$2 refused $d is not a folder (a link?)"; '
        'exit 0; fi;   set -- "$1" "$2" $(stat -c "%u %a" -- "$d"); u=$3; m=$((0$4)); '
        '  if [ $level -ge 2 ] && [ "$u" = 0 ]; then '
        '    if [ $((m & 2)) -ne 0 ] && [ $((m & 512)) -eq 0 ]; then '
        '      echo "@@$2 refused $d is root\'s, and any account may rename what is in it (mode '
        '$4)"; exit 0; fi;   elif [ "$u" != "$me" ]; then echo "@@$2 refused $d belongs to uid $u, '
        'not to the user (uid $me)"; exit 0;   elif [ $((m & (level == 0 ? 63 : 18))) -ne 0 ]; '
        'then     echo "@@$2 refused $d is open to other accounts (mode $4)"; exit 0; fi; '
        '  [ "$d" = / ] && break; d=$(dirname -- "$d"); level=$((level + 1)); '
        'done; ')
FOLDERS = f'd=$(pwd -P)/{RunDir.RAY}; level=0; ' + WALK + 'echo "@@$2 folder $PWD"; '
# Before anything is made: the deepest of NODE_DIR and the folders above it that exists, walked up,
# so that a folder of another account is refused before fleet makes anything in it.
FIRST = ('case $1 in /*) d=$1 ;; *) d=$(pwd -P)/$1 ;; esac; level=1; '
         'while [ ! -e "$d" ] && [ ! -L "$d" ]; do d=$(dirname -- "$d"); level=$((level + 1)); '
         'done; if [ -d "$d" ]; then d=$(cd -- "$d" && pwd -P); ' + WALK + 'fi; ')
# Before the job: NODE_DIR and its ray/ made 0700 where missing (what is above them as mkdir -p
# makes it), then checked, so that no other account makes them first.
PREPARE = (HOME_DIR + FIRST + '[ -d "$1" ] || mkdir -p -- "$(dirname -- "$1")" 2>/dev/null; '
           '[ -d "$1" ] || [ -L "$1" ] || mkdir -m 700 -- "$1" 2>/dev/null; '
           'cd -- "$1" 2>/dev/null || { echo "@@$2 refused $1 cannot be made or entered"; exit 0; '
           f'}}; [ -e {RunDir.RAY} ] || [ -L {RunDir.RAY} ] || mkdir -m 700 -- {RunDir.RAY}; '
           + FOLDERS)
# Each report, whose file, unfinished mark, export and summary in NODE_DIR/ray, with its size and
# sha256, as the head computes them, once the folders hold; a link, or a file not the user's or
# writable by others, refused by name.
EXTRAS = " ".join(f"{RunDir.RAY}/{pattern}" for pattern in RunDir.ray_extra_patterns())
LISTING = (HOME_DIR
           + f'cd -- "$1" 2>/dev/null || exit 0; [ -e {RunDir.RAY} ] || [ -L {RunDir.RAY} ] || '
             'exit 0; '
           + FOLDERS +
           f'for f in {RunDir.RAY}/*{RunDir.NSYS_REPORT} {RunDir.RAY}/*{RunDir.WHOSE} '
           f'{RunDir.RAY}/*{RunDir.UNFINISHED} '
           f'{EXTRAS}; do '
           '[ -L "$f" ] && { echo "@@$2 refused $PWD/$f is a symbolic link"; continue; }; [ -f '
           '"$f" ] || continue; set -- "$1" "$2" $(stat -c "%u %a" -- "$f"); '
           'if [ "$3" != "$me" ] || [ $((0$4 & 18)) -ne 0 ]; then '
           '  echo "@@$2 refused $PWD/$f has owner $3 and mode $4 (the user is uid $me; no one '
           'else may write it)";   continue; fi; '
           'echo "@@$2 $(stat -c %s "$f") $(sha256sum < "$f" | cut -d" " -f1) $PWD/$f"; '
           'done; true')


class RaySubmitError(FleetError):
    """The submission cannot be made as asked."""


@dataclass(frozen=True)
class RayJob:
    address: str                     # the cluster's dashboard, http://HOST:PORT
    entrypoint: tuple[str, ...]      # what the job runs, as `ray job submit -- ...` takes it
    node_dir: str                    # the run's folder on the nodes; reports in NODE_DIR/ray
    actors: tuple[str, ...] = ()     # fnmatch patterns of the actors to profile; () every worker
    profiler_args: tuple[str, ...] = ()
    working_dir: str | None = None   # Ray's --working-dir: uploaded, the entrypoint runs in it
    submission_id: str = ""

    def problem(self) -> str | None:
        """Why this job cannot be submitted as asked, or None."""
        url = urlsplit(self.address)
        if url.scheme not in ("http", "https") or not url.hostname or url.path not in ("", "/"):
            return (f"--address {self.address!r}: the Ray dashboard's "
                    "address, e.g. http://127.0.0.1:8265")
        if not self.entrypoint:
            return "the job's entrypoint: fleet ray submit --address URL -- python prog.py"
        if not self.node_dir.startswith(("/", "~/")):
            return (f"--node-dir {self.node_dir!r}: an absolute path, or one in the home of the "
                    f"user Ray runs as (~/...): nsys is given it on every node")
        for value, what in ((self.node_dir, "--node-dir"), *((a, "--ranks") for a in self.actors)):
            check_text(value, what)
        return launchers.unsupported("ray", "nsys", self.profiler_args)


def loopback(address: str) -> bool:
    """Whether the dashboard is on this machine (its reports can be read here)."""
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def runtime_env(job: RayJob, hook_dir: Path) -> dict:
    """The job's runtime_env: fleet's hook (uploaded by Ray), named by env_vars, and its block."""
    block = launchers.ray_runtime_env(job.node_dir, "nsys", job.profiler_args)
    env_vars = {"RAY_RUNTIME_ENV_HOOK": f"{HOOK_PACKAGE}.runtime_env_hook",
                BLOCK_ENV: json.dumps(block)}
    if job.actors:
        env_vars[ACTORS_ENV] = json.dumps(list(job.actors))
    env: dict = {"py_modules": [str(hook_dir)], "env_vars": env_vars}
    if job.working_dir:
        env["working_dir"] = job.working_dir
    return env


def submit_argv(job: RayJob, env: dict) -> list[str]:
    """``ray job submit`` as Ray documents it, waiting for the job and printing its log."""
    return ["ray", "job", "submit", "--address", job.address, "--submission-id", job.submission_id,
            "--runtime-env-json", json.dumps(env, sort_keys=True), "--", *job.entrypoint]


def write_hook(folder: Path) -> Path:
    """fleet's hook as a package Ray's py_modules uploads (the job SDK uploads folders only)."""
    package = folder / HOOK_PACKAGE
    package.mkdir(mode=0o700)
    (package / "__init__.py").write_text(launchers.RAY_HOOK.read_text())
    return package


async def submit(job: RayJob) -> tuple[int, str]:
    """``ray job submit``'s exit status (1: the job failed) and the command,
    its output on stderr."""
    with tempfile.TemporaryDirectory(prefix="fleet-ray-") as tmp:
        argv = submit_argv(job, runtime_env(job, write_hook(Path(tmp))))
        try:
            proc = await asyncio.create_subprocess_exec(*argv, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=sys.stderr)
        except OSError as e:
            raise RaySubmitError(f"cannot run `ray job submit` ({e.strerror}): install Ray here "
                                 f"(pip install 'ray[default]')") from None
        return await proc.wait(), shlex.join(argv)


async def on_head(fan: "Fanout", head: "Host", script: str,
                  node_dir: str) -> tuple[list[str] | None, str | None]:
    """The lines ``script`` marked, run on the head for NODE_DIR; or why it could not run."""
    nonce = secrets.token_hex(16)
    r = await fan.run(head, ["sh", "-c", script, "fleet", node_dir, nonce], timeout=LIST_TIMEOUT)
    if not r.ok:
        return None, r.error or r.stderr.decode(errors="replace").strip()[-200:]
    mark = f"@@{nonce} "
    return [line[len(mark):] for line in r.stdout.decode(errors="replace").splitlines()
            if line.startswith(mark)], None


async def folder_refused(fan: "Fanout", head: "Host", node_dir: str) -> str | None:
    """Why the run's folder on the head cannot be the run's (made here where missing), or None."""
    lines, failed = await on_head(fan, head, PREPARE, node_dir)
    if failed:
        return f"could not make {RunDir(node_dir).ray} on {head.name}: {failed}"
    refused = [line.removeprefix("refused ") for line in lines if line.startswith("refused ")]
    return f"refusing the run's folder on {head.name}: {refused[0]}" if refused else None


async def end_on_head(fan: "Fanout", head: "Host", job: RayJob) -> str | None:
    """The run's end on the head (fleet/agent/rayend.py), before its reports are listed: the nsys
    of the workers there waited for (Ray leaves them writing as the driver exits, and
    ``ray job submit`` has returned by then), then each finished report's export and summaries
    made beside it with the nsys on the head's PATH, the one Ray ran. Why that could not be done,
    or None. Bounded: the wait and each export and summary by the agent, all by END_TIMEOUT."""
    output = launchers.ray_runtime_env(job.node_dir, "nsys", job.profiler_args)["_nsight"]["o"]
    r = await fan.run(head, agent_argv(head, {"mode": "ray-end", "output": output}), input=bundle(),
                      timeout=END_TIMEOUT)
    if r.ok:
        return None
    said = [line.removeprefix("fleet: ")[:300]
            for line in r.stderr.decode(errors="replace").splitlines()
            if line.startswith("fleet: ") and "waiting up to" not in line and " made (" not in line]
    return r.error or ("; ".join(said[:3]) if said
                       else f"the agent exited {r.exit_status} on {head.name}")


async def reports_home(fan: "Fanout", head: "Host", node_dir: str,
                       directory: Path) -> list[HostEntry]:
    """The workers' reports and whose files on the head, listed, fetched and verified."""
    lines, failed = await on_head(fan, head, LISTING, node_dir)
    if failed:
        return [HostEntry(head.name, HostStatus.FAILED,
                          missing_why=f"could not list {RunDir(node_dir).ray}: {failed}")]
    refused = [HostEntry(head.name, HostStatus.FAILED,
                         missing_why=f"not gathered: {line.removeprefix('refused ')}")
               for line in lines if line.startswith("refused ")]
    if refused and not any(file_mark(x) for x in lines):
        return refused
    # The folder as the head resolved it (~/ its user's home): the files listed are in it.
    here = next((line.removeprefix("folder ") for line in lines if line.startswith("folder ")),
                node_dir)
    return refused + await workers_home(fan, head, here, [x for x in lines if file_mark(x)],
                                        directory)


async def profile(fan: "Fanout", head: "Host", job: RayJob, req: "ProfileRequest", *,
                  store_root: Path, site: str) -> RunManifest:
    """Submit, wait, bring the head's reports home; the run's manifest in the store."""
    manifest = RunManifest.begin(req, site)
    directory = store.save(store_root, manifest)  # written first: where the run is, if fleet dies
    if refused := await folder_refused(fan, head, job.node_dir):
        manifest.hosts = [HostEntry(head.name, HostStatus.FAILED,
                                    missing_why=f"{refused}; the job was not submitted")]
        manifest.status, manifest.error = RunStatus.FAILED, refused
        store.save(store_root, manifest)
        return manifest
    status, command = await submit(job)
    not_ended = await end_on_head(fan, head, job)
    manifest.hosts = await reports_home(fan, head, job.node_dir, directory)
    for h in manifest.hosts if not_ended else ():
        h.given_up.append("the wait for the workers' nsys, and their reports' "
                          f"export and summaries: {not_ended}")
    if status != 0:
        manifest.error = (f"`ray job submit` exited {status}: the job {job.submission_id} failed "
                          f"(ray job logs --address {job.address} {job.submission_id})")
    if not manifest.hosts:
        manifest.hosts = [HostEntry(head.name, HostStatus.MISSING, missing_why=(
            f"no worker's report in {RunDir(job.node_dir).ray} on {head.name}"
            + (f" (no actor's name matched {', '.join(job.actors)})" if job.actors else "")))]
    # the driver is the workload: its failure is the run's, whatever its workers left
    if status != 0:
        manifest.hosts.append(driver_failed(f"failed (`ray job submit` exited {status})"))
    manifest.status = outcome.run_status(h.status for h in manifest.hosts)
    manifest.request = {**manifest.request, "ray": {"address": job.address,
                                                    "submission_id": job.submission_id,
                                                    "node_dir": job.node_dir,
                                                    "actors": list(job.actors), "command": command}}
    store.save(store_root, manifest)
    return manifest
