"""fleet: profile GPU workloads with Nsight across shared servers and Slurm clusters."""

import time
import warnings

__version__ = "0.1.0"
STARTED = time.monotonic()  # about when the command started: a run's phases are counted from it


def since_started() -> float:
    """Seconds since the command started: a run's phases, what fleet adds to
    the profiler's own time."""
    return round(time.monotonic() - STARTED, 3)


# asyncssh (2.24) names DSA key classes in its type hints, and cryptography 51 warns on each such
# name: six warnings on every command that connects. fleet never offers or accepts a DSA key
# (OpenSSH removed DSA in 10.0), so they say nothing to a user; only these,
# from asyncssh, are silenced.
warnings.filterwarnings("ignore", message="DSA is deprecated", module=r"asyncssh(\.|$)")
