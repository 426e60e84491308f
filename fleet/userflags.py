"""The user's profiler flags (-X) against fleet's own: which the profiler would refuse, which take
what is fleet's, and which of fleet's flags give way to the user's choice.

Pure and Python 3.8: shipped with the agent, as :mod:`fleet.plan` (which plans with it) is. nsys's
flags are read as nsys reads its command line (:mod:`fleet.wrapping.nsysopts`); ncu's as ncu 2025.3
does, long options by a unique prefix too.
"""

from __future__ import annotations

try:  # as shipped by fleet, modules travel under flat names (fleet/agent/bundle.py)
    import fleet_policy as policy
    from fleet_wrapping_nsysopts import NSYS_SHORT, nsys_options
except ImportError:
    from . import policy
    from .wrapping.nsysopts import NSYS_SHORT, nsys_options

# The user's -X flags meet fleet's own. Output names are fleet's: it finds, hashes and brings
# home the report by them. Elsewhere the user's explicit choice wins and fleet drops its own
# flag (nsys refuses an option given twice). Spellings as nsys and ncu 2025.3 take them.
OUTPUT_OPTIONS = {"nsys": ("-o", "--output"), "ncu": ("-o", "--export")}
USER_WINS = {"nsys": ("--sample", "--cpuctxsw", "--duration", "--session-new"),
             "ncu": ("--clock-control",)}


def _names(word: str, name: str) -> bool:
    """Whether ``word`` gives ncu's option ``name``: ncu also takes a long option's unique prefix
    (``--exp`` for ``--export``, seen with 2025.3), and a short one's value attached."""
    given = word.split("=", 1)[0]
    if name.startswith("--"):
        return given == name or (given.startswith("--") and len(given) > 2
                                 and name.startswith(given))
    return word == name or (word.startswith(name) and len(word) > len(name))


def option_values(tool: str, words: tuple[str, ...],
                  spellings: tuple[str, ...]) -> list[str | None]:
    """The values the words give any of these options (None for one given without a value)."""
    if tool == "nsys":
        wanted = {NSYS_SHORT.get(s, s) for s in spellings}
        return [value for name, value, _ in nsys_options(words)[0] if name in wanted]
    found = []
    for i, w in enumerate(words):
        name = next((n for n in spellings if _names(w, n)), None)
        if name is None:
            continue
        if "=" in w and name.startswith("--"):
            found.append(w.split("=", 1)[1])
        elif not name.startswith("--") and len(w) > len(name):
            found.append(w[len(name):])
        else:
            found.append(words[i + 1] if i + 1 < len(words) else None)
    return found


def profiler_args_error(tool: str, args: tuple[str, ...]) -> str | None:
    """Why the user's profiler flags cannot be run as given, or None: nsys would refuse them, or
    they take what is fleet's."""
    if tool == "nsys" and (why := nsys_options(args)[1]):
        return why
    if option_values(tool, args, OUTPUT_OPTIONS.get(tool, ())):
        return (f"-X {' / '.join(OUTPUT_OPTIONS[tool])} is fleet's: it names each report so it can "
                "find, hash and bring it home (reports land in the store, --store; `fleet reports "
                "pull RUN DIR` copies them out)")
    if option_values(tool, args, policy.COUNTER_OPTIONS.get(tool, ())):
        return ("-X --gpu-metrics-devices would program the counters of GPUs fleet has not checked "
                "for tenants: pass --gpu-metrics, and fleet samples the GPUs the run "
                "was given once they are free")
    return None


def without_overridden(tool: str, flags: list[str], user: tuple[str, ...]) -> list[str]:
    """Fleet's flags less those the user chose a value for (a flag and its value go together)."""
    chosen = {name for name in USER_WINS.get(tool, ()) if option_values(tool, user, (name,))}
    kept, skip = [], False
    for i, f in enumerate(flags):
        if skip:
            skip = False
            continue
        name = f.split("=", 1)[0]
        if name in chosen:
            skip = "=" not in f and i + 1 < len(flags) and not flags[i + 1].startswith("-")
            continue
        kept.append(f)
    return kept
