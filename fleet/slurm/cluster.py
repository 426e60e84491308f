"""Which Slurm cluster a run goes to, from the inventory.

A cluster is described on any group of the inventory by ``slurm_login`` (the
inventory host that is its login node) and optionally ``slurm_partitions``
(those fleet may submit to). Without an inventory, this machine is the login
node. Runs live under the login host's ``report_dir`` (default
``~/fleet-reports``), which must be on a filesystem the compute nodes share.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ..inventory import Host, Inventory, TargetError

DEFAULT_REPORT_DIR = "fleet-reports"


@dataclass(frozen=True)
class Cluster:
    name: str
    login: Host
    partitions: tuple[str, ...] = ()

    @property
    def local(self) -> bool:
        return self.login.connection == "local"

    def report_root(self, home: str) -> str:
        """The absolute directory runs go under, read as the login user would (~ and
        relative: from home)."""
        rd = self.login.vars.get("report_dir") or DEFAULT_REPORT_DIR
        if rd == "~" or rd.startswith("~/"):
            rd = rd[2:]
        return posixpath.normpath(posixpath.join(home, rd))


def clusters(inventory: Inventory) -> dict[str, Cluster]:
    found: dict[str, set[str]] = {}
    for h in inventory.hosts.values():
        login = h.vars.get("slurm_login")
        if login:
            if login not in inventory.hosts:
                raise TargetError(f"slurm_login {login!r} (set for {h.name}, {h.where}) is not a "
                                  "host in the inventory: add the login node as a host")
            found.setdefault(login, set()).update(h.vars.get("slurm_partitions") or ())
    return {name: Cluster(name, inventory.hosts[name], tuple(sorted(parts)))
            for name, parts in found.items()}


def choose(inventory: Inventory, partition: str | None, name: str | None = None,
           embedded: bool = False) -> Cluster:
    """The cluster to submit to; an error that says how to choose when it is not clear."""
    if embedded:  # no inventory: this machine is the login node
        host = next(iter(inventory.hosts.values()))
        return Cluster("local", host)
    known = clusters(inventory)
    if not known:
        raise TargetError("no Slurm cluster in the inventory: set slurm_login (the login node's "
                          "host name) on the group of the cluster")
    if name is not None:
        known = _named(inventory, known, name)
    if partition is not None and len(known) > 1:
        known = {k: c for k, c in known.items() if not c.partitions
                 or partition in c.partitions} or known
    if len(known) > 1:
        raise TargetError("several Slurm clusters could take this job "
                          f"({', '.join(sorted(known))}): choose one with --cluster")
    cluster = next(iter(known.values()))
    _check_partition(cluster, partition)
    return cluster


def _named(inventory: Inventory, known: dict[str, Cluster], name: str) -> dict[str, Cluster]:
    """The clusters ``name`` names: the one of that login host, or those of that inventory group."""
    chosen = {k: c for k, c in known.items() if k == name or name in inventory.groups and
              k in inventory.groups[name]}
    if not chosen:
        raise TargetError(f"no Slurm cluster named {name!r}; known: {', '.join(sorted(known))}")
    return chosen


def _check_partition(cluster: Cluster, partition: str | None) -> None:
    """A partition asked for must be among the cluster's slurm_partitions, where it lists any."""
    if partition is not None and cluster.partitions and partition not in cluster.partitions:
        raise TargetError(f"partition {partition!r} is not among those fleet may use on "
                          f"{cluster.name}: {', '.join(cluster.partitions)} "
                          "(slurm_partitions in the inventory)")
