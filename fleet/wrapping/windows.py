"""Windows of a long job: what nsys is told so that it collects a part of a run and leaves the
workload running, and which windows cannot be asked together. Pure and Python 3.8: shipped with
the plan to a Slurm task (fleet/agent/bundle.py).

Each was seen with nsys 2025.3 on an H100 test machine (tests/fixtures/nsys-sessions-h100):

* ``--window START:DURATION``: nsys's ``--delay``, ``--duration`` and ``--kill=none``. nsys writes
  the report and exits at the window's end, the workload going on (delay-duration). The agent
  then adopts the workload (fleet.agent.window).
* ``--nvtx-window RANGE[@DOMAIN]``: nsys's NVTX capture range. Collection starts where the
  workload opens the range and stops where it closes it (``--capture-range-end=stop``: "Target
  app will continue running"). ``NSYS_NVTX_PROFILER_REGISTER_ONLY=0`` in the workload's
  environment lets a range named by a plain string (``torch.cuda.nvtx.range_push("step")``) open
  it too, not only a registered one (the recording gave it with --env-var).
* ``--cuda-profiler-window``: from the workload's ``cudaProfilerStart()`` to its
  ``cudaProfilerStop()`` (cuda-api: steps 20 to 40 of 170, the workload ran to its end).
* ``--repeat N`` with either: N windows, each its own report, ``NAME.1`` to ``NAME.N``
  (``--capture-range-end=repeat:N``; nvtx-repeat: two reports of one ``step`` range each).

Under the last three nsys stays with the workload until it ends, and exits with its status.
"""

from __future__ import annotations

import re

try:  # as shipped with the plan, modules travel under flat names
    from fleet_planparts import CapturePart
except ImportError:
    from ..planparts import CapturePart

# nsys's own options that set a window: -X may not give them beside fleet's (nsys refuses an option
# given twice, and fleet reads the outcome by the window it asked).
WINDOW_OPTIONS = ("--delay", "--duration", "--kill", "--capture-range", "--capture-range-end",
                  "--nvtx-capture")
MOST_REPEATS = 100     # windows one run may ask nsys for: each is a report of its own
# What each window option has nsys do, for the line refusing it to ncu.
NSYS_OPTIONS = {"--window": "--delay, --duration, --kill none",
                "--nvtx-window": "--capture-range=nvtx",
                "--cuda-profiler-window": "--capture-range=cudaProfilerApi"}
RANGE_MOST = 200       # characters of an NVTX range's name (with its domain) fleet passes on
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
UNESCAPED_AT = re.compile(r"(?<!\\)@")  # nsys's help: "'@' can be escaped with backslash"
# With it, ranges named by plain strings open an NVTX capture range, not registered strings alone.
# In nsys's environment, which the workload inherits: an -X --env-var of the user's beside fleet's
# would be an option given twice, which nsys refuses.
NVTX_ANY_STRING = {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}


def nvtx_range_problem(value: object) -> str | None:
    """Why ``value`` is not an NVTX range to capture, RANGE or RANGE@DOMAIN (DOMAIN ``*``: any),
    as nsys's --nvtx-capture takes it, or None."""
    if not isinstance(value, str) or not value or len(value) > RANGE_MOST:
        return ("--nvtx-window %r: an NVTX range's name, RANGE or RANGE@DOMAIN, 1 to %d "
                "characters" % (value, RANGE_MOST))
    if CONTROL.search(value) or value.startswith("-"):
        return ("--nvtx-window %r: a range's name is one line of printable text, not starting with "
                "'-'" % (value,))
    parts = UNESCAPED_AT.split(value)
    if len(parts) > 2 or not all(p.strip() for p in parts):
        return ("--nvtx-window %r: RANGE or RANGE@DOMAIN, each part not empty (escape an '@' of "
                "the name as '\\@')" % (value,))
    return None


def asked(req) -> list[str]:
    """The window options a request gives, as the user typed them."""
    return [name for name, given in (("--window", req.window), ("--nvtx-window", req.nvtx_window),
                                     ("--cuda-profiler-window", req.cuda_profiler_window)) if given]


def problem(req, given_to_nsys) -> str | None:
    """Why the request's window (or --detach, --repeat) cannot be planned as asked, or None.
    ``given_to_nsys(option)``: the values the user's -X words give nsys's option (None: no
    value)."""
    windows = asked(req)
    if req.detach and not windows:
        return ("--detach leaves a workload running after a window: give --window START:DURATION, "
                "--nvtx-window or --cuda-profiler-window too")
    if req.repeat is not None and not (req.nvtx_window or req.cuda_profiler_window):
        return ("--repeat N takes windows the workload opens: give --nvtx-window or "
                "--cuda-profiler-window too")
    if not windows:
        return None
    # The values first: a request read from a job's files may hold any type.
    return _value_problem(req) or _run_problem(req, windows) or _nsys_words_problem(req, windows[0],
                                                                                    given_to_nsys)


def _run_problem(req, windows: list[str]) -> str | None:
    """Why the run cannot take the window: another window, ncu, a --timeout, a launcher or
    container."""
    if len(windows) > 1:
        return "%s and %s each set nsys's window: give one" % (windows[0], windows[1])
    if req.tool != "nsys":
        return "%s is nsys's (%s): ncu cannot leave its workload" % (windows[0],
                                                                     NSYS_OPTIONS[windows[0]])
    if req.lab is not None and req.lab.timeout is not None:
        return "%s leaves the workload running and --timeout ends it: give one" % windows[0]
    if req.launcher is not None or req.docker_image is not None:
        return "%s is not yet for --launcher or --docker runs" % windows[0]
    return None


def _value_problem(req) -> str | None:
    """Why a window's value is not of its kind (a request from a job's files may hold anything)."""
    if req.nvtx_window is not None and (why := nvtx_range_problem(req.nvtx_window)):
        return why
    if req.repeat is not None and not (_count(req.repeat) and 1 <= req.repeat <= MOST_REPEATS):
        return "--repeat %.40r: from 1 to %d windows" % (req.repeat, MOST_REPEATS)
    if req.window is not None and not (isinstance(req.window, (tuple, list))
                                       and len(req.window) == 2
                                       and all(_count(v) for v in req.window)
                                       and req.window[1] > 0):
        return ("--window %.40r: START:DURATION in whole seconds, the duration more than "
                "0" % (req.window,))
    if not isinstance(req.cuda_profiler_window, bool):
        return "--cuda-profiler-window %.40r: on or off" % (req.cuda_profiler_window,)
    return None


def _count(value) -> bool:
    """A whole number of 0 or more, not a bool (which Python counts as one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _nsys_words_problem(req, window: str, given_to_nsys) -> str | None:
    """Why the user's -X words and the window do not go together: one sets the window too, or
    leaves out the NVTX trace an NVTX window needs."""
    if (given := [o for o in WINDOW_OPTIONS if given_to_nsys(o)]):
        return "-X %s sets nsys's window too: %s sets it" % (given[0], window)
    traced = [t for value in given_to_nsys("--trace") for t in (value or "").split(",")]
    if req.nvtx_window and traced and "nvtx" not in traced:
        return "--nvtx-window needs NVTX traced: add nvtx to -X --trace"
    return None


def nsys_flags(req) -> list[str]:
    """nsys's flags for the request's window ([] for none)."""
    if req.window:
        return ["--delay=%d" % req.window[0], "--duration=%d" % req.window[1], "--kill=none"]
    end = "repeat:%d" % req.repeat if req.repeat else "stop"
    if req.nvtx_window:
        return ["--capture-range=nvtx", "--nvtx-capture=" + req.nvtx_window, "--capture-range-end="
                + end]
    if req.cuda_profiler_window:
        return ["--capture-range=cudaProfilerApi", "--capture-range-end=" + end]
    return []


def app_env(req) -> dict:
    """What the workload's environment needs for the request's window (inherited from nsys's)."""
    return dict(NVTX_ANY_STRING) if req.nvtx_window else {}


def capture(req, output: str = "") -> CapturePart | None:
    """The plan's record of a window the workload opens (None for the rest): which one, its NVTX
    range, how many windows were asked, and with --detach the file its output goes to (``output``):
    the agent leaves once every window asked has its report. The agent says from it what was
    taken."""
    if not (req.nvtx_window or req.cuda_profiler_window):
        return None
    return CapturePart("nvtx" if req.nvtx_window else "cudaProfilerApi", req.nvtx_window,
                       req.repeat or 1, bool(req.detach), output if req.detach else "")


def opened_by(spec: CapturePart) -> str:
    """What the window is, in words: "NVTX range 'step'", or "cudaProfilerStart() to
    cudaProfilerStop()"."""
    if spec.range == "nvtx":
        return "NVTX range %r" % spec.nvtx
    return "cudaProfilerStart() to cudaProfilerStop()"
