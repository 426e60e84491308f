"""What a job's Slurm state means for the run (fleet/slurm/states.py) and the prolog's verdict
per GPU (fleet/policy/): pure rules, checked on the words Slurm uses (its job reason codes and
job states, as squeue and scontrol print them)."""

from __future__ import annotations

import pytest

from fleet import policy
from fleet.slurm.states import job_end_verdict, job_refusal, never_starts
from fleet.store.manifest import HostEntry


@pytest.mark.parametrize("reason", [
    "AccountNotAllowed", "PartitionTimeLimit", "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit",
    "QOSMaxCpuPerJobLimit", "AssocMaxNodePerJobLimit", "QOSMaxGRESPerNode", "QOSMinCpuNotSatisfied",
    "InvalidAccount", "InvalidQOS", "QOSNotAllowed", "BadConstraints", "DependencyNeverSatisfied",
    "ReservationDeleted", "JobHoldMaxRequeue", "JobHeldAdmin", "launch failed requeued held", "MaxMemPerLimit",
    "ReqNodeNotAvail, UnavailableNodes:"])
def test_reasons_slurm_never_clears_end_the_wait(reason):
    assert never_starts(reason)


@pytest.mark.parametrize("reason", [
    None, "None", "Priority", "Resources", "BeginTime", "Dependency", "JobHeldUser", "AssocGrpCpuLimit",
    "QOSGrpGRES", "MaxCpuPerAccount", "QOSMaxJobsPerUserLimit", "AssocMaxJobsLimit", "AssocMaxSubmitJobLimit",
    "ReqNodeNotAvail", "ReqNodeNotAvail, UnavailableNodes:node3", "PartitionDown", "NodeDown", "Reservation",
    "Licenses", "Prolog", "Cleaning"])
def test_reasons_that_clear_keep_the_wait(reason):
    assert never_starts(reason) is None


def rank(rank: int, result: dict | None, status: str = "ok") -> HostEntry:
    return HostEntry("node1", status, rank=rank, result=result)


def test_a_node_failure_fails_the_ranks_it_stopped_and_keeps_those_that_had_finished():
    stopped = rank(0, {"status": "ok", "stopped": True})
    finished = rank(1, {"status": "ok", "stopped": False, "workload": {"exit_status": 0, "signal": None}})
    killed = rank(2, {"status": "ok", "workload": {"exit_status": 143, "signal": None}})
    missing = HostEntry("(no result)", "missing", rank=3)
    end = job_end_verdict("NODE_FAIL", [stopped, finished, killed, missing])
    assert [h.status for h in end.hosts] == ["failed", "ok", "failed", "missing"]
    assert "killed by the job's end: NODE_FAIL" in end.hosts[0].missing_why
    assert end.note == "job ended NODE_FAIL: a node of the job failed"
    assert stopped.status == "ok"  # pure: the entries it was given are unchanged


@pytest.mark.parametrize("state", ["PREEMPTED", "OUT_OF_MEMORY", "BOOT_FAIL", "TIMEOUT", "DEADLINE"])
def test_every_killing_end_state_is_said_and_fails_a_stopped_rank(state):
    end = job_end_verdict(state, [rank(0, {"status": "ok", "stopped": True})])
    assert end.hosts[0].status == "failed" and end.note.startswith(f"job ended {state}: ")


def test_at_timeout_a_rank_fleet_stopped_ahead_of_the_limit_stays_ok_and_completed_changes_nothing():
    ahead = job_end_verdict("TIMEOUT", [rank(0, {"status": "ok", "stopped": True})], stopped_before_time_limit=True)
    assert ahead.hosts[0].status == "ok"
    done = job_end_verdict("COMPLETED", [rank(0, {"status": "ok", "stopped": True})])
    assert done.hosts[0].status == "ok" and done.note is None


def test_a_requeue_is_said():
    end = job_end_verdict("COMPLETED", [rank(0, {"status": "ok"})], requeues=1)
    assert end.note == "Slurm requeued the job 1 time(s): what was gathered is from its last start"
    assert end.hosts[0].status == "ok"


def test_the_prologs_verdict_narrows_to_the_ranks_own_gpus_by_uuid():
    document = {"job": "7", "nvml": True, "tenants": ["GPU 1: pid 9 (bob) belongs to another user"],
                "by_gpu": {"GPU-a": [], "GPU-b": ["GPU 1: pid 9 (bob) belongs to another user"]}}
    verdict = policy.PrologVerdict.read(document)
    assert policy.prolog_tenants(verdict, "7", ["GPU-a"]) == []
    assert policy.prolog_tenants(verdict, "7", ["GPU-b"]) == ["GPU 1: pid 9 (bob) belongs to another user"]
    assert policy.prolog_tenants(verdict, "7") == document["tenants"]  # the rank's GPUs unknown: the whole job's
    [unnamed] = policy.prolog_tenants(verdict, "7", ["GPU-c"])  # a GPU the prolog did not look at
    assert "says nothing of GPU GPU-c" in unnamed
    older = {k: v for k, v in document.items() if k != "by_gpu"}  # a prolog from before: job-wide
    assert policy.prolog_tenants(policy.PrologVerdict.read(older), "7", ["GPU-a"]) == document["tenants"]


def test_the_user_guides_table_of_states_and_reasons_says_what_fleet_does():
    import re
    from pathlib import Path

    from fleet.slurm.states import KILLING
    guide = (Path(__file__).parent.parent / "docs" / "user-guide.md").read_text()
    rows = [line for line in guide.splitlines() if line.startswith("| `")]

    def row(start: str) -> tuple[list[str], str]:
        [found] = [r for r in rows if r.startswith(start)]
        said, does = found.split(" | ", 1)
        return [c for c in re.findall(r"`([^`]+)`", said) if "*" not in c and "..." not in c], does

    never, does = row("| `PENDING` for a reason Slurm never clears")
    assert "cancels the job" in does and len(never) > 10
    for code in never[1:]:
        assert never_starts(code if code != "ReqNodeNotAvail" else "ReqNodeNotAvail, UnavailableNodes:"), code
    clears, does = row("| `PENDING` for a reason Slurm clears")
    assert does.startswith("waits") and len(clears) > 4
    for code in clears[1:]:
        assert never_starts(code) is None, code
    killing, does = row("| `NODE_FAIL`")
    assert set(killing) | {"TIMEOUT"} == set(KILLING) and "`failed`" in does
    assert row("| `TIMEOUT`")[0] == ["TIMEOUT"]


def test_a_refusal_is_the_job_scripts_only_with_its_mark_whatever_the_status_and_the_last_line():
    log = "starting\nfleet: nsys is not on PATH on node1: put nsys's folder on the job's PATH\n"
    assert job_refusal(127, log, True) == "nsys is not on PATH on node1: put nsys's folder on the job's PATH"
    # a program (a Ray driver runs in the batch shell) that says `fleet: ...` and ends with 127 is not one
    assert job_refusal(127, log, False) is None
    assert job_refusal(1, log, True) is None
    assert "refused to start" in job_refusal(127, "bash: no such file\n", True)


# The end of a job's slurm-N.out where every srun failed: MpiDefault=pmix on nodes without PMIx, as
# Slurm 22.05's srun says it, after a line of the program's own.
PMIX_LOG = """starting the workload
srun: error: Couldn't find the specified plugin name for mpi/pmix looking at all files
srun: error: cannot find mpi plugin for mpi/pmix
srun: error: MPI: Cannot create context for mpi/pmix
"""


def test_a_missing_rank_quotes_sruns_own_error_line_from_the_jobs_log_bounded_and_printable():
    """fleet said `missing ... see slurm-37.out` and never quoted srun's line, which says why."""
    from fleet.slurm.states import srun_said, why_missing

    assert srun_said(PMIX_LOG) == "srun: error: Couldn't find the specified plugin name for mpi/pmix looking at all files"
    why = why_missing(2, "FAILED", "slurm-37.out", None, PMIX_LOG)
    assert why == ("rank 2 left no result (job FAILED; see slurm-37.out): srun said: srun: error: Couldn't find the "
                   "specified plugin name for mpi/pmix looking at all files")
    assert why_missing(2, "FAILED", "slurm-37.out", None, "all went well\n") == \
        "rank 2 left no result (job FAILED; see slurm-37.out)"
    hostile = srun_said("srun: error: \x1b]0;owned\x07" + "x" * 5000 + "\n")  # the job writes its own log
    assert "\x1b" not in hostile and "\x07" not in hostile and len(hostile) <= 300
    assert why_missing(0, "CANCELLED", "slurm-9.out", None, PMIX_LOG).startswith(
        "rank 0 left no result: the job was cancelled before it finished (slurm-9.out)")


@pytest.mark.parametrize("gres, gpu_less", [
    (("(null)",), True), (("(null)", "(null)"), True), (("nic:1",), True),
    (("gpu:2",), False), (("(null)", "gpu:h100:4(S:0-1)"), False), (("nic:1,gpu:a100:8",), False),
    ((), False),  # sinfo said nothing (slurmctld silent, no such partition): unknown, sbatch decides
])
def test_ncu_on_a_partition_whose_nodes_have_no_gpu_gres_is_refused_before_submission(gres, gpu_less):
    """`--tool ncu` on a GPU-less partition was refused only once the job had started."""
    from fleet import exitcodes
    from fleet.slurm.states import no_gpus

    why = no_gpus("cpu", gres, "--tool ncu")
    assert (why is not None) == gpu_less
    if gpu_less:
        assert why.startswith("--tool ncu on partition cpu: its nodes have no GPU (sinfo's GRES: ") and \
            "nothing was submitted" in why
    from fleet.slurm.jobs import NoGPUs
    assert NoGPUs.exit_status == exitcodes.REFUSED


def four_ranks_killed_by_fleets_sigterm(raced: int = 0) -> list[dict]:
    """Four ranks' results after fleet's SIGTERM reached every process of the job: each workload
    died by it; rank ``raced``'s agent saw its profiler end before its own signal, so its result
    lacks the record that fleet stopped it (as on the test cluster, some of the time)."""
    out = []
    for rank in range(4):
        out.append({"status": "ok", "rank": rank, "slurm_node": f"node{rank // 2 + 1}", "exit_status": 143,
                    "stopped": rank != raced, "workload": {"exit_status": None, "signal": "SIGTERM"},
                    "whose": {"user": "alice", "rank": rank},
                    "reports": [{"path": f"/r/rank{rank}.nsys-rep", "size": 10, "sha256": "0" * 64}]})
    return out


@pytest.mark.parametrize("state", ["CANCELLED", "TIMEOUT"])
def test_a_rank_stopped_by_fleet_has_the_verdict_of_the_others_whatever_its_agent_saw_first(state):
    """fleet's stop is recorded in the run folder before its signal is sent (the USR1 trap's
    job.stopped, fleet cancel's and Ctrl-C's job.stop-asked): a workload that died by that SIGTERM
    is fleet's stop, not the workload failing. Before, rank 0 read workload-failed, the others ok."""
    from fleet.slurm.run import rank_entry
    from fleet.store.manifest import ReportEntry

    def entries(fleet_stopped):
        return [rank_entry(res, [ReportEntry(remote=res["reports"][0]["path"], stored="/s/x", size=10,
                                             status="complete", verified=True)], "nsys", fleet_stopped=fleet_stopped)
                for res in four_ranks_killed_by_fleets_sigterm()]

    ranks = entries(True)
    assert [e.status for e in ranks] == ["ok"] * 4, [(e.status, e.missing_why) for e in ranks]
    end = job_end_verdict(state, ranks, stopped_before_time_limit=True, stopped_by_fleet=True)
    assert [e.status for e in end.hosts] == ["ok"] * 4
    assert entries(False)[0].status == "workload-failed"  # without fleet's record, SIGTERM is the workload's end
