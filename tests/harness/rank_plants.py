"""Eight ranks on eight GPUs for the synthetic nsys exports (tests/harness/nsys_export.py): one late."""

from __future__ import annotations

from tests.harness import nsys_export as nx

UUIDS = [f"{i:08x}-5ce6-c18b-76d2-d40138606229" for i in range(8)]


def eight(late: int = 5, **late_plant) -> list[nx.Plant]:
    plants = [nx.Plant(kernels=20, gpu=i) for i in range(8)]
    plants[late] = nx.Plant(**{"kernels": 60, "gpu": late, **late_plant})
    return plants
