"""A run's manifest, typed: what ``manifest.json`` holds, for lab servers and Slurm alike.

One shape on every path: each lab host, Slurm rank, Ray worker and rank that left
nothing is a :class:`HostEntry` with the same keys, its node facts built by one
function (:meth:`HostEntry.from_facts`) from the keys of ``agent.wire.facts``.

``schema`` is written into every manifest. Version 1 is what fleet wrote before
it had one (no ``schema`` key, and keys an entry did not use left out): it is
read with defaults for what is missing. A newer version is refused, not guessed at.
"""

from __future__ import annotations

import fnmatch
import getpass
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from ..agent.messages import ProfileResult
from ..policy.nodefacts import NodeFacts
from .. import __version__
from ..statuses import HostStatus, RunStatus
from .records import (Asked, ManifestError, PlaybookRun, ProcessSeen, Record, ReportEntry,
                      known_fields)

if TYPE_CHECKING:
    from ..plan import Plan, ProfileRequest

SCHEMA_VERSION = 2


# the ``summary`` of a Ray worker's whose file (fleet/slurm/raygather.py): no report of its own
WHOSE = "whose"


@dataclass
class HostEntry(Record):
    """One lab host, Slurm rank, Ray worker, or a rank that left no result."""
    host: str                             # inventory name, Slurm node, or "(no result)"
    status: str = HostStatus.PENDING      # a HostStatus (fleet/statuses.py)
    # Slurm: the rank; a lab launcher's rank that left no report; else None
    rank: int | None = None
    worker: str | None = None             # Ray: the worker's report name
    node: str | None = None               # the node's own hostname
    missing_why: str | None = None
    gpu: str | None = None
    driver: str | None = None
    tool_version: str | None = None
    tenants_seen: list[str] = field(default_factory=list)
    processes_seen: list[ProcessSeen] = field(default_factory=list)
    given_up: list[str] = field(default_factory=list)
    plan: dict | None = None              # the plan fleet made for a lab host (Plan.to_json)
    result: dict | None = None            # the agent's result document
    reports: list[ReportEntry] = field(default_factory=list)

    @classmethod
    def from_facts(cls, host: str, status: str, facts: NodeFacts | None, *, rank: int | None = None,
                   missing_why: str | None = None, tenants_seen: Iterable[str] = (),
                   given_up: Iterable[str] = (),
                   plan: dict | None = None, result: dict | None = None,
                   answer: ProfileResult | None = None,
                   reports: Iterable[ReportEntry] = ()) -> "HostEntry":
        """The entry of a host or rank whose node was looked at: fleet makes its ``facts`` from the
        probed state on lab servers (``NodeState.facts``); on Slurm the rank's result carries
        them. ``answer``: ``result`` as it was already read into its types, kept as its
        :attr:`answer`."""
        facts = facts or NodeFacts()
        entry = cls(host=host, status=status, rank=rank, node=facts.node,
                    missing_why=None if status == "ok" else missing_why, gpu=facts.gpu,
                    driver=facts.driver, tool_version=facts.tool_version,
                    tenants_seen=list(tenants_seen), given_up=list(given_up),
                    processes_seen=[ProcessSeen.from_json(p) for p in facts.processes_seen],
                    plan=plan, result=result, reports=list(reports))
        if answer is not None and isinstance(result, dict):
            entry._read_once("_answer", result, lambda _: answer)  # read already: kept as read
        return entry

    def _read_once(self, name: str, doc: Any, read) -> Any:
        """``read(doc)``, kept as ``name`` for as long as the entry holds that same document (not a
        field: neither kept in the manifest nor compared)."""
        kept = self.__dict__.get(name)
        if kept is None or kept[0] is not doc:
            kept = self.__dict__[name] = (doc, read(doc))
        return kept[1]

    @property
    def answer(self) -> ProfileResult | None:
        """The agent's result read into its types (fleet.agent.messages); None where it left none.
        Read once for the document ``result`` holds: a run's lines ask for it several times a host,
        and a result of many GPUs holds thousands of the watch's samples."""
        if not isinstance(self.result, dict):
            return None
        return self._read_once("_answer", self.result, ProfileResult.read)

    @property
    def planned(self) -> "Plan | None":
        """The host's plan read into its type (fleet.plan.Plan), once for the document ``plan``
        holds; None where it has none (a Slurm rank) or the store's copy is not one."""
        if not isinstance(self.plan, dict):
            return None
        return self._read_once("_planned", self.plan, self._plan_of)

    def _plan_of(self, doc: dict) -> "Plan | None":
        from ..plan import Plan

        try:
            # host and status as an entry's plan always had them, should a partial one lack them
            return Plan.from_json({"host": self.host, "status": "", **doc})
        except (TypeError, ValueError, AttributeError):
            return None  # not what fleet writes: no plan to read

    def actor_matches(self, which: str) -> bool:
        """Whether ``which`` names this Ray worker by its actor: its name, its class, or both
        (``trainer-0``, ``Trainer``, ``Trainer trainer-0``), or a glob of one (``trainer-*``)."""
        if self.worker is None or self.rank is not None or " on " not in self.worker:
            return False
        words = self.worker.split(" on ", 1)[0].split()
        return any(fnmatch.fnmatchcase(word, which) for word in words + [" ".join(words)])

    @classmethod
    def from_json(cls, doc: dict) -> "HostEntry":
        known = known_fields(cls, doc, "a host entry")
        known.setdefault("host", "?")
        for key in ("tenants_seen", "given_up", "processes_seen", "reports"):
            # version 1 wrote null or nothing where there were none
            known[key] = known.get(key) or []
        known["processes_seen"] = [ProcessSeen.from_json(p) for p in known["processes_seen"]]
        known["reports"] = [ReportEntry.from_json(r) for r in known["reports"]]
        return cls(**known)


@dataclass
class SlurmInfo(Record):
    """The batch job of a Slurm run."""
    # the inventory's name for it (the login host; --cluster takes it)
    cluster: str = ""
    # Slurm's ClusterName: the store folder the run is filed under
    cluster_name: str | None = None
    login: str = ""
    version: str | None = None            # Slurm's, as the login node said
    run_dir: str = ""                     # the run's directory on the cluster
    job_id: str | None = None
    state: str | None = None              # SUBMITTING, NOT SUBMITTED, then Slurm's state names
    spec: dict = field(default_factory=dict)   # the JobSpec
    script: str = ""                      # the batch script as submitted
    exit_code: str | None = None
    nodes: str | None = None
    reason: str | None = None
    job_exit: int | None = None           # the batch script's own exit status
    stopped_before_time_limit: bool = False
    log: ReportEntry | None = None        # slurm-JOBID.out, brought home
    # the agent's Python on the compute nodes, and where fleet found it
    python: str | None = None
    # what the job's end state meant for the run (fleet.slurm.states)
    end: str | None = None
    requeues: int = 0                     # times Slurm requeued the job while fleet watched it
    result_nonce: str | None = None       # every rank's result carries it (fleet/slurm/results.py)

    @classmethod
    def from_json(cls, doc: dict) -> "SlurmInfo":
        known = known_fields(cls, doc, "the slurm section")
        known["spec"] = known.get("spec") or {}
        if known.get("log") is not None:
            known["log"] = ReportEntry.from_json(known["log"])
        return cls(**known)


@dataclass
class RunManifest:
    """Everything needed to trust and compare a run later."""
    run_id: str
    site: str = ""
    day: str = ""
    started: str = ""
    user: str = ""
    request: dict = field(default_factory=dict)   # the ProfileRequest
    status: str = RunStatus.RUNNING   # a RunStatus (fleet/statuses.py); read back as the word it is
    hosts: list[HostEntry] = field(default_factory=list)
    slurm: SlurmInfo | None = None
    playbook: dict | None = None  # nightly: name, path, metrics, thresholds
    error: str | None = None
    # the version of fleet that made the run (nightly: part of its environment)
    fleet: str | None = None
    # the controller's moments of a lab run, seconds since the command started
    phases: dict | None = None
    schema: int = SCHEMA_VERSION  # the version it was read from; to_json writes the current one

    @classmethod
    def begin(cls, req: "ProfileRequest", site: str,
              status: str = RunStatus.RUNNING) -> "RunManifest":
        """What every run's manifest begins with, on lab servers and on Slurm."""
        return cls(run_id=req.run_id, site=site,
                   day=f"{req.run_id[0:4]}-{req.run_id[4:6]}-{req.run_id[6:8]}",
                   started=time.strftime("%Y-%m-%dT%H:%M:%S%z"), user=getpass.getuser(),
                   request=req.to_json(), status=status, fleet=__version__)

    @property
    def asked(self) -> Asked:
        """What the run asked for, read from the request it keeps."""
        return Asked.read(self.request)

    @property
    def playbook_run(self) -> PlaybookRun:
        """What a playbook's run kept (nothing for another run), read from ``playbook``."""
        return PlaybookRun.read(self.playbook)

    def to_json(self) -> dict:
        doc: dict[str, Any] = {"schema": SCHEMA_VERSION, "run_id": self.run_id, "site": self.site,
                               "day": self.day,
                               "started": self.started, "user": self.user, "request": self.request,
                               "status": self.status, "hosts": [h.to_json() for h in self.hosts]}
        # Sections only some runs have are left out otherwise: "slurm" in a manifest says a Slurm
        # run.
        if self.slurm is not None:
            doc["slurm"] = self.slurm.to_json()
        if self.playbook is not None:
            doc["playbook"] = self.playbook
        if self.error is not None:
            doc["error"] = self.error
        if self.fleet is not None:
            doc["fleet"] = self.fleet
        if self.phases is not None:
            doc["phases"] = self.phases
        return doc

    @classmethod
    def from_json(cls, doc: dict) -> "RunManifest":
        known = known_fields(cls, doc, "a run manifest")
        schema = known.get("schema", 1)  # version 1 had no schema key
        if not isinstance(schema, int) or isinstance(schema, bool) or schema < 1:
            raise ManifestError(f"run {known.get('run_id')!r}: schema "
                                f"{schema!r} is not a version number")
        if schema > SCHEMA_VERSION:
            raise ManifestError(f"run {known.get('run_id')!r} has manifest schema {schema}, newer "
                                "than this fleet reads "
                                f"({SCHEMA_VERSION}): upgrade fleet to read it")
        if "run_id" not in known:
            raise ManifestError("a run manifest without a run_id")
        known["schema"] = schema
        known["request"] = known.get("request") or {}
        known["hosts"] = [HostEntry.from_json(h) for h in known.get("hosts") or []]
        if known.get("slurm") is not None:
            known["slurm"] = SlurmInfo.from_json(known["slurm"])
        return cls(**known)
