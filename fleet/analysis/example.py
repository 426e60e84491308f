"""``fleet reports ranks --example DIR``: the cross-rank analysis tried on two ranks' exports
recorded on an H200 (``tests/fixtures/ranks-h200/recorded/`` of fleet's source checkout: two ranks
under torchrun on one GPU, rank 1 with three times the matrix products), filed as a run of a store
of their own, never the user's. The exports (2.4 MB) are not shipped in the
package: DIR names them."""

from __future__ import annotations

import shutil
from pathlib import Path

from .. import store
from ..rundir import RunDir
from ..collection.fetch import sha256_of
from ..store.manifest import HostEntry, ReportEntry, RunManifest
from ..statuses import HostStatus, RunStatus

RUN_ID = "example-h200"
RECORDED = "tests/fixtures/ranks-h200/recorded"  # where a checkout holds them
SYNC_RANGE = "sync"  # the NVTX range the recorded workload put around its gloo all-reduce
# as recorded
GPU = {"gpus": [{"index": 0, "uuid": "GPU-7ad7e474-b7a2-3fd1-a48b-45288deae15e"}], "samples": []}
RANKS = (0, 1)
EXPORT = ".sqlite"  # each rank's export, named by its label: rank0.sqlite, rank1.sqlite


def missing(exports: Path) -> str | None:
    """Why ``exports`` is not the recorded example's folder, or None."""
    absent = [RunDir.label(r) + EXPORT for r in RANKS
              if not (exports / (RunDir.label(r) + EXPORT)).is_file()]
    if not absent:
        return None
    return (f"--example {exports}: no {' nor '.join(absent)} there; the recorded exports are in "
            f"fleet's source checkout, as {RECORDED}")


def filed(root: Path, exports: Path) -> RunManifest:
    """The recorded run filed in the store ``root`` (a folder of the caller's, made here): its
    two ranks' exports from ``exports``, as a gather would have brought them home, on host ``vm``
    (the H200's)."""
    m = RunManifest(run_id=RUN_ID, site="example", day="2026-12-01", started="2026-12-01T13:18:50",
                    user="example",
                    request={"tool": "nsys",
                             "command": ["torchrun", "--nproc-per-node", "2", "ranks-check.py"]},
                    status=RunStatus.COMPLETE)
    directory = store.save(root, m)
    (directory / "vm").mkdir(mode=0o700)
    for rank in RANKS:
        path = directory / "vm" / (RunDir.label(rank) + EXPORT)
        shutil.copyfile(exports / path.name, path)
        rep = ReportEntry(remote=f"/recorded/{path.name}", stored=str(path),
                          size=path.stat().st_size,
                          sha256=sha256_of(path), status="export", verified=True, summary="sqlite")
        m.hosts.append(HostEntry("vm", HostStatus.OK, rank=rank, node="vm", gpu="NVIDIA H200",
                                 reports=[rep], result={"conditions": GPU}))
    store.save(root, m)
    return m
