"""A rank's result file, held to what only fleet's agent writes, before gather believes it.

The job runs as the user in the run's directory, so anything in it may be the job's: a
file named like a result, a link in place of one, a frame the job printed. A result is taken
only when it is the agent's own file (a regular file, not a link, 0600, of the user, within a
size), holds exactly one answer, carries the run's nonce (made at submission, kept in the
manifest, given to each rank's agent), and sits where its own rank and node say it was
written. Anything else fails that rank alone, with a line; gather goes on.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass

from .. import safenames
from ..agentcall import cut_strings
from ..agent import wire
from ..agent.messages import ProfileResult
from ..rundir import RunDir
from ..outcome import HostStatus
from ..store.manifest import HostEntry
from .jobstate import JobMarks

RESULT_MAX = 4 << 20  # bytes: far more than any rank's result holds

# Each result file, as the login node finds it ($1 the run directory, $2 the call's nonce, $3
# RESULT_MAX): a mark line naming it, then its content; or a mark saying why it is not read.
READ = (f'me=$(id -u); for f in {RunDir("").node("*").result("*")}; do '
        'if [ -L "$f" ]; then echo "$m refused $f is a symbolic link"; continue; fi; '
        '[ -f "$f" ] || { [ ! -e "$f" ] || echo "$m refused $f is not a regular file"; continue; '
        '}; s=$(stat -c "%a %u %s" -- "$f"); '
        'case $s in "600 $me "*) ;; *) echo "$m refused $f has mode, owner and size $s (the agent '
        'writes 600, uid $me)"; continue ;; esac; '
        '[ "${s##* }" -le "$3" ] || { echo "$m refused $f is larger than $3 bytes"; continue; }; '
        'echo "$m result $f"; cat -- "$f"; echo; done; ')


def where(path: str) -> tuple[str | None, int | None]:
    """The node and rank a result file's place says (NODE/rankN.result.json); None where not."""
    node, label = RunDir.result_place(path)
    return node if safenames.is_component(node) else None, RunDir.rank_of(label)


@dataclass(frozen=True)
class RankResult:
    """A rank's result: the document its file held (``body``, kept in the manifest as written),
    read once into its types (``answer``)."""
    body: dict
    answer: ProfileResult

    @classmethod
    def of(cls, body: dict) -> "RankResult":
        return cls(body, ProfileResult.read(body))


def from_file(path: str, text: str) -> tuple[RankResult | None, str | None]:
    """The one answer in a result file, or why the file is not taken as one."""
    found = wire.answers(text, "profile")
    if len(found) != 1:
        return None, (f"{path} holds {len(found) or 'no'} answer{'s' if len(found) != 1 else ''} "
                      "of fleet's agent, not one")
    result = RankResult.of(cut_strings(found[0]))
    answer = result.answer
    node, label = RunDir.result_place(path)  # the listing's glob: always a result file's name
    if answer.slurm_node != node or answer.host != label:
        return None, (f"{path} holds the result of {str(answer.host)[:40]!r} on "
                      f"{str(answer.slurm_node)[:40]!r}, not of its own place")
    return result, None


def not_this_runs(answer: ProfileResult, nonce: str | None) -> str | None:
    """Why a result was not written by this run's agent, or None. Runs submitted before results
    carried a nonce (``nonce`` None) are read as they were."""
    if nonce is None:
        return None
    said = answer.nonce
    if said is not None and hmac.compare_digest(said.encode(), nonce.encode()):
        return None
    return "it does not carry this run's nonce: not written by this run's agent"


def refused_entry(path: str, why: str) -> HostEntry:
    """The rank a refused result file stood for, failed with the reason; nothing of it comes
    home."""
    node, rank = where(path)
    return HostEntry(node or "(malformed result)", HostStatus.FAILED, rank=rank,
                     missing_why=f"the rank's result is not taken ({why}); nothing of it was "
                                 "brought home")


def split(text: str, mark: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]],
                                         list[tuple[str, str]]]:
    """The call's answer, cut at its marks: (result files with their text, refused files with why,
    every other mark as (name, value))."""
    files: list[tuple[str, list[str]]] = []
    refused, other = [], []
    current: list[str] | None = None
    for line in text.split("\n"):  # not splitlines(): results carry a \x1e
        if not line.startswith(mark):
            if current is not None:
                current.append(line)
            continue
        name, _, value = line[len(mark):].partition(" ")
        current = None
        if name == "result":
            files.append((value, []))
            current = files[-1][1]
        elif name == "refused":
            path, _, why = value.partition(" ")
            refused.append((path, f"{path} {why}"))
        else:
            other.append((name, value.strip()))
    return [(path, "\n".join(lines)) for path, lines in files], refused, other


def this_runs(found: list[RankResult], marks: JobMarks,
              nonce: str | None) -> tuple[list[RankResult], list[HostEntry]]:
    """The results of this run's agents, and an entry for each refused: a file not the agent's
    own, or a result without the run's nonce."""
    refused = [refused_entry(path, why) for path, why in marks.refused_results]
    results = []
    for res in found:
        if (why := not_this_runs(res.answer, nonce)):
            place = RunDir(str(res.answer.slurm_node)).result(str(res.answer.host))
            refused.append(refused_entry(place, why))
        else:
            results.append(res)
    return results, refused
