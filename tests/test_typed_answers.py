"""A node's answers are read once, into types: the policy, the five doors and the readers of the
live look and of ``fleet repair`` read fields, never a node's dict. Only the readers themselves
(fleet/agent/wire.py, fleet/agent/messages.py, fleet/policy/nodestate.py, fleet/policy/readers.py)
look into one. What fleet reads back from a file, a job or a user is held the same way: a module
reads it once, by its reader, and then reads its fields; and so is what the node is sent, a plan's
parts and a call's arguments (fleet/planparts.py, RunArgs, ProbeArgs)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from fleet import agentcall, policy
from fleet.agent import messages, wire
from fleet.inventory import Host
from fleet.look import HostView, take
from fleet.transport import Result
from tests.conftest import REPO
from tests.harness.node_states import document

# What reads a node's state or answer after its reader: each may call .get( only on a mapping of
# fleet's own (the inventory's host variables, the request's owned sysctls, the run watch's floor).
READ_BY_FIELDS = ["fleet/policy/neighbours.py", "fleet/policy/permissions.py", "fleet/policy/verdicts.py",
                  "fleet/placement/__init__.py", "fleet/placement/free.py", "fleet/wrapping/__init__.py",
                  "fleet/collection/__init__.py", "fleet/collection/bring.py", "fleet/collection/fetch.py",
                  "fleet/lab/doctor.py", "fleet/look.py", "fleet/cli/top.py", "fleet/slurm/results.py",
                  "fleet/slurm/look.py", "fleet/agentcall.py"]
HOST = Host("h01", {}, (), "test")
FLEETS_OWN = {"request.owned_sysctls", "floor", "host.vars", "r.extra", "obj.inventory.hosts"}


def gets(source: str) -> list[str]:
    """The receiver of every ``X.get(...)`` call in ``source``, as written."""
    return [ast.unparse(n.func.value) for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"]


def test_what_reads_a_nodes_answer_reads_fields_not_its_dict():
    found = {path: [g for g in gets((REPO / path).read_text()) if g not in FLEETS_OWN] for path in READ_BY_FIELDS}
    assert {path: receivers for path, receivers in found.items() if receivers} == {}


def test_the_check_finds_a_get_on_a_nodes_dict():
    """It would pass on nothing: a planted read of the state's dict is found, an inventory's is not."""
    planted = "def f(state, host):\n    return state.get('gpus'), host.vars.get('x')\n"
    assert [g for g in gets(planted) if g not in FLEETS_OWN] == ["state"]
    assert all((REPO / path).exists() for path in READ_BY_FIELDS)


def test_the_controller_reads_a_probe_into_a_node_state_and_keeps_its_document():
    body = document(gpus__0__processes=[{"pid": 7, "user": "bob", "foreign": True, "kinds": ["compute"]}])
    r = agentcall.read_state(HOST, Result("h01", exit_status=0, stdout=wire.frame("probe", body).encode()))
    state = r.extra["state"]
    assert isinstance(state, policy.NodeState) and not hasattr(state, "get")
    assert state.gpus[0].processes[0] == policy.GpuProcess(7, ("compute",), user="bob", foreign=True)
    assert agentcall.probed_document(r) == json.loads(json.dumps(body))


def test_a_process_whose_owner_is_not_said_is_someone_elses():
    """When unsure whether a GPU is shared, it is: a process the node did not mark as the user's own
    (no ``foreign``, or not a bool) is a tenant to the policy and to the look."""
    for said in ({}, {"foreign": None}, {"foreign": "no"}):
        state = policy.NodeState.read(document(gpus__0__processes=[{"pid": 7, **said}]))
        assert [t.pid for t in policy.tenants(state, policy.Request())] == [7]
        assert messages.LookProcess.read({"pid": 7, **said}).foreign is True


def test_a_section_that_failed_on_the_node_reads_as_absent_with_its_error():
    state = policy.NodeState.read(document(report_dir={"error": "OSError: gone"}, tools={"error": "Timeout"}))
    assert state.report_dir is None and state.tools == policy.Tools()
    assert state.section_error("report_dir") == "OSError: gone" and state.section_error("tools") == "Timeout"
    assert policy.tool_found(state, "nsys") is None


def test_repairs_answer_is_read_into_types():
    said = {"value": {"restored": {"kernel.perf_event_paranoid": "4"}, "dcgm_resumed": True, "held": {}}}
    r = agentcall.read_repair(HOST, Result("h01", exit_status=0, stdout=wire.frame("repair", said).encode()))
    assert r.extra["repair"] == messages.Repaired({"kernel.perf_event_paranoid": "4"}, True, {})
    assert r.extra["repair"].to_json() == said["value"]
    refused = agentcall.read_repair(HOST, Result("h01", exit_status=0, stdout=wire.frame(
        "repair", {"value": {"restored": ["not", "a", "mapping"]}}).encode()))
    assert refused.error and "no repair result" in refused.error and "repair" not in refused.extra


def test_a_look_sample_is_judged_from_types():
    state = document(gpus__0__uuid="GPU-a", gpus__0__name="H200")
    gpu = {"index": 0, "processes": [{"pid": 9, "user": "bob", "foreign": True, "command": "python train.py"}],
           "process_list_error": None, "memory_used_by_processes": 2 << 30, "sampled_pids": [],
           "memory_total": 80 << 30, "memory_used": 3 << 30,
           "activity": {"source": "utilization", "utilization": 40, "why": "GPM not supported"},
           "conditions": {"sm_clock_mhz": 1980, "throttle": ["gpu_idle"]}}
    seen = []
    view = HostView("h01")
    take(view, {"host": "n1", "seq": 0, "time": 1.5, "gpus": [gpu], "state": state}, seen.append)
    [g] = view.gpus
    assert (g.name, g.uuid, g.ncu, g.free) == ("H200", "GPU-a", "refused", False)
    assert g.processes == [messages.LookProcess(9, "bob", command="python train.py")]
    assert g.activity.utilization == 40 and g.conditions.throttle == ("gpu_idle",)
    assert g.to_json()["conditions"] == {"sm_clock_mhz": 1980, "throttle": ["gpu_idle"]}
    assert any("pid 9 (bob" in reason for reason in g.ncu_reasons)


# --- what a manifest keeps of a run's request and plans is read once too (.asked, .planned) ---

# Asked.read; the check on reading; JobShape.read
REQUEST_READERS = {"fleet/store/records.py", "fleet/store/manifest_io.py", "fleet/slurm/jobstate.py"}


def reads_of_a_kept_dict(source: str) -> list[str]:
    """Every ``.get(`` on a manifest's request, a host's plan, a Slurm run's job shape or what a
    playbook's run kept (``m.request``, ``entry.plan``, ``manifest.request or {}``, ``slurm.spec``,
    ``m.playbook``) outside the agent: a look into the stored dict."""
    return [g for g in gets(source) if g in ("request", "plan_doc", "spec")
            or g.endswith((".request", ".plan", ".spec", ".playbook", "request or {}", "plan or {}",
                           "playbook or {}"))]


def test_the_request_and_plans_a_manifest_keeps_are_read_through_their_types_alone():
    found = {str(p.relative_to(REPO)): reads_of_a_kept_dict(p.read_text()) for p in sorted((REPO / "fleet").rglob("*.py"))
             if "agent" not in p.parts and str(p.relative_to(REPO)) not in REQUEST_READERS}
    assert {path: reads for path, reads in found.items() if reads} == {}


def test_the_kept_dict_check_finds_a_look_into_one():
    planted = ("def f(m, manifest, entry):\n"
               "    return m.request.get('tool'), (manifest.request or {}).get('x'), m.asked.tool, "
               "entry.plan.get('ranks'), entry.planned.ranks, slurm.spec.get('launcher'), "
               "(m.playbook or {}).get('metrics')\n")
    assert reads_of_a_kept_dict(planted) == ["m.request", "manifest.request or {}", "entry.plan", "slurm.spec",
                                             "m.playbook or {}"]
    assert all((REPO / path).exists() for path in REQUEST_READERS)


def test_a_plan_the_store_kept_reads_as_a_plan_or_as_none():
    from fleet.store.manifest import HostEntry

    kept = HostEntry("h01", plan={"host": "h01", "status": "ok", "ranks": 4, "output": "/r/h01",
                                  "command": {"launcher": ["mpirun", "-np", "4"]}})
    assert (kept.planned.ranks, kept.planned.output, kept.planned.command.launcher) == \
        (4, "/r/h01", ("mpirun", "-np", "4"))
    assert kept.planned is kept.planned  # read once for the document the entry holds ...
    kept.plan = {"host": "h01", "status": "refused"}
    assert kept.planned.status == "refused"  # ... and again for another one
    assert HostEntry("rank0").planned is None  # a Slurm rank keeps no plan
    assert HostEntry("h02", plan={"host": "h02", "status": "ok", "no_such_field": 1}).planned.status == "ok"
    partial = HostEntry("h04", plan={"ranks": 2}).planned  # a plan missing what every plan has
    assert (partial.host, partial.status, partial.ranks) == ("h04", "", 2)
    assert HostEntry("h03", plan={"host": "h03", "status": "ok", "tenants": [{"bad": 1}]}).planned is None


def test_asked_reads_a_request_as_fleet_writes_it_and_anything_else_as_absent():
    from fleet.plan import ProfileRequest
    from fleet.store.manifest import RunManifest
    from fleet.store.records import Asked

    from fleet.request import LabPart

    req = ProfileRequest(tool="nsys", command=("python", "train.py"), run_id="20261207-000000-ab12",
                         lab=LabPart(gpus=(1, 3), launcher="mpirun", ranks=4))
    fresh = RunManifest.begin(req, "lab")  # the request's tuples, as a run made here keeps them
    read_back = RunManifest.from_json(json.loads(json.dumps(fresh.to_json())))  # JSON's lists
    for asked in (fresh.asked, read_back.asked):
        assert asked == Asked("nsys", ("python", "train.py"), (1, 3), "mpirun", 4, ())
        assert asked.said() == "nsys -- python train.py" and asked.command_json() == '["python", "train.py"]'
    odd = Asked.read({"tool": 3, "command": "rm -rf /", "gpus": ["0", 1, True], "ranks": "2"})
    assert odd == Asked(None, None, (1,), None, None, ())
    assert odd.command_json() == "null" and odd.said() == "None -- "


def test_a_slurm_runs_kept_job_shape_reads_as_the_ranks_it_expects():
    from fleet.slurm.jobstate import JobShape
    from fleet.slurm.run import expected_ranks

    assert expected_ranks(JobShape.read({"launcher": "srun", "ntasks": 3})) == [0, 1, 2]
    assert expected_ranks(JobShape.read({"nodes": 2, "ntasks_per_node": 2})) == [0, 1, 2, 3]
    assert expected_ranks(JobShape.read({"launcher": "srun", "ranks": (3, 1)})) == [1, 3]  # as made here
    assert expected_ranks(JobShape.read({"launcher": "srun", "ranks": [3, 1]})) == [1, 3]  # as read back
    assert expected_ranks(JobShape.read({"launcher": "ray", "ranks": ["trainer-*"]})) is None
    assert expected_ranks(JobShape.read({"launcher": "torchrun", "ntasks": 2})) is None
    assert JobShape.read({"launcher": 7, "ntasks": "3", "ranks": "0"}) == JobShape()  # not its types: absent


def test_what_a_playbooks_run_kept_reads_as_rows_and_what_is_not_a_row_is_said():
    from fleet.store.manifest import RunManifest
    from fleet.store.records import MetricRow, PlaybookRun

    kept = {"name": "nightly-gemm", "version": "v1.2", "thresholds": {},
            "metrics": [{"metric": "kernel_time", "device": "h01:0", "value": 2.5e6, "flags": ["tenant"]},
                        {"metric": "kernel_time", "device": "h01:1", "value": 1e400, "flags": []},
                        {"metric": 3, "device": "h01:2", "value": 1.0}],
            "stragglers": {"straggler": 1, "share": 0.5}}
    run = RunManifest("20261207-000000-ab12", playbook=kept).playbook_run
    assert run.name == "nightly-gemm" and run.version == "v1.2" and run.stragglers == kept["stragglers"]
    assert run.metrics == (MetricRow("kernel_time", "h01:0", 2.5e6, ("tenant",)),)
    assert [why.split(" (")[0] for why in run.refused] == ["playbook metric 1", "playbook metric 2"]
    assert "past" in run.refused[0] and "a name and a device" in run.refused[1]
    confirming = PlaybookRun.read({"confirm": {"metrics": [{"metric": "m", "device": "d", "value": 1}]}})
    assert confirming.metrics == () and confirming.confirm_metrics == (MetricRow("m", "d", 1.0),)
    assert RunManifest("20261207-000000-ab13").playbook_run == PlaybookRun()  # not a playbook's run


# --- what fleet reads back from a file, a job or a user is read once, by a reader beside its use ---

# Each module, its readers (a class's ``read`` or a function, by name: the only code that may look
# into what was read) and the mappings of fleet's own it reads with .get( besides FLEETS_OWN:
READ_BESIDE_READERS = {
    # a schedule's record (ScheduleRecord); the environment a firing runs with, the installing
    # shell's or the record's as read (its names and values strings)
    "fleet/nightly/schedule.py": ({"ScheduleRecord.read"}, {"env", "os.environ"}),
    # the playbook fleet read (its target checked, key by key), and the environment fleet makes
    # of this shell's
    "fleet/cli/schedule.py": (set(), {"pb.target", "env"}),
    # fleet top --record's lines (a file the user gives): a line, a GPU of it, a process on one
    "fleet/analysis/record.py": ({"_gpu_samples", "RecordSample.read", "RecordProcess.read"}, set()),
    # the rows of nsys's and ncu's summaries a playbook's metrics are read from (the store's copy
    # of a node's files); the playbook (the user's YAML), read by load's parts; the metrics' kinds
    "fleet/nightly/summary_rows.py": ({"SummaryRow.read", "NcuRow.read", "NcuPage.read"}, set()),
    "fleet/nightly/playbook.py": ({"_metric", "_name", "_command", "_target", "_profiler", "_metrics",
                                   "_thresholds", "_words", "_ranks"}, {"_METRIC_READERS"}),
    # the job's marks, read into JobMarks where they are listed (slurm/jobs); the login host's
    # inventory variables
    "fleet/slurm/run.py": (set(), {"cluster.login.vars"}),
    # a Ray worker's whose file (Whose); the listing's whose files by path and each report's
    # extras, which fleet makes of the listing's lines
    "fleet/slurm/raygather.py": ({"Whose.read"}, {"whose_files", "extras"}),
}


def defined(tree: ast.AST, scope: str = "") -> dict[str, ast.AST]:
    """Every function and class in ``tree`` by its name: ``f``, ``Class.f``, ``f.inner``."""
    found = {}
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{scope}.{child.name}" if scope else child.name
            found[name] = child
            found.update(defined(child, name))
        else:
            found.update(defined(child, scope))
    return found


def gets_outside(source: str, readers: set[str]) -> list[str]:
    """The receiver of every ``X.get(...)`` call in ``source`` outside the functions ``readers``
    names, and not on a literal (a ``{...}`` written there is fleet's own)."""
    tree = ast.parse(source)
    inside = {id(n) for name, d in defined(tree).items() if name in readers for n in ast.walk(d)}
    return [ast.unparse(n.func.value) for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
            and id(n) not in inside and not isinstance(n.func.value, ast.Dict)]


def test_what_a_file_a_job_or_a_user_gave_is_read_by_fields_after_its_reader():
    found = {path: [g for g in gets_outside((REPO / path).read_text(), readers) if g not in FLEETS_OWN | own]
             for path, (readers, own) in READ_BESIDE_READERS.items()}
    assert {path: receivers for path, receivers in found.items() if receivers} == {}


def test_the_reader_check_finds_a_get_outside_a_reader():
    """It would pass on nothing: a planted read of a record's dict is found, its reader's is not,
    nor a literal's; and each module and reader named is there."""
    planted = ("class Kept:\n    @classmethod\n    def read(cls, doc):\n        return doc.get('a')\n"
               "def f(doc, host):\n    return doc.get('b'), host.vars.get('c'), {'x': 1}.get(doc)\n"
               "def g(doc):\n    def inner():\n        return doc.get('d')\n    return inner\n")
    assert sorted(gets_outside(planted, {"Kept.read"})) == ["doc", "doc", "host.vars"]
    assert sorted(gets_outside(planted, {"Kept.read", "g"})) == ["doc", "host.vars"]
    for path, (readers, _) in READ_BESIDE_READERS.items():
        assert readers <= set(defined(ast.parse((REPO / path).read_text()))), path


def test_a_schedules_record_reads_what_is_not_of_its_type_as_absent():
    from fleet.nightly.schedule import ScheduleRecord, next_begin

    kept = {"name": "n", "playbook": "/p.yaml", "backend": "resubmit", "python": "/usr/bin/python3",
            "dir": "/s/schedules", "cron": None, "every": 90, "env": {"PATH": "/bin"},
            "sbatch_args": ["--qos=low"], "job_id": "7", "fired": 2, "installed_ts": 1.5e9}
    record = ScheduleRecord.read(kept)
    assert (record.every, record.env, record.sbatch_args, record.fired) == (90, {"PATH": "/bin"}, ("--qos=low",), 2)
    assert record.doc is kept and next_begin(record) == "now+90"
    odd = ScheduleRecord.read({"name": 3, "every": "90", "env": {"PATH": ["/bin"], "HOME": "/h"},
                               "sbatch_args": "--qos=low", "fired": "2", "installed_ts": "yesterday",
                               "job_id": 7, "cron": ["0 2 * * *"]})
    assert odd == ScheduleRecord(env={"HOME": "/h"})
    assert ScheduleRecord.read(["not", "a", "record"]) == ScheduleRecord() and ScheduleRecord.read(None).doc == {}


def test_a_look_records_line_reads_what_is_not_of_its_type_as_absent_and_a_gpu_not_of_its_shape_skips_it():
    from fleet.agent.messages import Conditions
    from fleet.analysis.record import RecordProcess, RecordSample, _gpu_samples

    gpu = {"index": 1, "uuid": "GPU-a", "conditions": {"sm_clock_mhz": 1980},
           "processes": [{"pid": 9, "user": "bob", "foreign": True}, {"pid": 10, "user": 7, "foreign": "yes"},
                         {"pid": "11"}, "12"]}
    [sample] = _gpu_samples({"host": "n1", "time": 5, "gpus": [gpu]})
    assert sample == RecordSample("n1", 5.0, 1, "GPU-a", Conditions.read({"sm_clock_mhz": 1980}),
                                  (RecordProcess(9, "bob", True), RecordProcess(10)))
    assert [(q.pid, q.user, q.own) for q in sample.as_watched().processes] == [(9, "bob", False), (10, None, True)]
    assert RecordSample.read("n1", 5.0, dict(gpu, uuid=["GPU-a"])).uuid is None
    for wrong in ({"index": "1"}, {"conditions": None}, {"processes": {}}):
        assert RecordSample.read("n1", 5.0, dict(gpu, **wrong)) is None
        assert _gpu_samples({"host": "n1", "time": 5, "gpus": [gpu, dict(gpu, **wrong)]}) is None  # the line skipped
    assert _gpu_samples({"host": "n1", "time": 5, "gpus": [], "error": None}) == []
    assert _gpu_samples({"host": 3, "time": 5, "gpus": [gpu]}) is None


def test_a_summarys_row_reads_a_cell_not_of_text_as_absent(tmp_path):
    from fleet.nightly.playbook import Metric, metric_values, ncu_value
    from fleet.nightly.summary_rows import NcuPage, NcuRow, SummaryRow

    assert SummaryRow.read({"Name": "gemm", "Total Time (ns)": "", "Total Time": "7"}) == SummaryRow("gemm", None, "7")
    short = SummaryRow.read({"Name": None, "Range": None, "Total Time (ns)": None})  # csv: a row short of its header
    assert short == SummaryRow() and (short.total_ns, short.range_name) == (0.0, "")
    assert SummaryRow.read({"Name": "x", "Range": ":step"}).range_name == ":step"
    assert SummaryRow.read(["x"]) == SummaryRow()
    assert NcuRow.read({"Kernel Name": ["gemm"], "dram__bytes.sum": "1,024"}, "dram__bytes.sum") == \
        NcuRow(None, "1,024")
    assert NcuPage.read([{"Kernel Name": ""}], "dram__bytes.sum") is None and NcuPage.read([], "x") is None
    kern = tmp_path / "k.csv"
    kern.write_text("Time (%),Total Time (ns),Instances,Name\n60,600,1,gemm_a\n40,400\n")  # the last row short
    summaries = {"cuda_gpu_kern_sum": kern}
    assert metric_values(Metric("gpu_kernel_total"), summaries) == {"total GPU kernel time": 1000.0}
    assert metric_values(Metric("kernel", "gemm*"), summaries) == {"kernel gemm*": 600.0}
    assert metric_values(Metric("top_kernels", count=2), summaries) == {"kernel gemm_a": 600.0, "kernel None": 400.0}
    raw = tmp_path / "ncu.csv"
    raw.write_text('"Kernel Name","dram__bytes.sum"\n"","byte"\n"gemm","1,024"\n"gemm"\n')
    assert ncu_value(Metric("ncu", "dram__bytes.sum", kernel="gemm"), raw) == \
        {"ncu dram__bytes.sum of gemm (byte)": 1024.0}


def test_the_marks_a_job_left_read_what_is_not_of_their_shape_as_absent():
    from fleet.rundir import RunDir
    from fleet.slurm.jobstate import JobMarks

    listed = [(RunDir.JOB_EXIT, "-9"), (RunDir.JOB_STOPPED, "1765000000"), (RunDir.JOB_RESTARTS, "2"),
              ("slurm", "5 " + "a" * 64 + " /r/slurm-7.out"), ("ray", "r1"), ("orphan", "o1"), ("ray", "r2")]
    marks = JobMarks.read(listed, [("/r/n/rank0.result.json", "why")])
    assert marks == JobMarks(-9, True, False, False, 2, "5 " + "a" * 64 + " /r/slurm-7.out", ("r1", "r2"), ("o1",),
                             (("/r/n/rank0.result.json", "why"),))
    for exit_mark, restarts in (("3x", "1e3"), ("--5", "123456"), ("\u00b2", "\u00b2"), ("", "-1")):
        odd = JobMarks.read([(RunDir.JOB_EXIT, exit_mark), (RunDir.JOB_RESTARTS, restarts), (RunDir.JOB_REFUSED, "")])
        assert (odd.job_exit, odd.restarts, odd.script_refused) == (None, 0, True)
    assert JobMarks.read([]) == JobMarks()


def test_a_ray_workers_whose_file_reads_what_is_not_of_its_type_as_absent(tmp_path):
    from fleet.slurm.raygather import Whose, actor_stem, ray_worker_name
    from fleet.store.manifest import ReportEntry

    said = {"actor_class": "Trainer", "actor_name": "trainer-0", "host": "node1", "gpu_ids": ["0", 1], "pid": 29064}
    assert Whose.read(said) == Whose("Trainer", "trainer-0", None, "node1", ("0",), 29064)
    assert actor_stem(Whose.read(said)) == "Trainer-trainer-0-29064"
    odd = Whose.read({"actor_class": ["Trainer"], "actor_name": "", "task": 3, "host": {"n": 1}, "gpu_ids": "0",
                      "pid": "29064"})
    assert odd == Whose(actor_name="") and odd.words == [] and actor_stem(odd) is None
    assert Whose.read(["not", "an", "object"]) is None and actor_stem(None) is None
    whose = tmp_path / "worker-node1-11.whose.json"
    whose.write_text(json.dumps(dict(said, pid="11", task="train")))
    rep = ReportEntry(remote=str(whose), stored=str(whose), size=whose.stat().st_size, verified=True)
    assert ray_worker_name([rep]) == "Trainer trainer-0 train on node1, GPU 0"


def test_a_ranks_task_arguments_are_read_once_and_a_value_not_of_its_kind_is_the_default():
    """The batch script's FLEET_TASK is fleet's, yet the job's file: agent/task reads it into TaskArgs."""
    from fleet.agent import task

    given = task.TaskArgs({"request": {"tool": "nsys"}, "report_dir": "/r", "tools": ["nsys"], "launcher": 7,
                           "ranks": "0,1", "nonce": 5, "prolog_expected": 1, "window": [1, 2], "stop_before": 30})
    assert (given.tools, given.launcher, given.ranks, given.nonce) == ({}, "srun", None, None)
    assert (given.prolog_expected, given.window, given.stop_before) == (True, [1, 2], 30)
    kept = task.TaskArgs({"request": {}, "report_dir": "/r", "tools": {"nsys": "/n"}, "launcher": "torchrun",
                          "ranks": [0, 2], "nonce": "abc"})
    assert (kept.tools, kept.launcher, kept.ranks, kept.nonce, kept.prolog_expected) == (
        {"nsys": "/n"}, "torchrun", [0, 2], "abc", False)
    tree = ast.parse((REPO / "fleet/agent/task.py").read_text())
    tree.body = [n for n in tree.body if getattr(n, "name", None) != "TaskArgs"]  # the reader itself
    own = {"env", "table or RANK_VARS"}  # the process's environment, fleet's table of rank variables
    assert [g for g in gets(ast.unparse(tree)) if g not in own] == []


# --- what the node is sent is read once too: the plan's parts, by their readers (fleet/planparts) ---

def planned_shapes():
    """Plans as the planner makes them, one for each shape of its parts: none of them; a watch of
    every GPU; the check and the watch of chosen GPUs (counters, --allow-own); a window with --detach,
    and a Slurm rank's counted to one moment; an NVTX range repeated, with --detach; cudaProfilerApi."""
    from fleet.plan import LabPart, ProfileRequest, RankPart, plan

    state = policy.NodeState.read(document(gpus__0__uuid="GPU-a", gpus__1__uuid="GPU-b"))
    nsys = dict(tool="nsys", command=("python", "train.py"), run_id="r")
    asked = [ProfileRequest(**nsys),
             ProfileRequest(tool="ncu", command=("x",), run_id="r", allow_own=True, lab=LabPart(gpus=(0, 1))),
             ProfileRequest(**nsys, lab=LabPart(gpus=(1,), window=(60, 30), detach=True)),
             ProfileRequest(**nsys, rank=RankPart(job="41", gpus=(0,), output_name="n1/rank0", window=(5, 30),
                                                  window_at=1765000000)),
             ProfileRequest(**nsys, nvtx_window="step", repeat=2, lab=LabPart(detach=True)),
             ProfileRequest(**nsys, cuda_profiler_window=True)]
    plans = [plan("h01", state, req) for req in asked]
    assert [p.status for p in plans] == ["ok"] * len(asked), [p.reasons for p in plans]
    return plans


def test_the_plans_parts_are_written_as_plans_held_them_and_read_back_the_same():
    from fleet.plan import PARTS, Plan
    from fleet.planparts import part_json

    plans = planned_shapes()
    docs = [p.to_json() for p in plans]
    assert [doc["recheck"] for doc in docs[:2]] == [{}, {"gpus": [0, 1], "allow_own": True}]
    assert [doc["watch"] for doc in docs[:2]] == [
        {"gpus": None, "allow_own": False, "job": None, "counters": False},
        {"gpus": [0, 1], "allow_own": True, "job": None, "counters": True}]
    assert docs[2]["window"] == {"start": 60, "duration": 30, "detach": True, "output": docs[2]["window"]["output"]}
    assert docs[2]["window"]["output"].endswith("h01.workload.out") and docs[0]["window"] == {}
    assert docs[3]["window"] == {"start": 5, "duration": 30, "detach": False, "output": "", "at": 1765000000}
    assert docs[4]["capture"] == {"range": "nvtx", "nvtx": "step", "repeat": 2, "detach": True,
                                  "output": docs[2]["window"]["output"]}
    assert docs[5]["capture"] == {"range": "cudaProfilerApi", "nvtx": None, "repeat": 1, "detach": False,
                                  "output": ""}
    for p, doc in zip(plans, docs):
        sent = json.loads(json.dumps(doc))  # as it crosses the wire
        for name, part in PARTS.items():
            assert part_json(part.from_json(sent[name])) == sent[name], name
        assert Plan.from_json(sent) == p and Plan.from_json(sent).to_json() == doc


def test_a_plans_part_not_of_its_shape_reads_as_none_and_a_field_not_of_its_type_as_its_default():
    from fleet.plan import Plan
    from fleet.planparts import CapturePart, RecheckPart, WatchPart, WindowPart

    for part in (RecheckPart, WatchPart, WindowPart, CapturePart):
        for nothing in ({}, None, [], "x", 3, ["gpus"]):
            assert part.from_json(nothing) is None
    # a check or a watch whose GPUs are not NVML's indices looks at every GPU, never at fewer
    assert RecheckPart.from_json({"gpus": [0, "1"], "allow_own": 1}) == RecheckPart(None, False)
    assert RecheckPart.from_json({"gpus": [True]}).gpus is None and RecheckPart.from_json({"x": 1}) == RecheckPart()
    assert WatchPart.from_json({"gpus": "0", "allow_own": "yes", "job": 41, "counters": 1}) == WatchPart()
    assert WatchPart.from_json({"gpus": [1], "job": "41", "counters": True}) == WatchPart((1,), False, "41", True)
    # a window without a whole start and duration is none; its other fields read as their defaults
    for odd in ({"start": "60", "duration": 30}, {"start": 60}, {"start": 60, "duration": 1.5},
                {"start": True, "duration": 30}):
        assert WindowPart.from_json(odd) is None
    assert WindowPart.from_json({"start": 60, "duration": 30, "detach": "yes", "output": ["/x"], "at": "soon"}) == \
        WindowPart(60, 30)
    # a capture of no window fleet knows is none; a count of windows not a whole one or more is one
    assert CapturePart.from_json({"range": "everything", "repeat": 2}) is None
    assert CapturePart.from_json({"range": ["nvtx"]}) is None
    assert CapturePart.from_json({"range": "nvtx", "nvtx": 7, "repeat": 0, "detach": 1, "output": None}) == \
        CapturePart("nvtx")
    assert CapturePart.from_json({"range": "cudaProfilerApi", "repeat": "3"}).repeat == 1
    odd = Plan.from_json({"host": "h01", "status": "ok", "recheck": [0], "watch": "all", "window": {"start": "1"},
                          "capture": {"range": None}})
    assert (odd.recheck, odd.watch, odd.window, odd.capture) == (None, None, None, None)
    assert {k: odd.to_json()[k] for k in ("recheck", "watch", "window", "capture")} == dict.fromkeys(
        ("recheck", "watch", "window", "capture"), {})


def test_a_calls_arguments_are_read_once_and_a_value_not_of_its_kind_is_the_default():
    """A profile call's (RunArgs: the controller's, or a Slurm task's with its plan made there) and a
    probe call's (ProbeArgs: the controller's, a Slurm task's, the live look's)."""
    import os

    from fleet.agent.node import ProbeArgs
    from fleet.agent.run import RunArgs

    p = planned_shapes()[1]
    sent = RunArgs.read({"plan": json.loads(json.dumps(p.to_json())), "context": {"whose": {"launcher": "mpirun"}}})
    assert (sent.plan, sent.context, sent.whose, sent.result_line) == (
        p, {"whose": {"launcher": "mpirun"}}, {"launcher": "mpirun"}, True)
    task = RunArgs.read({"plan": p, "context": {"rank": 3, "nonce": "n"}, "result_line": False})
    assert task.plan is p and task.context == {"rank": 3, "nonce": "n"} and (task.whose, task.result_line) == ({}, False)
    odd = RunArgs.read({"plan": p.to_json(), "context": ["whose"], "result_line": "no"})
    assert (odd.plan, odd.context, odd.whose, odd.result_line) == (p, {}, {}, True)
    assert RunArgs.read({"plan": p, "context": {"whose": "me"}}).whose == {}

    asked = ProbeArgs.read({"owner_uid": 1001, "tools": {"nsys": "/opt/nsys/bin/nsys", "ncu": None},
                            "environment_check": False, "report_dir": "/r"})
    assert asked == ProbeArgs(1001, {"nsys": "/opt/nsys/bin/nsys"}, False, "/r")
    odd = ProbeArgs.read({"owner_uid": "0", "tools": ["nsys"], "environment_check": 0, "report_dir": 7})
    assert odd == ProbeArgs(os.getuid(), {}, True, None) == ProbeArgs.read({})
    assert ProbeArgs.read({"owner_uid": True, "tools": {"nsys": ["/opt/nsys"]}}) == ProbeArgs(os.getuid(), {})


# Each module the node is sent a plan or a call's arguments through, its readers (the only code that
# may look into what was sent) and the mappings of the agent's own it reads with .get( besides
# FLEETS_OWN:
READ_ON_THE_NODE = {
    # the plan's parts, and the plan with its command
    "fleet/planparts.py": ({"RecheckPart.from_json", "WatchPart.from_json", "WindowPart.from_json",
                            "CapturePart.from_json"}, set()),
    "fleet/plan.py": ({"Command.from_json", "Plan.from_json"}, set()),
    "fleet/wrapping/windows.py": (set(), set()),
    # the plan's window and capture; the agent's environment
    "fleet/agent/window.py": (set(), {"os.environ"}),
    # the plan's watch; the processes NVML listed as the agent looked, and its own tables
    "fleet/agent/watch.py": (set(), {"p", "self._floor", "self._seen"}),
    # a profile call's arguments (RunArgs), the plan's check; NVML's answer and the result the agent
    # writes
    "fleet/agent/run.py": ({"RunArgs.read"}, {"nvml", "result", "result.get('newcomer') or {}"}),
    # a probe call's arguments (ProbeArgs); a profiler as the agent found it, the paths ProbeArgs
    # read, the agent's environment
    "fleet/agent/node.py": ({"ProbeArgs.read"}, {"info", "overrides", "os.environ"}),
    # a kept plan's watch and check (allows_own); the counts it makes
    "fleet/completeness.py": (set(), {"counts"}),
    # the live look's arguments (LookArgs); the agent's environment, its own probe's state and the
    # processes NVML listed
    "fleet/agent/look.py": ({"LookArgs.read"}, {"os.environ", "state['nvml']", "p"}),
    # the Ray run's end's arguments (RayEndArgs), and the nsys a worker's whose file names
    # (whose_nsys); the agent's environment
    "fleet/agent/rayend.py": ({"RayEndArgs.read", "whose_nsys"}, {"os.environ"}),
    # the agent re-run under sudo: its answer (SudoAnswer) and its call (RootCall); its own
    # keyword arguments
    "fleet/agent/asroot.py": ({"SudoAnswer.read", "RootCall.read"}, set()),
    # the job's request file, written by the job's user (JobRequest), and the hook's call
    # (hook_call); what slurmd gives (its environment), the root-owned config as nodeconfig
    # checked it, NVML's answer, and what the hook says it did
    "fleet/agent/slurmd.py": ({"JobRequest.read", "hook_call"}, {"env", "config", "nvml", "done"}),
}


def test_what_the_node_is_sent_is_read_by_fields_after_its_reader():
    found = {path: [g for g in gets_outside((REPO / path).read_text(), readers) if g not in FLEETS_OWN | own]
             for path, (readers, own) in READ_ON_THE_NODE.items()}
    assert {path: receivers for path, receivers in found.items() if receivers} == {}


def test_the_node_reader_check_finds_a_get_on_what_was_sent():
    """It would pass on nothing: in each module, a look into a plan's part or a call's arguments
    planted outside its readers is found; and each reader named is there."""
    planted = "\n\ndef planted(plan, args):\n    return plan.window.get('start'), args.get('context')\n"
    for path, (readers, own) in READ_ON_THE_NODE.items():
        source = (REPO / path).read_text()
        assert readers <= set(defined(ast.parse(source))), path
        found = [g for g in gets_outside(source + planted, readers) if g not in FLEETS_OWN | own]
        assert found == ["plan.window", "args"], path


def test_the_sudo_re_runs_answer_is_read_once_into_a_type():
    """What the agent re-run under sudo printed: an answer, an error of it, none, or something
    that is not an answer (another program's output under the same name)."""
    import subprocess
    from fleet.agent.asroot import NoRoot, SudoAnswer, _sudo_failure

    def out(stdout, rc=0, stderr=b""):
        return subprocess.CompletedProcess([], rc, stdout.encode(), stderr)

    said = out(wire.frame("repair", {"value": {"restored": {}}}))
    assert SudoAnswer.of(said) == SudoAnswer(True, {"restored": {}})
    refused = out(wire.frame("repair", {"error": "not listed", "nothing_changed": True}), rc=1)
    assert SudoAnswer.of(refused) == SudoAnswer(True, None, "not listed", True)
    assert isinstance(_sudo_failure(refused, SudoAnswer.of(refused)), NoRoot)
    assert SudoAnswer.of(out("", rc=1, stderr=b"sudo: a password is required")) == SudoAnswer()
    garbled = SudoAnswer.of(out("hello\n"))
    assert garbled.said and garbled.error.endswith("'hello'") and not garbled.nothing_changed
    # an answer of the wrong shape is an error of its own, and "yes" is not "nothing changed"
    odd = SudoAnswer.of(out(wire.frame("repair", {"error": 3, "nothing_changed": "yes"})))
    assert "repair answer is malformed" in odd.error and not odd.nothing_changed
    assert SudoAnswer.read({"error": 3, "nothing_changed": "yes"}) == SudoAnswer(True)


def test_a_step_this_agent_does_not_have_is_an_error_line_not_a_crash(capsys):
    from fleet.agent import asroot

    assert asroot.RootCall.read({"op": ["repair"], "mode": 1, "wanted": "all"}) == asroot.RootCall("", {"wanted": "all"})
    assert asroot.main({"op": "reboot", "state_dir": "/nonexistent"}) == 1
    answer = wire.read(capsys.readouterr().out, "repair")
    assert "no such step: 'reboot'" in answer["error"] and "value" not in answer


def test_a_whose_file_names_its_nsys_by_a_pid_or_not_at_all(tmp_path):
    from fleet.agent.rayend import whose_nsys

    cases = {"ok": '{"nsys_pid": 41}', "text": '{"nsys_pid": "41"}', "bool": '{"nsys_pid": true}',
             "list": "[41]", "cut": '{"nsys_pid": 4', "deep": "[" * 100000}
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
    assert {name: whose_nsys(str(tmp_path / name)) for name in cases} == {
        "ok": 41, "text": None, "bool": None, "list": None, "cut": None, "deep": None}
    assert whose_nsys(str(tmp_path / "gone")) is None


def test_a_sudo_re_run_that_answers_nothing_has_not_done_the_step(monkeypatch):
    """An exit status of 0 with no answer was taken as done (a value of None): the step as root may
    not have run at all. Now it is an error the caller says."""
    import subprocess
    from fleet.agent import asroot, owned

    monkeypatch.setattr(asroot, "SHIPPED_AS", ("bootstrap", b"bundle"))
    monkeypatch.setattr(asroot.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(asroot.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, b"", b""))
    with pytest.raises(owned.OwnedError, match="as root through sudo -n: no output"):
        asroot.privileged("release", holder={"pid": 1})
