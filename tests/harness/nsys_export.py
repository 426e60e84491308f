"""Synthetic nsys exports of a multi-rank run with a planted cause, in nsys's own schema.

The schema is nsys's (tests/fixtures/ranks-h200/schema.sql: the tables fleet reads, as nsys
2025.3 documents them; fleet's reader ran on real exports of an H200 test machine, see that
folder's README), and the GEMM's name is one nsys recorded there. Only the rows are made here,
by playing a planted scenario out in time: each step every rank runs its kernels (after a CPU
gap, if planted), then enters a blocking collective that every rank leaves when the last one
has arrived. Each rank writes its times on its own clock (``skew_ns``), with its own session
start, as unsynchronized nodes would.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SCHEMA = FIXTURES / "ranks-h200" / "schema.sql"     # the CREATE statements of the tables fleet reads
KERNELS = FIXTURES / "nsys-2025.3-h200" / "with-nvtx_cuda_gpu_kern_sum.csv"  # nsys stats on an H200
PUSH_POP, MARK = 59, 34                   # NVTX_EVENTS.eventType of a pushed/popped range, of a mark
EXCHANGE_NS = 40_000                      # what the collective itself takes once all have arrived
BLOCKING = "pthread_cond_wait"  # where gloo's all-reduce blocked the main thread (OSRT_API, on the H200)
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


def recorded_schema() -> dict[str, str]:
    """Table name -> its CREATE statement."""
    statements = [s.strip() for s in SCHEMA.read_text().split(";\n") if s.strip()]
    return {s.split()[2]: s.rstrip(";") for s in statements}


def recorded_names() -> tuple[str, str]:
    """The GEMM kernel nsys recorded most of on an H200, and an NCCL kernel's name."""
    import csv

    with open(KERNELS, newline="") as f:
        return next(csv.DictReader(f))["Name"], NCCL


@dataclass
class Plant:
    """One rank's part: its kernels each step, how long each takes, a CPU gap before them."""
    kernels: int = 20
    kernel_ns: int = 2_660_000
    gap_ns: int = 0
    gpu: int = 0                          # its GPU (ranks with the same one share it)
    skew_ns: int = 0                      # its clock's offset from true time
    pid: int = 0


@dataclass
class Scenario:
    plants: list[Plant]
    steps: int = 12
    sync: str = "nvtx"                    # nvtx (a range "sync" around the wait) | nccl (NCCL kernels)
                                          # | osrt (a blocking pthread_cond_wait on the main thread)
    epoch_ns: int = 1_764_000_000_000_000_000
    jitter: list[int] = field(default_factory=list)

    def play(self) -> list[dict]:
        """Each rank's events in true time: kernels, steps, waits."""
        now = [1_000_000_000] * len(self.plants)
        ranks = [{"kernels": [], "steps": [], "syncs": []} for _ in self.plants]
        for step in range(self.steps):
            arrive, starts = [], list(now)
            for r, p in enumerate(self.plants):
                t = now[r] + p.gap_ns
                for _ in range(p.kernels):
                    ranks[r]["kernels"].append((t, t + p.kernel_ns))
                    t += p.kernel_ns + 3_000
                t += 20_000 + (self.jitter[(step + r) % len(self.jitter)] if self.jitter else 0)
                arrive.append(t)
            leave = max(arrive) + EXCHANGE_NS
            for r in range(len(self.plants)):
                ranks[r]["syncs"].append((arrive[r], leave))
                ranks[r]["steps"].append((starts[r], leave))
                now[r] = leave + 10_000
        return ranks


def write(path: Path, scenario: Scenario, ranks: int | list[int], schema: dict[str, str], names: tuple[str, str],
          gpu_uuids: list[str], mark_rank: bool = True, launcher: int | None = None) -> Path:
    """Rank ``ranks`` of the scenario as one export at ``path``, in the recorded schema: one rank
    (one nsys a rank, as on Slurm) or several (one nsys over a launcher, ``launcher`` its pid)."""
    played = scenario.play()
    path.unlink(missing_ok=True)
    with sqlite3.connect(path) as db:
        for sql in schema.values():
            db.execute(sql)
        put = lambda table, rows: insert(db, table, rows)  # noqa: E731
        put("StringIds", [{"id": 1, "value": names[0]}, {"id": 2, "value": names[1]},
                          {"id": 3, "value": BLOCKING}])
        first = scenario.plants[ranks if isinstance(ranks, int) else ranks[0]]
        put("TARGET_INFO_SESSION_START_TIME", [{"utcEpochNs": scenario.epoch_ns + first.skew_ns}])
        gpus = sorted({scenario.plants[r].gpu for r in ([ranks] if isinstance(ranks, int) else ranks)})
        put("TARGET_INFO_GPU", [{"vmId": 0, "id": i, "name": "NVIDIA H200", "busLocation": f"0000:{0x18 + g:02x}:00.0",
                                 "uuid": gpu_uuids[g]} for i, g in enumerate(gpus)])
        if launcher is not None:  # it waits for its workers, as torchrun did on the H200: one blocking call
            put("PROCESSES", [{"globalPid": launcher << 24, "pid": launcher, "name": "torchrun"}])
            put("OSRT_API", [{"start": 1_000, "end": 2_000_000_000, "eventClass": 27, "nameId": 3,
                              "globalTid": (launcher << 24) | launcher, "returnValue": 0}])
        for rank in [ranks] if isinstance(ranks, int) else ranks:
            _rank_rows(put, scenario.plants[rank], played[rank], rank, scenario.sync, gpus, mark_rank)
    return path


def _rank_rows(put, p: Plant, events: dict, rank: int, sync: str, gpus: list[int], mark_rank: bool) -> None:
    pid = p.pid or 4000 + rank
    gpid, gtid = pid << 24, (pid << 24) | pid
    shift = lambda t: t + p.skew_ns  # noqa: E731: its own clock
    put("PROCESSES", [{"globalPid": gpid, "pid": pid, "name": "python3"}])
    kernel = lambda s, e, name: {"start": shift(s), "end": shift(e), "deviceId": gpus.index(p.gpu),  # noqa: E731
                                 "contextId": 1, "streamId": 7, "globalPid": gpid, "demangledName": name,
                                 "shortName": name}
    put("CUPTI_ACTIVITY_KIND_KERNEL", [kernel(s, e, 1) for s, e in events["kernels"]])
    nvtx = lambda s, e, kind, text: {"start": shift(s), "end": None if e is None else shift(e),  # noqa: E731
                                     "eventType": kind, "text": text, "globalTid": gtid}
    if mark_rank:
        put("NVTX_EVENTS", [nvtx(events["kernels"][0][0] - 1000, None, MARK, f"rank {rank}")])
    put("NVTX_EVENTS", [nvtx(s, e, PUSH_POP, "step") for s, e in events["steps"]])
    if sync == "nvtx":
        put("NVTX_EVENTS", [nvtx(s, e, PUSH_POP, "sync") for s, e in events["syncs"]])
    elif sync == "osrt":  # gloo's all-reduce as the OS runtime trace sees it: the main thread blocked
        put("OSRT_API", [{"start": shift(s), "end": shift(e), "eventClass": 27, "nameId": 3, "globalTid": gtid,
                          "returnValue": 0} for s, e in events["syncs"]])
    else:
        put("CUPTI_ACTIVITY_KIND_KERNEL", [kernel(s, e, 2) for s, e in events["syncs"]])


def insert(db: sqlite3.Connection, table: str, rows: list[dict]) -> None:
    """Rows into one of nsys's tables; a NOT NULL column a row does not set gets 0."""
    required = [c[1] for c in db.execute(f"PRAGMA table_info('{table}')") if c[3] and c[4] is None]
    for row in rows:
        full = {**{c: 0 for c in required}, **row}
        db.execute(f"INSERT INTO {table} ({', '.join(full)}) VALUES ({', '.join('?' * len(full))})",
                   tuple(full.values()))
