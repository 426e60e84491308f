"""The team store against a real PostgreSQL and a real S3 server (SeaweedFS), set up as
docs/team-store.md says: who sees what (through fleet, psql and S3 directly), pushing an embedded
store, the cuts (the catalog stopped before the commit, the S3 server killed and the client killed in
the middle of an upload) each followed by a retry, many clients at once, and a lab profile pushed
once it finishes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import run_fleet
from tests.harness.crontab import fire_as_cron, standin_crontab
from tests.harness.teamstore import BUCKET, PREFIX, TeamSite, embedded_run

BOB_RUN, ALICE_RUN, CAROL_RUN = "20261203-090000-b0b0", "20261203-090100-a11c", "20261203-090200-ca01"


@pytest.fixture(scope="module")
def site():
    s = TeamSite(people=("alice", "bob", "carol"), groups={"ml": ["alice", "bob"]})
    try:
        yield s.start()
    finally:
        s.stop()


def store_of(tmp_path: Path, name: str = "store") -> Path:
    root = tmp_path / name
    root.mkdir(mode=0o700)
    return root


def push(site, person, root, *run_ids):
    return site.fleet("reports", "push", *run_ids, env=site.env(person, root))


def keys_under(site, prefix: str) -> list[str]:
    s3 = site.s3_as("admin")
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return sorted(o["Key"] for page in pages for o in page.get("Contents", []))


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_a_setting_with_a_password_or_only_half_a_team_store_is_refused_touching_nothing(site, tmp_path):
    root = store_of(tmp_path)
    env = site.env("alice", root)
    with_password = {**env, "FLEET_CATALOG": env["FLEET_CATALOG"].replace("alice@", "alice:hunter2@")}
    r = site.fleet("reports", "ls", env=with_password)
    assert r.returncode == 2 and "holds a password" in r.stderr and "hunter2" not in r.stderr + r.stdout
    half = {k: v for k, v in env.items() if k != "FLEET_OBJECTS"}
    r = site.fleet("reports", "ls", env=half)
    assert r.returncode == 2 and "needs both a catalog and objects" in r.stderr
    r = site.fleet("reports", "ls", env={**env, "FLEET_OBJECTS": "s3://Not_A_Bucket/x"})
    assert r.returncode == 2 and "not an S3 bucket name" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_each_person_sees_their_own_runs_and_those_shared_with_their_group_and_nothing_else(site, tmp_path):
    for person, run_id in (("bob", BOB_RUN), ("alice", ALICE_RUN), ("carol", CAROL_RUN)):
        root = store_of(tmp_path, person)
        embedded_run(root, run_id, {"gx01": f"{person}'s report".encode()})
        r = push(site, person, root)
        assert r.returncode == 0, r.stderr
        assert f"{run_id}: pushed (1 file(s) sent" in r.stdout

    def listed(person, *extra):
        r = site.fleet("reports", "ls", "--json", *extra, env=site.env(person))
        assert r.returncode == 0, r.stderr
        return {(row["run_id"], row["owner"]) for row in json.loads(r.stdout)["data"]}

    assert listed("alice") == {(ALICE_RUN, "alice")}
    assert listed("bob") == {(BOB_RUN, "bob")}
    r = site.fleet("reports", "share", BOB_RUN, "ml", env=site.env("bob"))
    assert r.returncode == 0 and "shared with ml" in r.stdout, r.stderr
    assert listed("alice") == {(ALICE_RUN, "alice"), (BOB_RUN, "bob")}
    assert listed("alice", "--user", "bob") == {(BOB_RUN, "bob")}
    assert listed("alice", "--shared") == {(BOB_RUN, "bob")}
    assert listed("carol") == {(CAROL_RUN, "carol")}  # not in ml: bob's run stays out of sight
    # The table a person reads: the same two runs, each with its owner, the sha256 cut to 12.
    r = site.fleet("reports", "ls", env=site.env("alice"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["RUN", "OWNER", "HOST", "TOOL", "STATUS", "SHA256", "NAME"]
    bob_sha = hashlib.sha256(b"bob's report").hexdigest()[:12]
    assert sorted(line.split()[:2] + [line.split()[5]] for line in lines[1:]) == sorted(
        [[ALICE_RUN, "alice", hashlib.sha256(b"alice's report").hexdigest()[:12]], [BOB_RUN, "bob", bob_sha]])
    # alice may not share with a group she is not in, nor share bob's run.
    r = site.fleet("reports", "share", ALICE_RUN, "fleet_admin", env=site.env("alice"))
    assert r.returncode == 1 and "not a member of the group" in r.stderr
    r = site.fleet("reports", "share", BOB_RUN, "ml", env=site.env("alice"))
    assert r.returncode == 1 and "only its owner shares it" in r.stderr

    # alice pulls bob's shared run through the address the catalog signs, verified.
    r = site.fleet("reports", "pull", BOB_RUN, str(tmp_path / "pulled"), env=site.env("alice"))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "pulled" / "gx01" / "gx01-1.nsys-rep").read_bytes() == b"bob's report"
    r = site.fleet("reports", "pull", CAROL_RUN, str(tmp_path / "nope"), env=site.env("alice"))
    assert r.returncode == 2 and "that you may see" in r.stderr


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_nobody_reaches_anothers_private_run_with_their_own_credentials_directly(site, tmp_path):
    root = store_of(tmp_path)
    embedded_run(root, "20261203-091000-b0b1", {"gx02": b"private to bob"})
    assert push(site, "bob", root).returncode == 0
    bob_key = f"{PREFIX}/bob/lab/20261203-091000-b0b1/gx02/{hashlib.sha256(b'private to bob').hexdigest()}"
    assert keys_under(site, f"{PREFIX}/bob/lab/20261203-091000-b0b1/") == [bob_key]

    # psql as alice: the run, its reports and the signer's secret are out of her reach.
    for sql in ("SELECT count(*) FROM fleet.runs WHERE run_id = '20261203-091000-b0b1'",
                "SELECT count(*) FROM fleet.reports WHERE run_id = '20261203-091000-b0b1'"):
        assert site.psql(sql, role="alice").stdout.strip() == "0"
    for sql in ("SELECT secret_key FROM fleet_private.signer",
                "UPDATE fleet.runs SET owner = 'alice' WHERE run_id = '20261203-091000-b0b1' RETURNING 1",
                f"SELECT fleet.object_url('20261203-091000-b0b1', '{bob_key}')",
                "INSERT INTO fleet.runs (run_id, owner, site, day, started, status, manifest, manifest_sha256) "
                "VALUES ('20261203-091100-f0f0', 'bob', 'lab', 'd', 's', 'complete', '{}', 'x')"):
        r = site.psql(sql, role="alice", check=False)
        assert r.returncode != 0 or r.stdout.strip() == "", (sql, r.stdout)
    # S3 with alice's own keys: bob's prefix can be neither listed, read, written nor deleted.
    s3 = site.s3_as("alice")
    import botocore.exceptions

    for attempt in (lambda: s3.list_objects_v2(Bucket=BUCKET, Prefix=f"{PREFIX}/bob/"),
                    lambda: s3.list_objects_v2(Bucket=BUCKET, Prefix=""),
                    lambda: s3.get_object(Bucket=BUCKET, Key=bob_key),
                    lambda: s3.put_object(Bucket=BUCKET, Key=bob_key, Body=b"planted"),
                    lambda: s3.delete_object(Bucket=BUCKET, Key=bob_key)):
        with pytest.raises(botocore.exceptions.ClientError) as denied:
            attempt()
        assert denied.value.response["Error"]["Code"] in ("AccessDenied", "403")
    assert keys_under(site, bob_key) == [bob_key]


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_an_embedded_store_of_200_runs_is_pushed_whole_and_pushing_again_changes_nothing(site, tmp_path):
    root = store_of(tmp_path)
    expected = {}
    for i in range(200):
        run_id = f"20261201-{i // 60:02d}{i % 60:02d}00-{i:04x}"
        data = f"report {i}".encode() * (i + 1)
        embedded_run(root, run_id, {"gx03": data}, kernel_ns=1000 + i)
        expected[run_id] = hashlib.sha256(data).hexdigest()
    r = push(site, "carol", root)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count(": pushed (") == 200 and "200 run(s) in the team store" in r.stdout
    before = site.psql("SELECT run_id, pushed_at FROM fleet.runs WHERE run_id LIKE '20261201-%' ORDER BY run_id",
                       role="carol").stdout
    rows = site.psql("SELECT run_id, sha256, object_key FROM fleet.reports WHERE run_id LIKE '20261201-%' "
                     "AND name LIKE '%.nsys-rep'", role="carol").stdout.split()
    assert len(rows) == 200
    s3 = site.s3_as("carol")
    for line in rows:
        run_id, sha, key = line.split("|")
        assert sha == expected[run_id]
        assert hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()).hexdigest() == sha
    assert site.psql("SELECT count(*) FROM fleet.kernels WHERE run_id LIKE '20261201-%'",
                     role="carol").stdout.strip() == "200"

    again = push(site, "carol", root)
    assert again.returncode == 0 and again.stdout.count("already in the team store, unchanged") == 200
    after = site.psql("SELECT run_id, pushed_at FROM fleet.runs WHERE run_id LIKE '20261201-%' ORDER BY run_id",
                      role="carol").stdout
    assert after == before
    keys = [k for k in keys_under(site, f"{PREFIX}/carol/lab/") if k.split("/")[3].startswith("20261201-")]
    assert len(keys) == len(set(keys)) == 400  # each report and each summary, once


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_a_run_the_catalog_refuses_mid_push_is_said_and_the_runs_after_it_go_on_the_same_connection(site, tmp_path):
    """A push keeps one catalog connection for all its runs: a refusal is rolled back on it, so the
    next run is not refused for a transaction left aborted."""
    taken = "20261203-094500-7a4e"
    alices = store_of(tmp_path, "alices")
    embedded_run(alices, taken, {"gx07": b"alice's run"})
    assert push(site, "alice", alices).returncode == 0
    root = store_of(tmp_path)
    mine = ["20261203-094400-c001", taken, "20261203-094600-c003"]
    for run_id in mine:
        embedded_run(root, run_id, {"gx08": run_id.encode()})
    r = push(site, "carol", root)
    assert r.returncode != 0 and taken in r.stdout + r.stderr, r.stdout + r.stderr
    assert r.stdout.count(": pushed (") == 2, r.stdout
    seen = site.psql("SELECT run_id FROM fleet.runs WHERE run_id LIKE '20261203-094%' ORDER BY run_id",
                     role="carol").stdout.split()
    assert seen == [mine[0], mine[2]]  # alice's run is not carol's to see, nor overwritten
    assert site.psql(f"SELECT manifest_sha256 <> '' FROM fleet.runs WHERE run_id = '{taken}'",
                     role="alice").stdout.strip() == "t"


class CutAfter:
    """An S3 client that does everything the real one does, and calls ``cut`` once ``method`` has
    been called ``after`` times (the cut lands between two requests, as a crash would)."""

    def __init__(self, real, method: str, after: int, cut):
        self.real, self.method, self.after, self.cut = real, method, after, cut
        self.calls, self.lock = 0, threading.Lock()

    def __getattr__(self, name):
        attribute = getattr(self.real, name)
        if name != self.method:
            return attribute

        def counted(*args, **kwargs):
            answer = attribute(*args, **kwargs)
            with self.lock:
                self.calls += 1
                if self.calls == self.after:
                    self.cut()
            return answer
        return counted


def in_process(site, person, monkeypatch):
    for k, v in site.env(person).items():
        monkeypatch.setenv(k, v)
    from fleet.store.team.config import resolve

    return resolve()


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_the_catalog_stopped_between_the_upload_and_the_commit_leaves_no_run_and_a_retry_ends_whole(
        site, tmp_path, monkeypatch):
    from fleet.store.team import objects
    from fleet.store.team.catalog import TeamUnavailable
    from fleet.store.team.push import push_run

    team = in_process(site, "alice", monkeypatch)
    root = store_of(tmp_path)
    run_id = "20261203-092000-cafe"
    embedded_run(root, run_id, {"gx04": b"a" * 1000, "gx05": b"b" * 2000})
    s3 = CutAfter(objects.client(), "put_object", 2, site.pg.stop)  # both files up, then the catalog goes
    try:
        with pytest.raises(TeamUnavailable, match="went away"):
            push_run(team, root, run_id, s3=s3)
    finally:
        site.pg.start()
    assert site.psql(f"SELECT count(*) FROM fleet.runs WHERE run_id = '{run_id}'", role="alice").stdout.strip() == "0"
    r = push(site, "alice", root, run_id)
    assert r.returncode == 0 and "0 file(s) sent, 2 already there" in r.stdout, r.stdout + r.stderr
    assert len(keys_under(site, f"{PREFIX}/alice/lab/{run_id}/")) == 2
    assert site.psql(f"SELECT count(*) FROM fleet.reports WHERE run_id = '{run_id}'", role="alice").stdout.strip() == "2"


def big_run(root: Path, run_id: str, mib: int) -> tuple[Path, str]:
    directory = embedded_run(root, run_id, {"gx06": b""})
    path = directory / "gx06" / "gx06-1.nsys-rep"
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(mib):
            block = hashlib.sha256(str(i).encode()).digest() * 32768  # 1 MiB, not all alike
            f.write(block)
            digest.update(block)
    manifest = directory / "manifest.json"
    doc = json.loads(manifest.read_text())
    doc["hosts"][0]["reports"][0].update(size=path.stat().st_size, sha256=digest.hexdigest())
    manifest.write_text(json.dumps(doc))
    return path, digest.hexdigest()


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_the_s3_server_killed_in_the_middle_of_a_1_gib_upload_means_a_retry_that_resumes(site, tmp_path, monkeypatch):
    from fleet.store.team import objects
    from fleet.store.team.catalog import TeamError
    from fleet.store.team.push import push_run

    team = in_process(site, "bob", monkeypatch)
    root = store_of(tmp_path)
    run_id = "20261203-093000-dead"
    path, sha = big_run(root, run_id, 1024)
    s3 = CutAfter(objects.client(), "upload_part", 4, site.s3.kill)  # 4 of 16 parts, then SIGKILL
    try:
        with pytest.raises(TeamError):
            push_run(team, root, run_id, s3=s3)
    finally:
        site.s3.start()
    assert site.psql(f"SELECT count(*) FROM fleet.runs WHERE run_id = '{run_id}'", role="bob").stdout.strip() == "0"
    done = push_run(team, root, run_id)
    assert done.sent == 1 and done.resumed_parts >= 4
    [key] = keys_under(site, f"{PREFIX}/bob/lab/{run_id}/")
    head = site.s3_as("bob").head_object(Bucket=BUCKET, Key=key)
    assert key.endswith(sha) and head["ContentLength"] == 1 << 30 and head["Metadata"]["sha256"] == sha
    assert not site.s3_as("admin").list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads")
    path.unlink()  # 1 GiB less on the disk


def test_the_client_killed_during_the_upload_means_a_retry_that_ends_in_one_verified_copy(site, tmp_path):
    root = store_of(tmp_path)
    run_id = "20261203-094000-beef"
    path, sha = big_run(root, run_id, 384)
    env = site.env("carol", root)
    full = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "AWS_", "PG"))}, **env}
    proc = subprocess.Popen([sys.executable, "-m", "fleet", "reports", "push", run_id], env=full,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    admin = site.s3_as("admin")
    key = f"{PREFIX}/carol/lab/{run_id}/gx06/{sha}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # killed once a part is on the server
        uploads = admin.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", [])
        if uploads and admin.list_parts(Bucket=BUCKET, Key=key, UploadId=uploads[0]["UploadId"]).get("Parts"):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert site.psql(f"SELECT count(*) FROM fleet.runs WHERE run_id = '{run_id}'", role="carol").stdout.strip() == "0"
    r = push(site, "carol", root, run_id)
    assert r.returncode == 0 and f"{run_id}: pushed (1 file(s) sent" in r.stdout, r.stderr
    assert keys_under(site, f"{PREFIX}/carol/lab/{run_id}/") == [key]
    body = admin.get_object(Bucket=BUCKET, Key=key)["Body"]
    digest = hashlib.sha256()
    while chunk := body.read(1 << 20):
        digest.update(chunk)
    assert digest.hexdigest() == sha
    path.unlink()


def test_eight_clients_at_once_lose_no_row_and_duplicate_no_object(site, tmp_path):
    procs, expected = [], set()
    for client in range(8):
        root = store_of(tmp_path, f"client{client}")
        for n in range(5):
            run_id = f"20261202-1{client}{n}000-{client:02x}{n:02x}"
            embedded_run(root, run_id, {f"gx{client}": b"shared content" if n == 0 else f"{client}-{n}".encode()})
            expected.add(run_id)
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "AWS_", "PG"))},
               **site.env("alice", root)}
        procs.append(subprocess.Popen([sys.executable, "-m", "fleet", "reports", "push"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    rows = site.psql("SELECT run_id FROM fleet.runs WHERE run_id LIKE '20261202-%'", role="alice").stdout.split()
    assert set(rows) == expected and len(rows) == 40
    keys = keys_under(site, f"{PREFIX}/alice/lab/")
    mine = [k for k in keys if k.split("/")[3].startswith("20261202-")]
    assert len(mine) == len(set(mine)) == 40


def test_eight_people_profiling_at_once_into_one_team_store_lose_no_row_and_duplicate_no_object(site, lab, tmp_path):
    """Eight `fleet profile` runs at once, alice's and bob's, over two lab servers, each from its own
    embedded store: every report the runs verified is in the catalog once, its object once, whole."""
    clients = []
    for n in range(8):
        person, host = ("alice", "bob")[n % 2], ("h02", "h03")[n // 4]
        root = store_of(tmp_path, f"client{n}")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "AWS_", "PG"))},
               **lab["c"].env(), **site.env(person, root)}
        clients.append((person, root, subprocess.Popen(
            [sys.executable, "-m", "fleet", "profile", "--hosts", host, "--", "sleep", "0.2"], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)))
    expected = {}  # (run, host, report name) -> sha256, as each client's embedded store verified it
    for person, root, proc in clients:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "team store: pushed (" in out, (out, err)
        [manifest] = root.glob("lab/*/*/manifest.json")
        doc = json.loads(manifest.read_text())
        for host in doc["hosts"]:
            for report in host["reports"]:
                if report["verified"]:
                    expected[(doc["run_id"], host["host"], Path(report["stored"]).name)] = (person, report["sha256"])
    runs = {run for run, _, _ in expected}
    assert len(runs) == 8
    listed = ", ".join(f"'{run}'" for run in sorted(runs))
    catalogued = {}
    for person in ("alice", "bob"):
        rows = site.psql(f"SELECT p.run_id, p.host, p.name, p.sha256, p.object_key, r.owner FROM fleet.reports p "
                         f"JOIN fleet.runs r USING (run_id) WHERE r.run_id IN ({listed}) AND r.owner = '{person}' "
                         f"AND p.object_key IS NOT NULL", role=person).stdout.split()
        for row in rows:
            run_id, host, name, sha, key, owner = row.split("|")
            assert (run_id, host, name) not in catalogued  # no row twice
            catalogued[(run_id, host, name)] = (owner, sha, key)
    assert {k: v[:2] for k, v in catalogued.items()} == expected  # no row lost, each its owner's
    s3 = site.s3_as("admin")
    for owner, sha, key in catalogued.values():
        assert key.startswith(f"{PREFIX}/{owner}/lab/")
        assert hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()).hexdigest() == sha
    keys = [k for k in keys_under(site, f"{PREFIX}/") if k.split("/")[3] in runs]
    assert sorted(keys) == sorted(key for _, _, key in catalogued.values())  # each object once, none stray


def test_a_lab_profile_is_pushed_once_it_finishes_and_kept_when_the_team_store_is_down(site, lab, tmp_path):
    env = {**lab["c"].env(), **site.env("bob")}
    r = run_fleet("profile", "--store", str(lab["out"]), "--hosts", "h02", "--", "sleep", "0.2", env=env)
    assert r.returncode == 0, r.stderr
    assert "team store: pushed (" in r.stdout
    run_id = r.stdout.split("run ")[-1].split()[0]
    r = site.fleet("reports", "show", run_id, env=site.env("bob"))
    assert r.returncode == 0 and f"run {run_id} (complete)" in r.stdout and "owner bob" in r.stdout

    site.pg.stop()
    try:
        r = run_fleet("profile", "--store", str(lab["out"]), "--hosts", "h02", "--", "sleep", "0.2", env=env)
    finally:
        site.pg.start()
    assert r.returncode == 0, r.stderr  # the run did its job: its reports are home, in the embedded store
    run_id = r.stdout.split("run ")[-1].split()[0]
    assert f"not pushed to the team store" in r.stderr and f"fleet reports push {run_id}" in r.stderr
    r = site.fleet("reports", "push", run_id, env={**site.env("bob"), "FLEET_STORE": str(lab["out"])})
    assert r.returncode == 0 and f"{run_id}: pushed" in r.stdout, r.stderr
    r = site.fleet("reports", "ls", "--json", env=site.env("bob"))
    assert run_id in {row["run_id"] for row in json.loads(r.stdout)["data"]}


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_the_nightly_report_judges_the_teams_history_its_own_runs_and_those_shared_with_it(site, tmp_path):
    values = [100, 102, 99, 101, 100, 98, 101, 121, 122]  # a step at the eighth night
    for i, v in enumerate(values):
        person = "alice" if i % 2 == 0 else "bob"  # the nights alternate between two people's schedules
        root = store_of(tmp_path, f"{person}-{i}")
        run_id = f"202611{i + 1:02d}-020000-{i:04x}"
        embedded_run(root, run_id, {"gx01": f"night {i}".encode()}, kernel_ns=int(v * 1e6), metric=("gemm", v * 1e6))
        assert push(site, person, root).returncode == 0
        if person == "bob":
            assert site.fleet("reports", "share", run_id, "ml", env=site.env("bob")).returncode == 0
    pb = tmp_path / "gemm.yaml"
    pb.write_text(yaml.safe_dump({"name": "gemm", "target": {"hosts": "gx01"}, "command": ["true"]}))
    out = tmp_path / "page" / "nightly.html"
    empty = store_of(tmp_path, "alice-empty")  # alice's embedded store holds nothing: the team store does
    r = site.fleet("nightly", "report", str(pb), "--out", str(out), env=site.env("alice", empty))
    assert r.returncode == 7, r.stdout + r.stderr  # the regression, found over both people's nights
    summary = json.loads(out.with_suffix(".json").read_text())
    assert summary["playbooks"][0]["runs"] == len(values)
    assert summary["playbooks"][0]["verdicts"][0]["verdict"] == "Regression"
    r = site.fleet("nightly", "report", str(pb), "--out", str(out), env=site.env("carol", empty))
    assert json.loads(out.with_suffix(".json").read_text())["playbooks"][0]["runs"] == 0  # carol is in no group


def test_a_playbook_run_lands_in_the_team_store_named_by_the_site_config_file(site, lab, tmp_path):
    person = site.env("alice")
    config = tmp_path / "site.toml"  # what a schedule's cron job finds: no FLEET_CATALOG in its environment
    config.write_text(f'catalog = "{person.pop("FLEET_CATALOG")}"\nobjects = "{person.pop("FLEET_OBJECTS")}"\n')
    pb = tmp_path / "nightly.yaml"
    pb.write_text(yaml.safe_dump({"name": "team-night", "target": {"hosts": "h02"}, "command": ["sleep", "0.2"]}))
    r = run_fleet("run", str(pb), "--store", str(lab["out"]),
                  env={**lab["c"].env(), **person, "FLEET_SITE_CONFIG": str(config)})
    assert r.returncode == 0, r.stderr
    assert "team store: pushed (" in r.stdout
    rows = site.psql("SELECT r.run_id FROM fleet.runs r JOIN fleet.metrics m ON m.run_id = r.run_id "
                     "WHERE m.playbook = 'team-night'", role="alice").stdout.split()
    assert len(set(rows)) == 1


def test_a_schedule_fired_by_cron_lands_its_night_in_the_team_store_and_the_report_reads_it(site, lab, tmp_path):
    """cron starts the schedule without the person's shell: where libpq and boto3 find alice's
    credentials must go with the schedule, and the credentials themselves must not."""
    bin_dir, table = standin_crontab(tmp_path)
    store = store_of(tmp_path, "alice-store")
    pb = tmp_path / "nightly.yaml"
    pb.write_text(yaml.safe_dump({"name": "cron-night", "target": {"hosts": "h02"}, "command": ["sleep", "0.2"]}))
    env = {**lab["c"].env(), **site.env("alice", store), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    r = run_fleet("schedule", "install", str(pb), "--cron", "0 2 * * *", "--backend", "crontab", env=env)
    assert r.returncode == 0, r.stderr
    [line] = table.read_text().splitlines()
    assert site.keys["alice"][1] not in line and site.pg_passwords["alice"] not in line
    home = tmp_path / "cron-home"
    home.mkdir()
    fired = fire_as_cron(line, home)
    log = (store / "schedules" / "cron-night.log").read_text()
    assert fired.returncode == 0 and "team store: pushed (" in log, (fired.stderr, log)
    [run_id] = re.findall(r"schedule cron-night: run (\S+) complete", log)
    owner = site.psql(f"SELECT owner FROM fleet.runs WHERE run_id = '{run_id}'", role="alice").stdout.split()
    assert owner == ["alice"]
    out = tmp_path / "page" / "nightly.html"
    r = site.fleet("nightly", "report", str(pb), "--out", str(out), env=site.env("alice", store_of(tmp_path, "empty")))
    assert r.returncode == 0, r.stdout + r.stderr
    assert json.loads(out.with_suffix(".json").read_text())["playbooks"][0]["runs"] == 1  # read from the team store
    assert run_fleet("schedule", "rm", "cron-night", env=env).returncode == 0 and table.read_text() == ""


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_stats_and_compare_read_a_team_run_as_they_read_one_of_the_embedded_store(site, tmp_path):
    ids = []
    for i, ns in enumerate((5_000_000, 9_000_000)):
        root = store_of(tmp_path, f"bob-{i}")
        run_id = f"20261204-03000{i}-5a7{i}"
        embedded_run(root, run_id, {"gx07": b"rep"}, kernel_ns=ns)
        assert push(site, "bob", root).returncode == 0
        assert site.fleet("reports", "share", run_id, "ml", env=site.env("bob")).returncode == 0
        ids.append(run_id)
    cache = tmp_path / "cache"
    env = {**site.env("alice", store_of(tmp_path, "alice-own")), "XDG_CACHE_HOME": str(cache)}
    r = site.fleet("reports", "stats", ids[0], "--json", env=env)
    assert r.returncode == 0, r.stderr
    assert "gemm_kernel" in r.stdout
    r = site.fleet("reports", "compare", ids[0], ids[1], "--json", env=env)
    assert r.returncode == 0, r.stderr
    [row] = json.loads(r.stdout)["data"]
    assert (row["a_ns"], row["b_ns"]) == (5_000_000, 9_000_000)
    copied = next(cache.glob(f"fleet/team-runs/lab/*/{ids[0]}/gx07/gx07-1_cuda_gpu_kern_sum.csv"))
    assert oct(copied.stat().st_mode & 0o777) == "0o600"
    r = site.fleet("reports", "stats", ids[0], env={**site.env("carol"), "XDG_CACHE_HOME": str(cache / "c")})
    assert r.returncode == 2 and "that you may see" in r.stderr  # carol is in no group it was shared with


@pytest.mark.parametrize("person, other", [("alice", "bob"), ("bob", "alice")])
def test_a_slurm_profile_is_pushed_with_every_ranks_report(site, hpc, tmp_path, person, other):
    env = {**hpc.env(), "FLEET_STORE": str(store_of(tmp_path)), **site.env(person)}
    r = run_fleet("profile", "--partition", "gpu", "--poll", "1", "--nodes", "2", "--ntasks-per-node", "1", "--",
                  "true", env=env, timeout=240)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "team store: pushed (" in r.stdout
    run_id = next(word.rstrip(":") for word in r.stdout.split() if word.count("-") == 2 and word[:8].isdigit())
    r = site.fleet("reports", "ls", "--json", env=site.env(person))
    rows = [row for row in json.loads(r.stdout)["data"] if row["run_id"] == run_id]
    reports = sorted((row["host"], row["name"]) for row in rows if row["name"].endswith(".nsys-rep"))
    assert reports == [("node1", "rank0.nsys-rep"), ("node2", "rank1.nsys-rep")]
    assert all(row["object_key"] and row["owner"] == person for row in rows if row["status"] == "complete")
    assert site.fleet("reports", "show", run_id, env=site.env(other)).returncode == 2  # the person's alone


@pytest.mark.services  # starts SeaweedFS and PostgreSQL (tests/harness/teamservers.py)
def test_a_file_changed_since_the_store_verified_it_is_not_pushed_and_the_run_stays_out(site, tmp_path):
    root = store_of(tmp_path)
    run_id = "20261203-095000-0bad"
    directory = embedded_run(root, run_id, {"gx08": b"as verified"})
    (directory / "gx08" / "gx08-1.nsys-rep").write_bytes(b"as changed!")  # same size, other bytes
    r = push(site, "bob", root, run_id)
    assert r.returncode == 1 and "no longer the report the store verified" in r.stderr
    assert site.psql(f"SELECT count(*) FROM fleet.runs WHERE run_id = '{run_id}'", role="bob").stdout.strip() == "0"
    assert keys_under(site, f"{PREFIX}/bob/lab/{run_id}/") == []
