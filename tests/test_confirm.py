"""`fleet nightly confirm`: a change's two versions rerun A/B/B/A and judged over those runs alone.
The verdicts and the exact test on their own; the change found in a planted history; then the whole
command over the lab servers of tests/harness/lab.py, the workload's version selected by a checkout
command of the test's own (the stand-in nsys scales the recorded kernels to the workload's time,
as a GPU would: a workload that sleeps longer has longer kernels)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import yaml

from fleet import store
from fleet.nightly import confirm as c
from fleet.nightly import confirm_runs as c_runs
from fleet.nightly.confirm_runs import target_from_history
from fleet.nightly.environment import Environment
from fleet.nightly.playbook import load
from fleet.nightly.run import EmbeddedHistory
from tests.conftest import fleet_json, run_fleet
from tests.harness.store_runs import noisy, plant

H200 = Environment(gpu="NVIDIA H200", gpu_uuid="GPU-5a1e", driver="580.159.04", node="gx-01", sm_clock_mhz=1980)


def runs(a: list[float], b: list[float], env=H200, flags=()) -> list[c.Measured]:
    """A and B in the order A, B, B, A (for two of each), as the command runs them."""
    order, a_left, b_left = [], list(a), list(b)
    for side in c.sides(rounds=max(1, len(a) // 2)):
        order.append(c.Measured(side, f"run-{len(order)}", (a_left if side == "A" else b_left).pop(0), env, flags))
    return order


def test_the_exact_test_is_one_split_in_six_for_two_a_side_and_one_in_seventy_for_four():
    assert c.p_value([1.0, 1.01], [1.1, 1.11], +1) == pytest.approx(1 / 6)
    assert c.p_value([1.0, 1.01, 0.99, 1.0], [1.1, 1.11, 1.12, 1.09], +1) == pytest.approx(1 / 70)
    assert c.p_value([1.1, 1.11], [1.0, 1.01], +1) == 1.0  # the other way: every split is at least as far


def test_a_slowdown_that_every_b_run_shows_holds_and_one_within_the_noise_does_not():
    held = c.judge("m", "d", runs([100.0, 101.0], [106.0, 107.0]), expected=0.06, least=0.02)
    assert held.verdict == c.HOLDS and held.rel == pytest.approx(106.5 / 100.5 - 1) and held.p_value == pytest.approx(1 / 6)
    gone = c.judge("m", "d", runs([100.0, 101.0], [100.5, 101.2]), expected=0.06, least=0.02)
    assert gone.verdict == c.NOT_HELD and "the history's change was +6.0%" in gone.why
    other_way = c.judge("m", "d", runs([100.0, 101.0], [94.0, 95.0]), expected=0.06, least=0.02)
    assert other_way.verdict == c.NOT_HELD
    overlap = c.judge("m", "d", runs([100.0, 110.0], [108.0, 109.0]), expected=0.06, least=0.02)
    assert overlap.verdict == c.UNCLEAR and "overlap" in overlap.why


def test_a_contaminated_run_or_a_moved_environment_makes_it_unclear_and_says_which():
    tenant = runs([100.0, 101.0], [106.0, 107.0])
    tenant[1] = replace(tenant[1], flags=("tenant: GPU 0: pid 41 (bob)",))
    v = c.judge("m", "d", tenant, expected=0.06, least=0.02)
    assert v.verdict == c.UNCLEAR and "run run-1 (tenant: GPU 0: pid 41 (bob))" in v.why
    moved = runs([100.0, 101.0], [106.0, 107.0])
    moved[3] = replace(moved[3], environment=replace(H200, driver="580.95.05"))
    v = c.judge("m", "d", moved, expected=0.06, least=0.02)
    assert v.verdict == c.UNCLEAR and "driver 580.159.04 -> 580.95.05" in v.why


def test_the_change_to_confirm_is_the_newest_where_the_workloads_version_changed(tmp_path):
    values = noisy(14, 1) + [v * 1.06 for v in noisy(5, 2)]
    ids = plant(tmp_path / "store", "train-step", values, ["4f1c2e"] * 14 + ["9b0d7a"] * 5, ["580.95.05"] * 19)
    book = tmp_path / "train.yaml"
    book.write_text(yaml.safe_dump({"name": "train-step", "target": {"hosts": "gx-01"}, "command": ["true"],
                                    "version": ["git", "-C", "~/proj", "rev-parse", "HEAD"],
                                    "checkout": ["git", "-C", "~/proj", "switch", "--detach", "--quiet"]}))
    target = target_from_history(EmbeddedHistory(tmp_path / "store"), load(book), None)
    assert (target.before, target.after, target.run_after) == ("4f1c2e", "9b0d7a", ids[14])
    [(metric, device, rel)] = target.expected
    assert metric == "total GPU kernel time" and device == "NVIDIA H200 on gx-01" and 0.04 < rel < 0.08
    with pytest.raises(c.ConfirmError, match=f"no change point at run {ids[3]}"):
        target_from_history(EmbeddedHistory(tmp_path / "store"), load(book), ids[3])


def test_a_change_the_workloads_version_does_not_explain_has_nothing_to_rerun(tmp_path):
    values = noisy(14, 3) + [v * 1.06 for v in noisy(5, 4)]
    plant(tmp_path / "store", "train-step", values, ["4f1c2e"] * 19, ["580.95.05"] * 14 + ["580.159.04"] * 5)
    book = tmp_path / "train.yaml"
    book.write_text(yaml.safe_dump({"name": "train-step", "target": {"hosts": "gx-01"}, "command": ["true"],
                                    "version": ["cat", "/v"], "checkout": ["sh", "/select"]}))
    with pytest.raises(c.ConfirmError, match=r"environment: driver 580\.95\.05 -> 580\.159\.04\) is not the workload's"):
        target_from_history(EmbeddedHistory(tmp_path / "store"), load(book), None)


def test_a_checkout_needs_a_version_command_and_both_are_words(tmp_path):
    book = tmp_path / "b.yaml"
    book.write_text(yaml.safe_dump({"name": "b", "target": {"hosts": "h02"}, "command": ["true"],
                                    "checkout": ["git", "checkout"]}))
    r = run_fleet("nightly", "confirm", str(book), "--versions", "a", "b")
    assert r.returncode == 2 and "checkout needs version too" in r.stderr and "Traceback" not in r.stderr
    book.write_text(yaml.safe_dump({"name": "b", "target": {"hosts": "h02"}, "command": ["true"],
                                    "version": ["cat", "/v"], "checkout": "git checkout"}))
    r = run_fleet("nightly", "confirm", str(book), "--versions", "a", "b")
    assert r.returncode == 2 and "checkout must be a list of words" in r.stderr


@pytest.fixture
def versioned(tmp_path):
    """A playbook on h02 whose workload sleeps by its version (v1: 0.3 s, v2: 0.9 s), selected by a
    checkout command that writes the version file and logs each checkout."""
    version, log = tmp_path / "version", tmp_path / "checkouts"
    version.write_text("v2\n")
    select = f'test "$1" != broken || {{ echo "no such revision: $1" >&2; exit 1; }}; ' \
             f'printf "%s\\n" "$1" > {version}; echo "$1" >> {log}'
    book = tmp_path / "bench.yaml"
    book.write_text(yaml.safe_dump({
        "name": "confirm-bench", "target": {"hosts": "h02"}, "tool": "nsys",
        "command": ["sh", "-c", f'case $(cat {version}) in v1) sleep 0.3;; *) sleep 0.9;; esac'],
        "version": ["cat", str(version)], "checkout": ["sh", "-c", select, "sh"]}))
    return book, version, log


def test_confirm_reruns_a_b_b_a_says_it_holds_and_puts_the_workload_back(lab, versioned, tmp_path):
    book, version, log = versioned
    root = tmp_path / "store"
    r = run_fleet("nightly", "confirm", str(book), "--versions", "v1", "v2", "--store", str(root), env=lab["c"].env())
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("confirming v1 (A) against v2 (B): ABBA\n")
    sides = [line.split()[:2] for line in r.stdout.splitlines() if line.startswith("  ")]
    assert sides == [["A", "v1:"], ["B", "v2:"], ["B", "v2:"], ["A", "v1:"]], r.stdout
    assert "holds: total GPU kernel time (" in r.stdout and "every B run above every A run" in r.stdout
    assert r.stdout.rstrip().endswith("the workload is back at v2")
    assert log.read_text().split() == ["v1", "v2", "v2", "v1", "v2"] and version.read_text() == "v2\n"
    # the runs are kept, with their reports, but are no nights of the playbook's history
    assert store.metric_history(root, "confirm-bench") == []
    manifests = sorted(root.glob("lab/*/*/manifest.json"))
    kept = [json.loads(p.read_text())["playbook"] for p in manifests]
    assert sorted(k["confirm"]["order"] for k in kept) == [0, 1, 2, 3] and not any("metrics" in k for k in kept)
    assert {k["confirm"]["side"]: k["version"] for k in kept} == {"A": "v1", "B": "v2"}


def test_a_failed_checkout_stops_it_puts_the_workload_back_and_exits_1(lab, versioned, tmp_path):
    book, version, log = versioned
    r = run_fleet("nightly", "confirm", str(book), "--versions", "v1", "broken", "--json",
                  "--store", str(tmp_path / "store"), env=lab["c"].env())
    assert r.returncode == 1, r.stdout + r.stderr
    doc = fleet_json(r.stdout)
    assert [run["side"] for run in doc["runs"]] == ["A"] and doc["verdicts"] == []
    assert doc["error"] == "checkout broken on h02: exit status 1: no such revision: broken"
    assert doc["left_at"] == "v2" and version.read_text() == "v2\n" and "Traceback" not in r.stderr
    assert log.read_text().split() == ["v1", "v2"]


def test_a_version_that_would_be_an_option_or_a_path_is_refused_before_anything_is_checked_out(lab, versioned,
                                                                                                  tmp_path):
    """The versions come from the history, which the nodes wrote: one starting with '-' stops it."""
    book, version, log = versioned
    values = noisy(14, 5) + [v * 1.08 for v in noisy(5, 6)]  # +6 %: one of its 399 shuffles ties it
    plant(tmp_path / "s", "confirm-bench", values, ["--orphan=x"] * 14 + ["v2"] * 5, ["580.95.05"] * 19)
    r = run_fleet("nightly", "confirm", str(book), "--store", str(tmp_path / "s"), env=lab["c"].env())
    assert r.returncode == 2 and "version '--orphan=x' is not one a checkout command may be given" in r.stderr
    assert not log.exists() and r.stdout == "" and "Traceback" not in r.stderr


def test_a_version_is_one_word_of_a_tags_branchs_or_hashs_characters():
    for fine in ("4f1c2e9", "v1.2.3", "release/2024-11", "HEAD@{1}"[:4], "1.0+cu130"):
        assert c_runs.checked_version(fine) == fine
    for bad in ("", ".", "..", "a/../b", "-x", "--orphan=x", ".hidden", "two words", "v1\nv2", "~/x", "a;b", "x" * 129):
        with pytest.raises(c.ConfirmError):
            c_runs.checked_version(bad)


def test_the_exact_test_counts_the_observed_split_however_large_the_values():
    big = 1e13
    assert c.p_value([big + .3, big + .7], [big + 1.1, big + 1.4], +1) == pytest.approx(1 / 6)


def test_an_a_run_that_measured_nothing_is_unclear_not_a_crash():
    v = c.judge("m", "d", runs([0.0, 100.0], [40.0, 45.0]), expected=-0.5, least=0.02)
    assert v.verdict == c.UNCLEAR and v.why == "an A run measured 0"


def test_runs_on_two_gpus_of_one_model_are_no_confirmation():
    two = runs([100.0, 101.0], [106.0, 107.0])
    two[2] = replace(two[2], environment=replace(H200, gpu_uuid="GPU-77b0"))
    v = c.judge("m", "d", two, expected=0.06, least=0.02)
    assert v.verdict == c.UNCLEAR and "GPU GPU-5a1e -> GPU-77b0" in v.why


def test_b_beyond_a_but_nearer_than_the_least_change_at_the_nearest_pair_is_unclear():
    v = c.judge("m", "d", runs([100.0, 106.0], [106.5, 110.0]), expected=0.06, least=0.02)
    assert v.verdict == c.UNCLEAR and "+0.5% at the nearest pair" in v.why


def test_a_playbook_without_checkout_is_refused_before_anything_runs(tmp_path):
    book = tmp_path / "plain.yaml"
    book.write_text(yaml.safe_dump({"name": "plain", "target": {"hosts": "h02"}, "command": ["true"],
                                    "version": ["echo", "v1"]}))
    r = run_fleet("nightly", "confirm", str(book), "--versions", "v1", "v2", "--store", str(tmp_path / "s"))
    assert r.returncode == 2 and "the playbook has no checkout command" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s").exists()
