"""Run manifests as fleet wrote them, filed in a store as a run files them."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Manifests written before the schema had a version, as main wrote them (real runs' shapes).
V1 = REPO / "tests" / "fixtures" / "manifests-v1"


def put_in_store(root: Path, doc: dict) -> Path:
    directory = root / doc["site"] / doc["day"] / doc["run_id"]
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(json.dumps(doc))
    return directory
