"""Where the profiler goes in the job: the real exec point of each launcher.

Pure text. Where the launcher's options end is :mod:`fleet.wrapping.launchers`' (the lab servers'
path cuts the command there too). A runtime that starts its own workers (torchrun, mpirun, Ray) must
have the profiler put in front of each worker, not in front of itself: nsys in
front of ``torchrun`` profiles the launcher and misses the ranks. The user's
command stays a bash array (``COMMAND``) and is only ever sliced, never
re-split, so it survives whatever its quoting.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..rundir import RunDir
from ..wrapping.containers import Container, slurm_words
# Where each launcher's options end, shared with the lab servers' path; named here as before.
from ..wrapping.launchers import (LAUNCHERS, MPIRUN_TWO_VALUES, MPIRUN_VALUE,  # noqa: F401
                                  TORCHRUN_FLAGS, LauncherError, _options_start, command_problem,
                                  end_of_options, script_index, torchrun_modules, torchrun_python)
from ..safenames import check_text, quote
from ..userflags import profiler_args_error
from .states import REFUSED_EXIT

# The run folder as the batch script names it ($RUN_DIR, set by script.render): RunDir's names are
# plain words, so each path below is one word inside double quotes.
IN_SCRIPT = RunDir("$RUN_DIR")
# written into the job's run folder as RunDir.RAY_HOOK
RAY_HOOK = Path(__file__).with_name("ray_hook.py")
RAY_HOOK_END = "FLEET_RAY_HOOK_PY"
# How the batch script's own checks refuse to start anything: the refusal mark (only it makes the
# job's 127 and the last `fleet: ` line of its log a refusal: a program may end so too), then the
# status. Their reason is that last line, said just before.
REFUSE = (f'    : > "{IN_SCRIPT.job_refused}"', f'    echo {REFUSED_EXIT} > "{IN_SCRIPT.job_exit}"',
          f"    exit {REFUSED_EXIT}")
# Ray's nsight plugin runs `nsys profile` from PATH for each worker; without it Ray 2.60 fails the
# job at the first worker (RuntimeEnvSetupError: "nsight is not installed"), the program already
# started.
RAY_NEEDS_NSYS = (
    "if ! command -v nsys >/dev/null 2>&1; then",
    "    echo \"fleet: nsys is not on PATH on ${SLURMD_NODENAME:-this node}: Ray's nsight plugin "
    "runs nsys from PATH for every worker (else RuntimeEnvSetupError: nsight is not installed); "
    "nothing was started: put nsys's folder on the job's PATH\" >&2",
    *REFUSE,
    "fi")
# Ray execs each worker through `bash -c` (ray/_private/runtime_env/context.py, exec_worker). A
# batch job inherits SSH_CLIENT from the login session that submitted it (sbatch exports the
# environment); with it set, at a shell level under 2 (the batch shell's raylet's), Debian's bash
# reads ~/.bashrc even for `bash -c` (SSH_SOURCE_BASHRC), and a .bashrc that puts another Python
# first (pyenv init, conda activate, module load) wins over the workers' PATH fleet's hook sets:
# `nsys profile ... python` then runs a Python without Ray, every worker fails to import ray, Ray
# starts it again, and the program waits for its actors forever. Nobody is logged in through a batch
# job: the job forgets it.
RAY_NO_LOGIN_SHELL = "unset SSH_CLIENT SSH2_CLIENT SSH_CONNECTION SSH_TTY"



@dataclass(frozen=True)
class Launch:
    setup: tuple[str, ...]   # bash lines after COMMAND=(...)
    line: str                # the step that runs the workload
    after: tuple[str, ...] = ()  # bash lines once it ended, whatever its status (kept in $status)


def container_problem(launcher: str, container: Container | None) -> str | None:
    """Why ``launcher`` cannot start its workers in ``container``, or None. pyxis is srun's: it puts
    only srun's tasks in the image. Ray's workers are started by Ray from the batch shell."""
    if container is None:
        return None
    if launcher == "ray":
        return ("with --launcher ray, the program runs in the batch shell and Ray starts its "
                "workers itself: no container of fleet's would reach them; leave out "
                "--container-image and --apptainer")
    if launcher == "mpirun" and container.kind == "pyxis":
        return ("with --launcher mpirun, mpirun starts the ranks itself, not srun, so pyxis cannot "
                "put them in the image: use --apptainer (mpirun starts each rank in it), or "
                "--launcher srun")
    return None


def actor_patterns(text: str) -> tuple[str, ...]:
    """``--ranks`` with Ray: which actors to profile, by name (fnmatch patterns separated by commas,
    e.g. ``trainer-*,ps-0``); LauncherError for none."""
    check_text(text, "--ranks")
    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    if not patterns:
        raise LauncherError(f"--ranks {text!r}: with --launcher ray, actor name patterns, e.g. "
                            "'trainer-*'")
    return patterns


def launch(launcher: str, command: list[str], agent: list[str], run_dir: str,
           container: Container | None, *,
           tool: str = "nsys", profiler_args=(), scratch: str | None = None, actors=()) -> Launch:
    if why := container_problem(launcher, container):
        # else the workload would run outside the container it was asked into
        raise LauncherError(why)
    task = "FLEET_TASK=(" + " ".join(quote(w, "the agent's command (ansible_python_interpreter)")
                                     for w in agent) + ")"
    srun_opts, pre = _container_words(container, run_dir, scratch)
    if launcher == "srun":
        return Launch((task,), f"srun {_srun_options(srun_opts)}{pre}"
                               "\"${FLEET_TASK[@]}\" \"${COMMAND[@]}\"")
    if launcher == "mpirun":
        return _mpirun(command, task, pre)
    if launcher == "torchrun":
        return _torchrun(command, task, container, srun_opts, pre)
    if launcher == "ray":
        return _ray(run_dir, tool, profiler_args, actors)
    raise LauncherError(f"unknown launcher {launcher!r}: one of {', '.join(LAUNCHERS)}")


def _container_words(container: Container | None, run_dir: str,
                     scratch: str | None) -> tuple[list[str], str]:
    """Where the container's words go: pyxis's are srun's options (returned as words), Apptainer's a
    prefix in front of the task (returned quoted, with its trailing space)."""
    inside = slurm_words(container, run_dir, scratch)
    srun_opts = inside if container and container.kind == "pyxis" else []
    prefix = inside if container and container.kind == "apptainer" else []
    pre = " ".join(quote(w, "the container") for w in prefix)
    return srun_opts, (pre + " " if pre else "")


def _srun_options(srun_opts: list[str]) -> str:
    """srun's options for the container (pyxis), quoted, with a trailing space; empty for none."""
    opts = " ".join(quote(w, "the container") for w in srun_opts)
    return opts + " " if opts else ""


def _mpirun(command: list[str], task: str, pre: str) -> Launch:
    """mpirun runs in the batch shell and starts every rank itself, each through the agent
    (FLEET_TASK) in front of the program."""
    k = script_index(command, "mpirun")
    program = f"\"${{COMMAND[@]:{k}}}\""
    return Launch((task, f"LAUNCH=({_slices(0, k, [])} {pre}\"${{FLEET_TASK[@]}}\" {program})"),
                  "\"${LAUNCH[@]}\"")


def _torchrun(command: list[str], task: str, container: Container | None, srun_opts: list[str],
              pre: str) -> Launch:
    """One torchrun per node, started by srun; it execs each of that node's workers through the
    agent (FLEET_TASK), which runs the python torchrun would have run."""
    k = script_index(command, "torchrun")
    program = f"\"${{COMMAND[@]:{k}}}\""
    # --no-python: torchrun execs the wrapper, which runs python on the script itself, the
    # python torchrun would have run (python -m for a module: torchrun's own -m cannot go
    # with --no-python, so it moves; the interpreter's, in python -m torch.distributed.run, stays).
    # In a container, the container's python3: the node's torchrun may not be the one inside.
    modules = torchrun_modules(command, k)
    no_python = any(w in ("--no-python", "--no_python") for w in command[:k])
    python = "\"$FLEET_PYTHON\"" if not container else "python3"
    python = "" if no_python else (f"{python} -m " if modules else f"{python} ")
    # torchrun itself in the container (Apptainer's prefix, or pyxis's srun options), as the
    # image's.
    injected = (f"{pre}{_slices(0, k, modules + end_of_options(command, k))} --no-python "
                f"\"${{FLEET_TASK[@]}}\" {python}{program}")
    opts = _srun_options(srun_opts)
    # One torchrun per node; it starts that node's workers.
    setup = () if no_python or container else torchrun_python(command)
    return Launch((task, *setup, f"LAUNCH=({injected})"),
                  "srun --ntasks-per-node=1 --nodes=\"$SLURM_JOB_NUM_NODES\" "
                  f"{opts}\"${{LAUNCH[@]}}\"")


def _ray(run_dir: str, tool: str, profiler_args, actors) -> Launch:
    """The program runs in the batch shell; Ray starts its workers under nsys, by fleet's hook."""
    block = ray_runtime_env(run_dir, tool, profiler_args)
    hook = RAY_HOOK.read_text()
    if RAY_HOOK_END in hook:  # the heredoc would end early
        raise LauncherError(f"{RAY_HOOK} holds {RAY_HOOK_END}")
    # Ray starts its own workers: its runtime_env hook (fleet_ray_hook, fleet/slurm/ray_hook.py)
    # adds this _nsight block to the program's ray.init, with no change to the program, or to
    # the actors named by FLEET_RAY_ACTORS only.
    chosen = ([f"export FLEET_RAY_ACTORS={quote(json.dumps(list(actors)), '--ranks')}"] if actors
              else [])
    return Launch((f'[ -d "{IN_SCRIPT.ray}" ] || mkdir -m 0700 -- "{IN_SCRIPT.ray}"',
                   "export FLEET_RAY_RUNTIME_ENV="
                   f"{quote(json.dumps(block, sort_keys=True), 'Ray runtime_env')}",
                   *chosen,
                   *RAY_NEEDS_NSYS,
                   RAY_NO_LOGIN_SHELL,
                   f'printf \'%s\\n\' "$FLEET_RAY_RUNTIME_ENV" > "{IN_SCRIPT.ray_hook_block}"',
                   f"cat > \"{IN_SCRIPT.ray_hook}\" <<'{RAY_HOOK_END}'", *hook.splitlines(),
                   RAY_HOOK_END, "export RAY_RUNTIME_ENV_HOOK=fleet_ray_hook.runtime_env_hook",
                   f'export PYTHONPATH="{IN_SCRIPT.ray}${{PYTHONPATH:+:$PYTHONPATH}}"',
                   "# Each worker's report is worker-HOST-PID; whose it is (actor or task) is "
                   "beside it."),
                  "\"${COMMAND[@]}\"",
                  # Ray leaves its workers' nsys writing their reports as the program exits: the job
                  # waits for them (bounded), else its end loses them; then each finished report's
                  # export and summaries, as a rank's agent makes them, with the nsys Ray ran, so
                  # that stats, compare and ranks read a Ray run (fleet/agent/rayend.py).
                  # -I: the job's PYTHONPATH (the run's ray/, for the hook) is no place for the
                  # agent's imports.
                  (f'"$FLEET_PYTHON" -I "{IN_SCRIPT.agent}" '
                   + quote(json.dumps({"mode": "ray-end", "output": block["_nsight"]["o"]},
                                      sort_keys=True),
                           "the run directory"),))


def _slices(start: int, end: int, drop: list[int]) -> str:
    """COMMAND[start:end] without the words at ``drop``, as bash array slices."""
    parts, a = [], start
    for i in [*sorted(drop), end]:
        if i > a:
            parts.append(f"\"${{COMMAND[@]:{a}:{i - a}}}\"")
        a = i + 1
    return " ".join(parts)


def unsupported(launcher: str, tool: str, profiler_args=(),
                gpu_metrics: bool = False) -> str | None:
    """Why this launcher cannot run the request as fleet promises, or None. Ray starts its own
    workers under its own nsys, with no fleet agent beside them to look at the GPU first."""
    if launcher != "ray":
        return None
    if tool != "nsys" or gpu_metrics:
        return ("with --launcher ray only an nsys trace is possible: Ray's workers start without "
                "fleet's agent, so nothing checks their GPUs for tenants before counters are "
                "programmed")
    # Ray takes nsys's options without dashes and passes a one-letter key as -K VALUE, a longer
    # one as --KEY=VALUE (ray_runtime_env): checked as the words nsys then reads.
    words = [(f"-{k}", v or "true") if len(k) == 1 else (f"--{k}={v or 'true'}",)
             for k, _, v in (a.lstrip("-").partition("=") for a in profiler_args)]
    return profiler_args_error("nsys", tuple(w for pair in words for w in pair))


def ray_runtime_env(run_dir: str, tool: str, profiler_args=()) -> dict:
    """Ray's own nsys integration (``runtime_env={"_nsight": {...}}``): options without dashes."""
    if tool != "nsys":
        raise LauncherError("Ray's runtime_env integration exists for nsys only")
    # one folder, made by the script
    options: dict = {"t": "cuda,nvtx,osrt", "o": RunDir(run_dir).ray_reports}
    for arg in profiler_args:
        key, _, value = arg.lstrip("-").partition("=")
        options[key] = value or "true"
    return {"_nsight": options}
