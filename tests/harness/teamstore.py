"""A team store site as docs/team-store.md sets one up: PostgreSQL and SeaweedFS started, the
admin's SQL and the identities file taken from that document (so the document is what is tested),
``fleet team migrate`` run as the schema's owner, and people (alice, bob, ...) each with their own
PostgreSQL role, ``.pgpass`` and S3 credentials file: what :meth:`TeamSite.env` gives a fleet
command is exactly what a person would have."""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.harness.teamservers import OWNER, PASSWORD, Postgres, SeaweedFS

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "team-store.md"
BUCKET, PREFIX, REGION = "fleet-reports", "team", "us-east-1"


def doc_blocks(kind: str) -> list[str]:
    """The fenced blocks of docs/team-store.md marked ``<!-- team-store: KIND -->`` just above them."""
    text = DOC.read_text()
    return [m.group(1) for m in re.finditer(r"<!-- team-store: " + re.escape(kind) + r" -->\n```[a-z]*\n(.*?)```",
                                            text, re.S)]


def fill(text: str, values: dict[str, str]) -> str:
    """The document's placeholders (ALICE_SECRET, READER_KEY, ...) replaced by this site's values."""
    for name, value in values.items():
        text = text.replace(name, value)
    return text


class TeamSite:
    def __init__(self, people=("alice", "bob"), groups: dict[str, list[str]] | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="fleet-team-"))
        os.chmod(self.dir, 0o711)
        self.people, self.groups = list(people), groups or {"ml": list(people)}
        self.keys = {p: (f"{p}-key-{secrets.token_hex(4)}", secrets.token_hex(16)) for p in [*people, "reader", "admin"]}
        self.pg_passwords = {p: secrets.token_hex(12) for p in [*people, "fleet_owner"]}
        self.pg = Postgres()
        self.s3: SeaweedFS | None = None

    # --- the servers, as the document sets them up -------------------------------------------
    def values(self) -> dict[str, str]:
        v = {"BUCKET_NAME": BUCKET, "KEY_PREFIX": PREFIX, "OWNER_PASSWORD": self.pg_passwords["fleet_owner"],
             "READER_KEY": self.keys["reader"][0], "READER_SECRET": self.keys["reader"][1],
             "ADMIN_KEY": self.keys["admin"][0], "ADMIN_SECRET": self.keys["admin"][1]}
        if self.s3 is not None:
            v["S3_ENDPOINT"] = self.s3.endpoint
        for p in self.people:
            v[f"{p.upper()}_KEY"], v[f"{p.upper()}_SECRET"] = self.keys[p]
            v[f"{p.upper()}_PASSWORD"] = self.pg_passwords[p]
        return v

    def identities(self) -> str:
        raw = json.loads(doc_blocks("identities")[0])
        template = json.dumps(next(i for i in raw["identities"] if i["name"] == "alice"))
        for person in self.people:  # the document's alice, once per person of this site
            if person != "alice":
                raw["identities"].append(json.loads(template.replace("alice", person).replace("ALICE", person.upper())))
        return fill(json.dumps(raw), self.values())

    def start(self) -> "TeamSite":
        self.pg.start()
        self.s3 = SeaweedFS(self.identities())
        self.s3.start()
        self.admin_sql(fill(doc_blocks("roles")[0], self.values()), database="postgres")
        self.owner_env = self._person_env("fleet_owner")
        r = self.fleet("team", "migrate", env=self.owner_env)
        assert r.returncode == 0, r.stderr
        self.psql(fill(doc_blocks("signer")[0], self.values()), role="fleet_owner", env=self.owner_env)
        for person in self.people:
            self.add_person(person)
        self.make_bucket()
        return self

    def make_bucket(self) -> None:
        import boto3

        s3 = boto3.client("s3", endpoint_url=self.s3.endpoint, region_name=REGION,
                          aws_access_key_id=self.keys["admin"][0], aws_secret_access_key=self.keys["admin"][1])
        s3.create_bucket(Bucket=BUCKET)

    def add_person(self, person: str) -> None:
        groups = [g for g, members in self.groups.items() if person in members]
        block = doc_blocks("person")[0].replace("alice", person).replace("ALICE", person.upper())
        sql = fill(block, self.values())
        for g in groups:
            self.admin_sql(f"DO $$ BEGIN CREATE ROLE {g} NOLOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;")
        sql = sql.replace("GRANT ml TO", "GRANT " + ", ".join(groups) + " TO") if groups else re.sub(
            r"GRANT ml TO [^;]+;", "", sql)
        self.admin_sql(sql)
        self.envs = getattr(self, "envs", {})
        self.envs[person] = self._person_env(person)

    def _person_env(self, person: str) -> dict[str, str]:
        """What a person's shell holds: their .pgpass, their S3 credentials file, the two settings."""
        home = self.dir / person
        home.mkdir(exist_ok=True)
        pgpass = home / "pgpass"
        pgpass.write_text(f"127.0.0.1:{self.pg.port}:*:{person}:{self.pg_passwords[person]}\n")
        os.chmod(pgpass, 0o600)
        env = {"PGPASSFILE": str(pgpass), "FLEET_CATALOG": self.pg.url(person),
               "FLEET_OBJECTS": f"s3://{BUCKET}/{PREFIX}", "AWS_ENDPOINT_URL": self.s3.endpoint,
               "AWS_DEFAULT_REGION": REGION, "AWS_CONFIG_FILE": str(home / "aws-config")}
        if person in self.keys:
            creds = home / "aws-credentials"
            creds.write_text(f"[default]\naws_access_key_id = {self.keys[person][0]}\n"
                             f"aws_secret_access_key = {self.keys[person][1]}\n")
            os.chmod(creds, 0o600)
            env["AWS_SHARED_CREDENTIALS_FILE"] = str(creds)
        return env

    # --- using it -------------------------------------------------------------------------
    def admin_sql(self, sql: str, database: str = "fleet") -> str:
        return self.pg.psql(sql, database=database).stdout

    def psql(self, sql: str, *, role: str, env: dict | None = None, check: bool = True):
        return self.pg.psql(sql, role=role, env=env if env is not None else self.envs[role], check=check)

    def env(self, person: str, store: Path | None = None) -> dict[str, str]:
        env = dict(self.envs[person])
        if store is not None:
            env["FLEET_STORE"] = str(store)
        return env

    def fleet(self, *args: str, env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "AWS_", "PG"))}
        full.update(env)
        return subprocess.run([sys.executable, "-m", "fleet", *args], env=full, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)

    def s3_as(self, person: str):
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.s3.endpoint, region_name=REGION,
                            aws_access_key_id=self.keys[person][0], aws_secret_access_key=self.keys[person][1],
                            config=Config(s3={"addressing_style": "path"}))

    def stop(self) -> None:
        if self.s3 is not None:
            self.s3.destroy()
        self.pg.destroy()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def embedded_run(root: Path, run_id: str, files: dict[str, bytes], *, kernel_ns: int | None = None,
                 status: str = "complete", metric: tuple[str, float] | None = None) -> Path:
    """A finished run in an embedded store as fleet files it: one host per file, each file verified
    with its real sha256 (and a kernel summary when ``kernel_ns`` is given). Its folder back."""
    import hashlib

    day = f"{run_id[0:4]}-{run_id[4:6]}-{run_id[6:8]}"
    directory = root / "lab" / day / run_id
    hosts = []
    for host, data in files.items():
        (directory / host).mkdir(parents=True, mode=0o700)
        reports = []
        path = directory / host / f"{host}-1.nsys-rep"
        path.write_bytes(data)
        reports.append({"remote": f"/var/tmp/fleet/{run_id}/{path.name}", "stored": str(path), "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest(), "status": "complete", "verified": True})
        if kernel_ns is not None:
            csv = directory / host / f"{host}-1_cuda_gpu_kern_sum.csv"
            csv.write_text(f"Time (%),Total Time (ns),Instances,Name\n100.0,{kernel_ns},3,gemm_kernel\n")
            reports.append({"remote": f"/var/tmp/fleet/{run_id}/{csv.name}", "stored": str(csv),
                            "size": csv.stat().st_size, "sha256": hashlib.sha256(csv.read_bytes()).hexdigest(),
                            "status": "summary", "verified": True, "summary": "cuda_gpu_kern_sum"})
        hosts.append({"host": host, "status": "ok", "gpu": "NVIDIA H200", "driver": "580.159.04",
                      "tool_version": "2025.3.1", "reports": reports})
    doc = {"schema": 2, "run_id": run_id, "site": "lab", "day": day, "started": f"{day}T02:00:00+0000",
           "user": "ana", "request": {"tool": "nsys", "command": ["python3", "bench.py"]}, "status": status,
           "hosts": hosts}
    for folder in (root, root / "lab", root / "lab" / day, directory):
        folder.mkdir(mode=0o700, exist_ok=True)
        folder.chmod(0o700)
    if metric is not None:  # a nightly run: its playbook's one metric, as fleet run records it
        doc["playbook"] = {"name": metric[0], "metrics": [{"metric": "total GPU kernel time",
                                                           "device": "NVIDIA H200 on gx01", "value": metric[1],
                                                           "flags": []}]}
    (directory / "manifest.json").write_text(json.dumps(doc))
    return directory
