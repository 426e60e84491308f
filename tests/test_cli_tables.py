"""Tables for people: a header, whole values when piped, colour on a terminal unless NO_COLOR."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import run_fleet
from tests.harness.manifests import V1, put_in_store

COLOUR = re.compile(r"\x1b\[[0-9;]*(3[0-7]|9[0-7]|38;)")  # a foreground colour, not bold or dim alone


def store_with_a_partial_run(tmp_path):
    doc = json.loads((V1 / "lab-partial.json").read_text())
    put_in_store(tmp_path, doc)
    assert run_fleet("reports", "reindex", "--store", str(tmp_path)).returncode == 0
    return doc


def test_reports_ls_piped_has_a_header_and_whole_paths(tmp_path):
    doc = store_with_a_partial_run(tmp_path)
    out = run_fleet("reports", "ls", "--store", str(tmp_path))
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split() == ["RUN", "HOST", "TOOL", "STATUS", "SHA256", "PATH"]
    assert rows and all(row.startswith(doc["run_id"]) for row in rows)
    # Each stored file where it is in this store (the manifest came from another one), whole.
    [run] = tmp_path.glob(f"*/*/{doc['run_id']}")
    stored = [run.joinpath(*Path(r["stored"]).parts[Path(r["stored"]).parts.index(doc["run_id"]) + 1:])
              for h in doc["hosts"] for r in h["reports"] if r.get("stored")]
    assert stored and all(any(row.endswith(str(path)) for row in rows) for path in stored)  # never cut short
    assert not COLOUR.search(out.stdout)


def test_statuses_are_coloured_on_a_terminal_but_not_under_no_color(tmp_path):
    store_with_a_partial_run(tmp_path)
    coloured = run_fleet("reports", "ls", "--store", str(tmp_path), env={"FORCE_COLOR": "1", "COLUMNS": "200"})
    plain = run_fleet("reports", "ls", "--store", str(tmp_path),
                      env={"FORCE_COLOR": "1", "COLUMNS": "200", "NO_COLOR": "1"})
    assert COLOUR.search(coloured.stdout) and "refused" in coloured.stdout
    assert not COLOUR.search(plain.stdout) and "refused" in plain.stdout and "STATUS" in plain.stdout


def test_the_summary_status_that_ls_shows_can_be_asked_for(tmp_path):
    out = run_fleet("reports", "ls", "--status", "summary", "--store", str(tmp_path))
    assert out.returncode == 0, out.stderr
