"""What ``nsys profile`` takes on its command line, as nsys 2025.3 reads it: its switches, their
short spellings, and the rules by which it refuses a command before running anything.

Pure and Python 3.8: shipped with the agent, as :mod:`fleet.userflags` (which checks the user's
-X flags with it) is.
"""

from __future__ import annotations

# `nsys profile`'s switches in 2025.3, as the Nsight Systems user guide ("CLI Profile Command Switch
# Options") and `nsys profile --help` list them. Each takes a value (--help's is optional); nsys
# reads a long one's prefix shared with no other switch as that one (--out: --output), and refuses
# an ambiguous prefix (--dur: --duration, --duration-frames), an unknown switch, and one given twice
# in any spelling, except the four its help says may be given more than once.
NSYS_SWITCHES = tuple("--" + name for name in """
    backtrace capture-range capture-range-end command-file cpu-core-events cpuctxsw cuda-event-trace
    cuda-flush-interval cuda-graph-trace cuda-memory-usage cuda-trace-all-apis
    cuda-um-cpu-page-faults cuda-um-gpu-page-faults cudabacktrace dask debug-symbols delay duration
    duration-frames enable env-var event-sample event-sampling-frequency event-sampling-interval
    export flush-on-cudaprofilerstop force-overwrite ftrace ftrace-keep-user-config
    gpu-metrics-devices gpu-metrics-frequency gpu-metrics-set gpu-video-device gpuctxsw help
    hotkey-capture ib-net-info-devices ib-net-info-files ib-net-info-output
    ib-switch-congestion-device ib-switch-congestion-nic-device ib-switch-congestion-percent
    ib-switch-congestion-threshold-high ib-switch-metrics-device ib-switch-metrics-nic-device
    inherit-environment kill mpi-impl nic-metrics nvtx-capture nvtx-domain-exclude
    nvtx-domain-include opengl-gpu-workload os-events osrt-backtrace-stack-size
    osrt-backtrace-threshold osrt-file-access osrt-threshold output python-backtrace
    python-functions-trace python-sampling python-sampling-frequency pytorch resolve-symbols run-as
    sample samples-per-backtrace sampling-period session-new show-output start-frame-index
    start-later stats stop-on-exit storage-metrics syscall trace trace-fork-before-exec
    vulkan-gpu-workload wait""".split())
NSYS_SHORT = {"-b": "--backtrace", "-c": "--capture-range", "-d": "--duration", "-e": "--env-var",
              "-f": "--force-overwrite", "-h": "--help", "-n": "--inherit-environment",
              "-o": "--output",
              "-p": "--nvtx-capture", "-s": "--sample", "-t": "--trace", "-w": "--show-output",
              "-x": "--stop-on-exit", "-Y": "--start-later", "-y": "--delay"}
NSYS_REPEATABLE = ("--enable", "--export", "--ib-switch-congestion-device",
                   "--ib-switch-metrics-device")
NSYS_VALUE_OPTIONAL = ("--help",)
NO_SUCH_SWITCH = "it has no such option (`nsys profile --help` lists them)"


def _nsys_switch(word: str) -> tuple[str | None, str | None]:
    """(the switch ``word`` names, or None; why nsys refuses the word, or None)."""
    if not word.startswith("--"):
        return NSYS_SHORT.get(word[:2]), None if word[:2] in NSYS_SHORT else NO_SUCH_SWITCH
    given = word.split("=", 1)[0]
    matches = (given,) if given in NSYS_SWITCHES else tuple(s for s in NSYS_SWITCHES
                                                            if s.startswith(given))
    if len(matches) == 1:
        return matches[0], None
    if not matches:
        return None, NO_SUCH_SWITCH
    return None, f"ambiguous, it matches {', '.join(matches[:-1])} and {matches[-1]}"


def nsys_options(words: tuple[str, ...]) -> tuple[list[tuple[str, str | None, str]], str | None]:
    """The switches ``words`` give nsys profile, each (its long name, its value or None, the words
    that gave it), and why nsys 2025.3 refuses them before running anything, or None."""
    found: list[tuple[str, str | None, str]] = []
    i = 0
    while i < len(words):
        word, i = words[i], i + 1
        if word == "--":
            break
        if not word.startswith("-") or word == "-":
            continue
        name, why = _nsys_switch(word)
        if name is None:
            return found, f"nsys 2025.3 refuses {word}: {why}"
        attached = _attached(word)
        if attached is None and name not in NSYS_VALUE_OPTIONAL:
            if i == len(words):
                return (found,
                        f"nsys 2025.3 refuses {word} without its value: give one (-X {word} -X "
                        "VALUE)")
            attached, word, i = words[i], f"{word} {words[i]}", i + 1
        found.append((name, attached, word))
    return found, _given_twice(found)


def _attached(word: str) -> str | None:
    """The value a switch's own word carries (``--output=x``, ``-ox``), or None: then the next
    word is its value."""
    if word.startswith("--"):
        return word.partition("=")[2] if "=" in word else None
    return word[2:] if len(word) > 2 else None


def _given_twice(found: list[tuple[str, str | None, str]]) -> str | None:
    """Why nsys refuses the first switch of ``found`` given again (in any spelling) that may be
    given only once, or None."""
    seen: dict[str, str] = {}
    for name, _, word in found:
        if name in seen and name not in NSYS_REPEATABLE:
            return f"nsys 2025.3 refuses {name} given twice ({seen[name]}, {word}): give it once"
        seen.setdefault(name, word)
    return None
