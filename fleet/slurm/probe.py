"""``fleet probe|doctor --partition P``: the agent on a partition's compute nodes, as a short job.

One ``srun`` from the login node, one task per node, each running the agent fleet sends to lab
servers (its bundle on stdin, which ``--input=all`` gives every task). ``--label`` prefixes each
line with its task, so the nodes' answers are told apart; each task says its node first. srun
also cuts long lines (at 1024 bytes) into labelled pieces, so each task sends its answer in
base64, in short lines, and its exit status last. A node whose task printed no state gets an
error, as an unreachable lab server does.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import TYPE_CHECKING

from ..agent.bundle import bundle
from ..inventory import Host
from ..agentcall import agent_args, agent_argv, probed_document, read_state
from ..transport import Result
from .cluster import Cluster
from .jobs import LoginUnreachable, SlurmClient, SlurmError
from . import options

if TYPE_CHECKING:
    from ..transport import Fanout

NODE_MARK, EXIT_MARK = "@@fleet-node ", "@@fleet-exit "
TASK = ('echo "@@fleet-node $SLURMD_NODENAME"; out=$("$@"); rc=$?; printf %s "$out" | '
        'base64; echo "@@fleet-exit $rc"') 
LABELLED = re.compile(r"^\s*(\d+): ?(.*)$")
# srun: one task per node, no GPUs asked for (a probe must not wait for them to be free), given
# up when the nodes are not free within a minute; the partition's node count unless --nodes.
SRUN = ('p="$1"; n="$2"; t="$3"; shift 3; '
        '[ -n "$n" ] || n=$(sinfo -h -p "$p" -o %D | awk \'{s+=$1} END {print s+0}\'); '
        '[ "$n" -gt 0 ] || { echo "partition $p has no nodes" >&2; exit 3; }; '
        'exec srun --partition="$p" --nodes="$n" --ntasks-per-node=1 --ntasks="$n" --input=all '
        '--label --immediate=60 --time=5 --job-name=fleet-probe -- sh -c "$t" sh "$@"')


def node_results(text: str, errors: str, login: Host) -> list[tuple[Host, Result]]:
    """Each task's lines, labelled by srun, as the Result of its node."""
    out: dict[str, list[str]] = {}
    err: dict[str, list[str]] = {}
    for lines, into in ((text, out), (errors, err)):
        for line in lines.splitlines():
            m = LABELLED.match(line)
            if m:
                into.setdefault(m.group(1), []).append(m.group(2))
    found = []
    for task, lines in sorted(out.items(), key=lambda kv: int(kv[0])):
        node = (lines[0][len(NODE_MARK):].strip() if lines and lines[0].startswith(NODE_MARK)
                else f"task{task}")
        host = Host(node, dict(login.vars), (), f"a compute node of the job from {login.name}")
        body = [line for line in lines[1:] if not line.startswith(EXIT_MARK)]
        ended = [line[len(EXIT_MARK):].strip() for line in lines if line.startswith(EXIT_MARK)]
        try:
            stdout = base64.b64decode("".join(body), validate=True)
        except (binascii.Error, ValueError):
            stdout = b""
        # no status: the task was cut short
        status = int(ended[-1]) if ended and ended[-1].isdigit() else 1
        r = Result(node, exit_status=status, stdout=stdout,
                   stderr="\n".join(err.get(task, [])).encode())
        found.append((host, read_state(host, r)))
    return found


async def probe_partition(fan: "Fanout", cluster: Cluster, partition: str, nodes: int | None, *,
                          environment_check: bool) -> list[tuple[Host, Result]]:
    """Every node of the job (``nodes`` of the partition, or all of them) with its agent's state."""
    options.name(partition, "--partition")  # UnsafeValue before the cluster is reached
    client = SlurmClient(fan, cluster.login)
    args = agent_args(cluster.login, environment_check=environment_check)
    argv = agent_argv(cluster.login, args)
    r = await client._sh("srun", SRUN, partition, str(nodes or ""), TASK, *argv, input=bundle(),
                         timeout=300)
    if r.error and not r.reached:
        raise LoginUnreachable(f"{cluster.login.name} (login node) unreachable: {r.error}")
    found = node_results(r.stdout.decode(errors="replace"), r.stderr.decode(errors="replace"),
                         cluster.login)
    if not found:
        said = [line for line in r.stderr.decode(errors="replace").splitlines() if line.strip()]
        raise SlurmError(f"srun on {cluster.login.name} ran no probe on partition {partition}: "
                         + (said[-1] if said else f"exit status {r.exit_status}"))
    return found


def as_json(found: list[tuple[Host, Result]]) -> list[dict]:
    return [{"host": h.name, "error": r.error, "error_kind": r.error_kind,
             "state": probed_document(r)}
            for h, r in found]
