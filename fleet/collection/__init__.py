"""Problem 3, collection: how do the reports get out, whole, into one store?

The door to where fleet answers it. Its rules:

* every file of a run has a name no other job, host or rank can take (:mod:`fleet.rundir`,
  ``%q{SLURM_PROCID}``, ``%h``), spelled in one place for the node and the controller;
* the node makes sure the report exists where nsys said (it exits 0 even when it wrote
  elsewhere), finishes the ``.qdstrm`` a killed nsys left, and hashes each file
  (fleet/agent/reports.py);
* what a node names is data: only a plain file in the run's own folder is fetched
  (:mod:`.bring`), resumably, checked against the node's sha256 and renamed into place
  (:mod:`.fetch`);
* a report brought home can still not be what was meant (empty, cut, of the launcher):
  :mod:`fleet.completeness` says which, and a lost report fails its host
  (:func:`fleet.outcome.lost`).

:func:`finding` is what ``fleet doctor`` says of it for one node: whether its report folder can
take the reports.
"""

from __future__ import annotations

from .. import policy

ROOM = 2 * 2**30  # bytes free under which a report folder is said to have little room


def finding(state: dict) -> policy.Finding:
    """Whether the report directory can take the reports: writable, on disk, with room."""
    rd = state.get("report_dir") or {}
    if "error" in rd or not rd:
        return policy.Finding("bad", f"report directory: {rd.get('error', 'unknown')}")
    free = rd.get("free_bytes") or 0
    text, status = f"{rd['path']} ({rd.get('fstype')}), {free / 2**30:.1f} GiB free", policy.OK
    if not rd.get("writable"):
        status, text = "bad", text + ", NOT writable"
    elif rd.get("memory_backed"):
        status, text = "warn", text + ": memory-backed, large reports eat the node's RAM"
    elif free < ROOM:
        status, text = "warn", text + ": little room for reports"
    return policy.Finding(status, text)
