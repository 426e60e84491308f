"""Problem 3, collection: how do the reports get out, whole, into one store?

The door to where fleet answers it. Its rules:

* every file of a run has a name no other job, host or rank can take (:mod:`fleet.rundir`,
  ``%q{SLURM_PROCID}``, ``%h``), spelled in one place for the node and the controller;
* the node makes sure the report exists where nsys said (it exits 0 even when it wrote
  elsewhere), finishes the ``.qdstrm`` a killed nsys left, and hashes each file
  (fleet/agent/reports.py, with strays.py and qdstrm.py);
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


def finding(state: policy.NodeState) -> policy.Finding:
    """Whether the report directory can take the reports: writable, on disk, with room."""
    rd = state.report_dir
    if rd is None:
        return policy.Finding("bad",
                              f"report directory: {state.section_error('report_dir') or 'unknown'}")
    free = rd.free_bytes or 0
    text, status = f"{rd.path} ({rd.fstype}), {free / 2**30:.1f} GiB free", policy.OK
    if not rd.writable:
        status, text = "bad", text + ", NOT writable"
    elif rd.memory_backed:
        status, text = "warn", text + ": memory-backed, large reports eat the node's RAM"
    elif free < ROOM:
        status, text = "warn", text + ": little room for reports"
    return policy.Finding(status, text)
