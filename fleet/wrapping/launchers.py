"""Where a launcher's own arguments end and the worker's program begins, on both paths.

Pure text, the controller's. A runtime that starts its own workers (torchrun, mpirun, Ray) must
have the profiler put in front of each worker, not in front of itself: nsys in front of
``torchrun`` profiles the launcher and misses the ranks. The Slurm batch script
(:mod:`fleet.slurm.launchers`) and a lab server's plan (:func:`fleet.plan.plan`, from
:func:`fleet.lab.profile.with_launcher`) both cut the user's command where :func:`script_index`
says, and nowhere else.

On a lab server the host's one agent runs ``mpirun OPTS nsys profile -o
HOST/rank%q{OMPI_COMM_WORLD_RANK} ... -- PROGRAM`` (torchrun: ``torchrun OPTS --no-python nsys ...
-- PYTHON SCRIPT``, :func:`lab_launch`): the launcher starts one nsys per rank, as Nsight Systems'
guide runs MPI, and nsys names each rank's report in that rank's own process, from the variable
the launcher gave it (``RunDir.rank_report``). One agent per host, not one per rank as in
a Slurm job (fleet/agent/task.py), because on a lab server there is no job to tell the ranks from
tenants: ranks planning each on their own would count the others as neighbours, and the host's
GPU locks, owned state, last-moment check and watch are then held once for all of its ranks. For
the same reason a lab launcher takes no counters (ncu, --gpu-metrics): a profiler per rank would
program one GPU's counters several times over.
"""

from __future__ import annotations

import os
import re
import shlex

from .. import safenames
from . import nsysopts
from .containers import ContainerError
from ..plan import MAX_RANKS

LAUNCHERS = ("srun", "torchrun", "mpirun", "ray")
# torchrun's options that take no value (as its --help lists them: tests/fixtures/launchers-h200/
# torchrun-help.txt, which tests/test_launchers_torchrun.py holds this to); every other takes one.
TORCHRUN_FLAGS = {"--standalone", "--no-python", "--no_python", "-m", "--module", "--run-path",
                  "--run_path", "--virtual-local-rank", "--virtual_local_rank"}
# mpirun's options that take one value, and those that take two. Open MPI 4.1's, as its own
# `mpirun --help all` lists them (tests/fixtures/openmpi-4.1/help-all.txt, which
# tests/test_launchers_mpirun.py holds these to), then MPICH/Hydra's (mpiexec.hydra's -help).
OPENMPI_VALUE = {
    "--app", "--bind-to", "--cartofile", "--cpu-list", "--cpu-set", "--cpus-per-proc",
    "--cpus-per-rank", "--debugger", "--default-hostfile", "--hnp", "--host", "--hostfile",
    "--launch-agent", "--machinefile", "--map-by", "--max-restarts", "--max-vm-size", "--n", "--np",
    "--npernode", "--npersocket", "--ompi-server", "--output-filename", "--path", "--personality",
    "--ppr", "--prefix", "--preload-files", "--rank-by", "--rankfile", "--report-events",
    "--report-pid", "--report-uri", "--stdin", "--timeout", "--wd", "--wdir", "--xml-file",
    "--xterm", "-H", "-N", "-am", "-c", "-cf", "-cpu-list", "-cpu-set", "-cpus-per-proc",
    "-cpus-per-rank", "-debugger", "-default-hostfile", "-hnp", "-host", "-hostfile",
    "-launch-agent", "-machinefile", "-max-restarts", "-max-vm-size", "-n", "-np", "-npernode",
    "-npersocket", "-ompi-server", "-output-filename", "-path", "-personality", "-report-events",
    "-report-pid", "-report-uri", "-rf", "-stdin", "-timeout", "-tune", "-wd", "-wdir", "-x",
    "-xml-file", "-xterm"}
OPENMPI_TWO_VALUES = {"--gmca", "--mca", "-gmca", "-mca"}
HYDRA_VALUE = {"-ppn", "-map-by", "-bind-to", "-rank-by", "-hosts", "-f", "-launcher", "-bootstrap",
               "-iface", "-genvlist", "-envlist", "-configfile"}
HYDRA_TWO_VALUES = {"-genv", "-env"}
MPIRUN_VALUE = OPENMPI_VALUE | HYDRA_VALUE
MPIRUN_TWO_VALUES = OPENMPI_TWO_VALUES | HYDRA_TWO_VALUES


class LauncherError(ContainerError):
    """The command does not look like the launcher it was said to be."""


def script_index(command: list[str], launcher: str) -> int:
    """Where the launcher's own arguments end and the worker's program begins."""
    i = _options_start(command, launcher)
    while i < len(command):
        word = command[i]
        if word == "--":
            return i + 1
        if not word.startswith("-") or word == "-":
            return i
        i += _width(word, launcher)
    raise LauncherError(f"with --launcher {launcher} the command is {launcher}, its options, then "
                        f"the program: no program found after the {launcher} "
                        f"options in {shlex.join(command)}")


def _width(word: str, launcher: str) -> int:
    """How many words the launcher's option ``word`` takes, itself and its values."""
    if "=" in word or (launcher == "torchrun" and word in TORCHRUN_FLAGS):
        return 1
    if launcher == "mpirun":
        return 3 if word in MPIRUN_TWO_VALUES else 2 if word in MPIRUN_VALUE else 1
    return 2


def launcher_options(command: list[str], launcher: str) -> list[tuple[str, tuple[str, ...]]]:
    """The launcher's own options, each (the option's word, its values), as :func:`script_index`
    reads them."""
    i, end, found = _options_start(command, launcher), script_index(command, launcher), []
    while i < end and command[i] != "--":
        width = _width(command[i], launcher)
        found.append((command[i], tuple(command[i + 1:i + width])))
        i += width
    return found


def _options_start(command: list[str], launcher: str) -> int:
    """Where the launcher's own options begin: after ``python -m torch.distributed.run``, else after
    argv[0]."""
    if launcher == "torchrun" and len(command) > 2 and command[1] == "-m" and os.path.basename(
            command[0]).startswith("python"):
        return 3
    return 1


# What a launcher's command may start with (the program's own name, any folder): Open MPI's and
# MPICH's names as Debian installs them; torchrun, or `python -m torch.distributed.run`. Another
# program would take the profiler's words for its own (`--launcher mpirun -- torchrun ...`).
LAUNCHER_NAMES = {"mpirun": ("mpirun", "mpiexec", "orterun", "mpirun.openmpi", "mpiexec.openmpi",
                             "mpiexec.hydra", "mpirun.mpich", "mpiexec.mpich"),
                  "torchrun": ("torchrun",)}
# mpirun's options that start ranks on other hosts: on a lab server fleet probes, locks, watches
# and gathers from the one host it was given, never from hosts mpirun would reach by itself.
MPIRUN_OTHER_HOSTS = ("--host", "-host", "-H", "--hostfile", "-hostfile", "--machinefile",
                      "-machinefile",
                      "--default-hostfile", "-default-hostfile", "-hosts", "-f", "--rankfile",
                      "-rf")
# The same through an MCA parameter (``--mca NAME VALUE``; Open MPI's orte_default_hostfile,
# orte_default_dash_host, rmaps_rank_file_path, PRRTE's prte_default_hostfile...): any whose name
# speaks of hosts, host files, rank files or machine files.
MCA_FLAGS = ("--mca", "-mca", "--gmca", "-gmca", "--prtemca", "-prtemca")
MCA_OTHER_HOSTS = re.compile(r"host|rank_?file|machine_?file|param_files", re.IGNORECASE)
# Files of mpirun's own options or MCA parameters (Open MPI's --tune, -am and --app; MPICH's
# -configfile), read by mpirun on the node: any of them may name hosts, and fleet cannot see inside.
MPIRUN_OPTION_FILES = ("--tune", "-tune", "-am", "--am", "--app", "-app", "-configfile",
                       "--configfile")


def mpirun_other_hosts(options) -> str | None:
    """The first of mpirun's ``options`` (those before the program) that would start ranks on
    other hosts, as it reads (``--mca orte_default_hostfile``), or None."""
    for i, word in enumerate(options):
        if word.split("=", 1)[0] in MPIRUN_OTHER_HOSTS:
            return word
        if word.split("=", 1)[0] in MPIRUN_OPTION_FILES:
            return f"{word}, a file of options that may name hosts,"
        if word in MCA_FLAGS and i + 1 < len(options) and MCA_OTHER_HOSTS.search(options[i + 1]):
            return f"{word} {options[i + 1]}"
    return None


def command_problem(launcher: str, command) -> str | None:
    """Why ``command`` cannot be started by ``launcher`` (not that launcher, or no program after
    its options), or None."""
    if launcher in ("torchrun", "mpirun"):
        try:
            k = script_index(list(command), launcher)
        except LauncherError as e:
            return str(e)
        name = os.path.basename(command[0])
        if name not in LAUNCHER_NAMES[launcher] and not (launcher == "torchrun"
                                                         and _python_m(command)
                                                         and command[2] == "torch.distributed.run"):
            return (f"with --launcher {launcher} the command starts with {launcher} itself "
                    f"({', '.join(LAUNCHER_NAMES[launcher])}), not {shlex.quote(name)}: "
                    f"fleet puts the profiler between {launcher}'s options and the program")
        if launcher == "torchrun" and any(w in ("--run-path", "--run_path") for w in command[:k]):
            # torchrun's help: it runs the script with runpy in its own worker Python, and that
            # "takes precedence over --no-python", by which fleet puts its agent in front of each
            # worker.
            return ("with --launcher torchrun, --run-path runs the script inside torchrun's own "
                    "worker Python, where fleet cannot put the profiler in "
                    "front of it: leave --run-path out")
    return None


def torchrun_python(command: list[str]) -> tuple[str, ...]:
    """Bash setting FLEET_PYTHON to the interpreter torchrun runs a script with: PYTHON_EXEC, else
    its own (torch/distributed/run.py: sys.executable), which is the python of `python -m
    torch.distributed.run`, or the one on the `torchrun` entry point's #! line (the H200's
    workers ran /opt/torch/.venv/bin/python, not PATH's python3:
    tests/fixtures/launchers-h200/torchrun-workers/); python3 where that cannot be read."""
    if _python_m(command):
        return ('FLEET_PYTHON=${PYTHON_EXEC:-${COMMAND[0]}}',)
    return ('FLEET_PYTHON=${PYTHON_EXEC:-python3}',
            'if [ -z "${PYTHON_EXEC:-}" ] && FLEET_LAUNCHER=$(command -v -- "${COMMAND[0]}") && '
            '[ -f "$FLEET_LAUNCHER" ] && IFS= read -r FLEET_SHEBANG < "$FLEET_LAUNCHER" && '
            '[[ $FLEET_SHEBANG == "#!"* ]]; then',
            '    read -r -a FLEET_SHEBANG <<< "${FLEET_SHEBANG:2}"',
            '    case "${FLEET_SHEBANG[0]##*/}" in',
            '        python*) FLEET_PYTHON=${FLEET_SHEBANG[0]} ;;',
            '        env) [[ "${FLEET_SHEBANG[1]:-}" == python* ]] && '
            'FLEET_PYTHON=${FLEET_SHEBANG[1]} ;;',
            '    esac',
            'fi')


def _python_m(command: list[str]) -> bool:
    """torchrun started as ``python -m torch.distributed.run``: python's -m is not torchrun's."""
    return (len(command) > 2 and command[1] == "-m"
            and os.path.basename(command[0]).startswith("python"))


def end_of_options(command: list[str], k: int) -> list[int]:
    """Where a ``--`` ends torchrun's options (before ``k``, the script): fleet's --no-python and
    the profiler come after those options, so the ``--`` goes (the profiler's path is no option)."""
    return [k - 1] if k > 0 and command[k - 1] == "--" else []


def torchrun_modules(command: list[str], k: int) -> list[int]:
    """Where torchrun's own -m/--module stand among its options (``k``: where they end)."""
    return [i for i in range(_options_start(command, "torchrun"), k) if command[i] in ("-m",
                                                                                       "--module")]


# What stands for the worker's Python in a lab server's torchrun plan, until the node says which it
# is.
PYTHON_WORD = "PYTHON"


def lab_launch(launcher: str, command: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the words that start one profiler per rank on a lab server, what follows the profiler's
    ``--``): ``mpirun OPTS`` and the program; for torchrun, as the batch script does it, its
    options (less its -m) and ``--no-python``, then the Python torchrun would run the script with
    (-m module) and the script. That Python is the node's: a bash line of :func:`torchrun_python`
    finds it there and puts it for PYTHON_WORD, the word that many from the end, then execs."""
    k = script_index(command, launcher)
    if launcher != "torchrun":
        return tuple(command[:k]), tuple(command[k:])
    modules = torchrun_modules(command, k)
    dropped = modules + end_of_options(command, k)
    words = tuple(w for i, w in enumerate(command[:k]) if i not in dropped)
    if any(w in ("--no-python", "--no_python") for w in words):  # the program is run as it is given
        return words, tuple(command[k:])
    program = (PYTHON_WORD, *(["-m"] if modules else []), *command[k:])
    script = "\n".join(('n=$1; shift; COMMAND=("$@")', *torchrun_python(command),
                        'COMMAND[${#COMMAND[@]}-n]=$FLEET_PYTHON', 'exec "${COMMAND[@]}"'))
    return ("bash", "-c", script, "fleet-torchrun", str(len(program)), *words,
            "--no-python"), program


# The options that say how many ranks mpirun starts: Open MPI 4.1's, as its `mpirun --help all`
# lists them (tests/fixtures/openmpi-4.1/help-all.txt: "-c|-np|--np", "-n|--n"), the last one given
# winning, and "--np=N" refused, as that mpirun did (tests/fixtures/openmpi-4.1/np-spellings.json);
# MPICH's
# -n and -np are among them. torchrun's: its --help's
# (tests/fixtures/launchers-h200/torchrun-help.txt).
MPIRUN_NP = ("-c", "-n", "--n", "-np", "--np")
TORCHRUN_NPROC = ("--nproc-per-node", "--nproc_per_node")
TORCHRUN_NNODES = "--nnodes"


def rank_count(launcher: str, command: list[str],
               profiler_args: tuple[str, ...] = ()) -> tuple[int | None, str]:
    """(how many ranks the launcher's command line says it starts on the host, whence that is read),
    or (None, why it cannot be told from the command line alone, or why a rank may rightly leave no
    report: nsys's --capture-range, which a rank may never open); LauncherError for a count that is
    no whole number. The host's agent calls each rank 0..N-1 that left no report missing; where the
    count is not known, no rank is."""
    if any(name == "--capture-range"
           for name, _, _ in nsysopts.nsys_options(tuple(profiler_args))[0]):
        return None, "nsys's --capture-range: a rank that never opens the range leaves no report"
    options = launcher_options(list(command), launcher)
    if launcher == "mpirun":
        return _mpirun_count(options)
    return _torchrun_count(options)


def _mpirun_count(options: list[tuple[str, tuple[str, ...]]]) -> tuple[int | None, str]:
    """:func:`rank_count` for mpirun's ``options``: its last -np (or -n, -c), unless an appfile
    says how many."""
    if any(word == "--app" for word, _ in options):
        return None, "mpirun's --app: its appfile says how many ranks"
    given = [(word, values[0]) for word, values in options if word in MPIRUN_NP and values]
    if not given:
        return None, "mpirun's command line gives no -np: it starts one rank per slot"
    word, value = given[-1]  # the last one given wins, as Open MPI 4.1's mpirun takes it
    return _counted(f"mpirun's {word}", value, "it starts one rank per slot")


def _torchrun_count(options: list[tuple[str, tuple[str, ...]]]) -> tuple[int | None, str]:
    """:func:`rank_count` for torchrun's ``options``: its last --nproc-per-node, on one node
    only."""
    valued = [_torchrun_value(word, values) for word, values in options]
    abbreviated = _abbreviated_counts(valued)
    if abbreviated:  # argparse takes a long option's prefix for it
        return None, f"torchrun's {abbreviated[0]} may stand for one of its counts: give it in full"
    nnodes = [v for w, v in valued if w == TORCHRUN_NNODES]
    if nnodes and nnodes[-1] not in ("1", "1:1"):
        return None, f"torchrun's --nnodes {nnodes[-1]}: other nodes' workers share the ranks"
    nproc = [(w, v) for w, v in valued if w in TORCHRUN_NPROC]
    if not nproc:
        return None, "torchrun's command line gives no --nproc-per-node"
    word, value = nproc[-1]
    if value in ("auto", "cpu", "gpu", "xpu"):  # torchrun counts those itself, on the node
        return None, f"torchrun's {word} {value}: torchrun counts them on the node"
    return _counted(f"torchrun's {word}", value, "")


def _abbreviated_counts(valued: list[tuple[str, str]]) -> list[str]:
    """torchrun's options among ``valued`` that are no count itself but the start of one's name
    (``--nproc``), which argparse would take for it."""
    counts = (*TORCHRUN_NPROC, TORCHRUN_NNODES)
    return [w for w, _ in valued if w not in counts and len(w) > 2 and any(
        name.startswith(w) for name in counts)]


def _torchrun_value(word: str, values: tuple[str, ...]) -> tuple[str, str]:
    """(one of torchrun's options, its value), given as ``--name=VALUE`` or ``--name VALUE``
    ("" where it has none)."""
    if "=" in word:
        name, value = word.split("=", 1)
        return name, value
    return word, values[0] if values else ""


def _counted(said: str, value: str, zero: str) -> tuple[int | None, str]:
    """(the count ``value`` gives, ``said`` VALUE), None for mpirun's 0 (``zero``), else
    LauncherError."""
    if zero and value.isascii() and value.isdigit() and int(value) == 0:
        return None, f"{said} {value}: {zero}"
    # the launcher's to start (--oversubscribe)
    if value.isascii() and value.isdigit() and int(value) > MAX_RANKS:
        return None, f"{said} {value}: more than the {MAX_RANKS} ranks fleet counts on one host"
    if (problem := safenames.count_problem(value, said, MAX_RANKS)):
        raise LauncherError(f"{problem} (fleet expects one report per rank)")
    return int(value), f"{said} {value}"
