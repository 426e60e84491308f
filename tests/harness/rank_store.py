"""A Slurm-shaped run in a store whose ranks' exports are synthetic nsys exports
(tests/harness/nsys_export.py), for ``fleet reports ranks`` and the analysis under it."""

from __future__ import annotations

from pathlib import Path

from fleet import store
from fleet.collection.fetch import sha256_of
from fleet.store.manifest import HostEntry, ProcessSeen, ReportEntry, RunManifest
from tests.harness import nsys_export as nx
from tests.harness.rank_plants import UUIDS

RUN = "20261201-120000-ab01"


def file_run(tmp_path: Path, scenario: nx.Scenario, *, missing=(), conditions=None, processes=None) -> Path:
    """A Slurm-shaped run in a store: one export per rank under node{gpu // 4}/, ``missing`` ranks
    left with no result, each rank's result carrying ``conditions[rank]`` when given, else the GPU
    fleet's watch names (``conditions=False``: a result from before fleet recorded conditions)."""
    root = tmp_path / "store"
    m = RunManifest(run_id=RUN, site="cluster", day="2026-12-01", started="2026-12-01T12:00:00", user="ana",
                    request={"tool": "nsys", "command": ["python3", "train.py"]}, status="partial")
    directory = store.save(root, m)
    schema, names = nx.recorded_schema(), nx.recorded_names()
    for r, plant in enumerate(scenario.plants):
        if r in missing:
            m.hosts.append(HostEntry("(no result)", "missing", rank=r, missing_why="the rank left no result"))
            continue
        node = f"node{plant.gpu // 4}"
        (directory / node).mkdir(exist_ok=True)
        path = nx.write(directory / node / f"rank{r}.sqlite", scenario, r, schema, names, UUIDS)
        rep = ReportEntry(remote=f"/scratch/{node}/rank{r}.sqlite", stored=str(path), size=path.stat().st_size,
                          sha256=sha256_of(path), status="export", verified=True, summary="sqlite")
        # What fleet's watch records of the rank's GPU (conditions given replace it; None: not recorded).
        recorded = {"gpus": [{"index": plant.gpu, "uuid": "GPU-" + UUIDS[plant.gpu]}], "samples": []}
        result = {"conditions": (conditions or {}).get(r, recorded)} if conditions is not False else {}
        m.hosts.append(HostEntry(node, "ok", rank=r, node=node, gpu="NVIDIA H200", reports=[rep], result=result,
                                 processes_seen=[ProcessSeen.from_json(p) for p in (processes or {}).get(r, [])]))
    store.save(root, m)
    return root
