"""The report store's catalog: a removed run leaves nothing behind; the catalog has a version,
an unversioned one (as fleet wrote it before) is rebuilt from the manifests, a newer one refused."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from fleet import exitcodes, store
from tests.conftest import fleet_json, run_fleet
from tests.harness.store_runs import nightly_run, rows_of

# The catalog as fleet created it before it had a version (PRAGMA user_version 0).
UNVERSIONED_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, site TEXT, day TEXT, started TEXT, user TEXT, tool TEXT,
    command TEXT, status TEXT, manifest TEXT);
CREATE TABLE IF NOT EXISTS kernels (
    run_id TEXT, host TEXT, name TEXT, total_ns INTEGER, instances INTEGER);
CREATE TABLE IF NOT EXISTS metrics (
    run_id TEXT, playbook TEXT, metric TEXT, device TEXT, value REAL, flags TEXT, started TEXT);
CREATE TABLE IF NOT EXISTS reports (
    run_id TEXT, host TEXT, path TEXT, tool TEXT, status TEXT, sha256 TEXT, size INTEGER,
    gpu TEXT, driver TEXT, tool_version TEXT, started TEXT,
    PRIMARY KEY (run_id, host, path));
"""


def user_version(root: Path) -> int:
    with closing(sqlite3.connect(root / "catalog.sqlite")) as db:
        return db.execute("PRAGMA user_version").fetchone()[0]


def test_a_removed_run_leaves_no_kernels_or_metrics_behind(tmp_path):
    a = nightly_run(tmp_path, "20261128-020000-aaaa", 1_000_000)
    b = nightly_run(tmp_path, "20261129-020000-bbbb", 1_500_000)
    assert store.reindex(tmp_path) == (2, [])
    assert [(r["a_ns"], r["b_ns"]) for r in store.compare(tmp_path, a, b)] == [(1_000_000, 1_500_000)]
    assert [r["run_id"] for r in store.metric_history(tmp_path, "bench")] == [a, b]
    out = run_fleet("reports", "rm", a, "--store", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert rows_of(tmp_path, a) == {"runs": 0, "reports": 0, "kernels": 0, "metrics": 0}
    assert [(r["a_ns"], r["b_ns"]) for r in store.compare(tmp_path, a, b)] == [(0, 1_500_000)]
    assert [r["run_id"] for r in store.metric_history(tmp_path, "bench")] == [b]  # the nightly trend forgets it


def test_an_unversioned_catalog_is_rebuilt_from_the_manifests_and_gets_a_version(tmp_path):
    kept = nightly_run(tmp_path, "20261129-020000-bbbb", 1_500_000)
    # As fleet left it before: a removed run's kernels and metrics still there, and a run it never saw.
    with closing(sqlite3.connect(tmp_path / "catalog.sqlite")) as db, db:
        db.executescript(UNVERSIONED_SCHEMA)
        gone = "20261128-020000-aaaa"
        db.execute("INSERT INTO kernels VALUES (?, 'h02', 'gemm_kernel', 1000000, 3)", (gone,))
        db.execute("INSERT INTO metrics VALUES (?, 'bench', 'total GPU kernel time', 'NVIDIA H200 on h02', "
                   "1000000.0, '[]', '2026-11-28T02:00:00+0000')", (gone,))
    assert user_version(tmp_path) == 0
    listed = fleet_json(run_fleet("reports", "ls", "--store", str(tmp_path), "--json").stdout)
    assert [(r["run_id"], r["status"]) for r in listed] == [(kept, "summary")]
    assert rows_of(tmp_path, gone) == {"runs": 0, "reports": 0, "kernels": 0, "metrics": 0}
    assert rows_of(tmp_path, kept) == {"runs": 1, "reports": 1, "kernels": 1, "metrics": 1}
    assert [r["run_id"] for r in store.metric_history(tmp_path, "bench")] == [kept]
    assert user_version(tmp_path) == store.CATALOG_VERSION >= 1


def test_a_new_catalog_has_its_version(tmp_path):
    nightly_run(tmp_path, "20261129-020000-bbbb", 1_500_000)
    assert run_fleet("reports", "reindex", "--store", str(tmp_path)).returncode == 0
    assert user_version(tmp_path) == store.CATALOG_VERSION


def test_a_catalog_from_a_newer_fleet_is_refused_in_one_line(tmp_path):
    nightly_run(tmp_path, "20261129-020000-bbbb", 1_500_000)
    store.reindex(tmp_path)
    with closing(sqlite3.connect(tmp_path / "catalog.sqlite")) as db:
        db.execute(f"PRAGMA user_version = {store.CATALOG_VERSION + 1}")
    for args in (["ls"], ["show", "20261129-020000-bbbb"], ["reindex"]):
        out = run_fleet("reports", *args, "--store", str(tmp_path))
        assert out.returncode == exitcodes.USAGE, (args, out.stdout, out.stderr)
        [line] = out.stderr.splitlines()
        assert line.startswith("fleet: ") and "newer than this fleet's" in line and "upgrade fleet" in line
    assert user_version(tmp_path) == store.CATALOG_VERSION + 1  # left as it was


def test_one_unreadable_manifest_keeps_no_other_run_out_of_the_catalog(tmp_path):
    """A manifest cut short made every migration and reindex fail, and so every fleet profile."""
    nightly_run(tmp_path, "20261129-020000-bbbb", 1_500_000)
    nightly_run(tmp_path, "20261130-020000-cccc", 1_600_000)
    [cut] = tmp_path.glob("*/*/20261130-020000-cccc/manifest.json")
    cut.write_text(cut.read_text()[:40])
    out = run_fleet("reports", "reindex", "--store", str(tmp_path))
    assert out.returncode == 0 and "catalogued 1 runs" in out.stdout
    assert "left out" in out.stderr and "20261130-020000-cccc" in out.stderr
    assert [r["run_id"] for r in store.reports(tmp_path)] == ["20261129-020000-bbbb"]


def test_the_store_is_modules_of_one_concern_with_no_import_circle():
    """store/ was one module of layout, manifest I/O, catalog, queries, removal, pull and CSV; now
    each concern is a module under ~250 lines, importing only those before it (no circle)."""
    import ast

    from tests.conftest import REPO

    package = REPO / "fleet" / "store"
    imports: dict[str, set[str]] = {}
    for path in package.glob("*.py"):
        assert len(path.read_text().splitlines()) <= 250, path
        edges = imports.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                edges |= {node.module.split(".")[0]} if node.module else \
                    {a.name if (package / f"{a.name}.py").exists() else "__init__" for a in node.names}
    seen: dict[str, str] = {}

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join(path + (module,))}"
        if seen.get(module) != "done":
            for other in sorted(imports.get(module, ())):
                visit(other, path + (module,))
            seen[module] = "done"

    for module in sorted(imports):
        visit(module, ())
