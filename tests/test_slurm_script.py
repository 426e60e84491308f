"""The batch script and the launchers, as text (pure: no Slurm needed).

The full script of every variant is compared with its golden file in
tests/test_golden_scripts.py; these are the checks of its parts.
"""

from __future__ import annotations

import ast
import json
import shlex
import subprocess
from pathlib import Path

import pytest

from fleet import policy
from fleet.wrapping import containers
from fleet.plan import LabPart, ProfileRequest
from fleet.slurm import jobs
from fleet.wrapping.containers import Container, ContainerError
from fleet.slurm.launchers import LauncherError, launch, script_index
from fleet.slurm import options
from fleet.slurm.script import JobFiles, JobSpec, render
from fleet.safenames import UnsafeValue

FILES = JobFiles("/scratch/ana/fleet-reports/20261129-120000-abcd", "/scratch/ana/fleet-reports", "python3",
                 {"nsys": "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys"})
AGENT = ["python3", "/r/fleet-agent.py", '{"mode":"task"}']


def rendered(req: ProfileRequest, spec: JobSpec, files: JobFiles = FILES) -> str:
    """The script of ``spec`` checked against ``req`` (the one check, options.checked), as prepare renders it."""
    return render(req, options.checked(spec, req), files)


def test_batch_script_is_valid_bash_and_keeps_the_command_exactly(tmp_path):
    nasty = ("sh", "-c", 'echo "$@"', "a b", "$(rm -rf /)", "`x`", "it's", "tab\there", "new\nline", "")
    script = rendered(ProfileRequest(tool="nsys", command=nasty, run_id="r"), JobSpec(partition="gpu"), FILES)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    # Evaluate only the COMMAND= line in bash and print the array back, one word per NUL.
    line = script[script.index("\nCOMMAND=(") + 1:script.index("\nFLEET_TASK=(")]  # a word may hold a newline
    out = subprocess.run(["bash", "-c", line + '\nprintf "%s\\0" "${COMMAND[@]}"'], capture_output=True, check=True)
    assert out.stdout.split(b"\0")[:-1] == [w.encode() for w in nasty]


def test_counters_ask_for_exclusive_nodes_and_trace_does_not():
    ncu = rendered(ProfileRequest(tool="ncu", command=("x",), run_id="r"), JobSpec(), FILES)
    metrics = rendered(ProfileRequest(tool="nsys", command=("x",), run_id="r", gpu_metrics=True), JobSpec(), FILES)
    trace = rendered(ProfileRequest(tool="nsys", command=("x",), run_id="r"), JobSpec(), FILES)
    shared = rendered(ProfileRequest(tool="ncu", command=("x",), run_id="r"), JobSpec(exclusive=False), FILES)
    assert "#SBATCH --exclusive" in ncu and "#SBATCH --exclusive" in metrics
    assert "--exclusive" not in trace and "--exclusive" not in shared


@pytest.mark.parametrize("command, index", [
    (["torchrun", "--nproc-per-node", "2", "train.py", "--lr", "1"], 3),
    (["torchrun", "--standalone", "--nproc_per_node=8", "train.py"], 3),
    (["python", "-m", "torch.distributed.run", "--nnodes", "2", "-m", "pkg.train"], 6),
    (["torchrun", "--no-python", "./bin/app", "--x"], 2),
])
def test_torchrun_options_end_where_the_script_begins(command, index):
    assert script_index(command, "torchrun") == index


def test_mpirun_options_with_one_and_two_values_are_skipped():
    cmd = ["mpirun", "-np", "4", "--mca", "btl", "self,tcp", "--oversubscribe", "-x", "FOO", "./app", "-np", "9"]
    assert script_index(cmd, "mpirun") == 9


def _bash_words(setup: tuple[str, ...], array: str, command: list[str]) -> list[str]:
    """What bash makes of the launch arrays, given COMMAND."""
    prog = "\n".join(["COMMAND=(" + " ".join(shlex.quote(w) for w in command) + ")", *setup,
                      f'printf "%s\\0" "${{{array}[@]}}"'])
    out = subprocess.run(["bash", "-c", prog], capture_output=True, check=True).stdout
    return [w.decode() for w in out.split(b"\0")[:-1]]


def test_torchrun_runs_each_worker_through_the_wrapper_with_no_python():
    cmd = ["torchrun", "--nproc-per-node", "2", "train.py", "--name", "a b"]
    la = launch("torchrun", cmd, AGENT, "/r", None)
    assert la.line.startswith('srun --ntasks-per-node=1 --nodes="$SLURM_JOB_NUM_NODES"')
    assert _bash_words(la.setup, "LAUNCH", cmd) == [
        "torchrun", "--nproc-per-node", "2", "--no-python", *AGENT, "python3", "train.py", "--name", "a b"]
    module = ["torchrun", "--nproc-per-node", "2", "-m", "pkg.train", "--x"]
    assert _bash_words(launch("torchrun", module, AGENT, "/r", None).setup, "LAUNCH", module) == [
        "torchrun", "--nproc-per-node", "2", "--no-python", *AGENT, "python3", "-m", "pkg.train", "--x"]


def test_torchrun_with_a_double_dash_before_its_script_has_no_python_before_the_agent_not_as_its_script():
    cmd = ["torchrun", "--nproc-per-node", "2", "--", "train.py", "--x"]
    assert _bash_words(launch("torchrun", cmd, AGENT, "/r", None).setup, "LAUNCH", cmd) == [
        "torchrun", "--nproc-per-node", "2", "--no-python", *AGENT, "python3", "train.py", "--x"]


def test_torchrun_as_python_module_keeps_the_interpreters_m_and_moves_only_torchruns():
    cmd = ["python3", "-m", "torch.distributed.run", "--nproc_per_node", "4", "-m", "pkg.train", "--x"]
    assert _bash_words(launch("torchrun", cmd, AGENT, "/r", None).setup, "LAUNCH", cmd) == [
        "python3", "-m", "torch.distributed.run", "--nproc_per_node", "4", "--no-python", *AGENT,
        "python3", "-m", "pkg.train", "--x"]
    script = ["python", "-m", "torch.distributed.run", "--standalone", "train.py"]
    assert _bash_words(launch("torchrun", script, AGENT, "/r", None).setup, "LAUNCH", script) == [
        "python", "-m", "torch.distributed.run", "--standalone", "--no-python", *AGENT, "python", "train.py"]  # the python typed


def test_torchrun_in_apptainer_is_the_images_torchrun_as_in_pyxis():
    cmd = ["torchrun", "--nproc-per-node", "2", "train.py"]
    la = launch("torchrun", cmd, AGENT, "/r", Container("apptainer", "img.sif", ("/opt/nsys",)))
    assert _bash_words(la.setup, "LAUNCH", cmd) == [
        "apptainer", "exec", "--nv", "--bind", "/r", "--bind", "/opt/nsys:/opt/nsys:ro", "img.sif",
        "torchrun", "--nproc-per-node", "2", "--no-python", *AGENT, "python3", "train.py"]


@pytest.mark.parametrize("launcher, command, kind", [
    ("mpirun", ["mpirun", "-np", "2", "./app"], "pyxis"),
    ("ray", ["python3", "app.py"], "pyxis"),
    ("ray", ["python3", "app.py"], "apptainer"),
])
def test_a_container_the_launchers_workers_would_not_run_in_is_refused(launcher, command, kind):
    # mpirun starts its ranks outside srun, where pyxis works; Ray starts its workers itself.
    # Refused by the check, before the login node is asked anything (exit 2), and by the renderer itself.
    with pytest.raises(options.JobSpecError, match=f"--launcher {launcher}"):
        options.checked(JobSpec(launcher=launcher, container=Container(kind, "img")),
                        ProfileRequest(tool="nsys", command=tuple(command), run_id="r"))
    with pytest.raises(LauncherError, match=f"--launcher {launcher}"):
        launch(launcher, command, AGENT, "/r", Container(kind, "img"))


def test_mpirun_wraps_each_rank():
    cmd = ["mpirun", "-np", "4", "--mca", "btl", "self", "./app", "-v"]
    la = launch("mpirun", cmd, AGENT, "/r", None)
    assert la.line == '"${LAUNCH[@]}"'
    assert _bash_words(la.setup, "LAUNCH", cmd) == ["mpirun", "-np", "4", "--mca", "btl", "self", *AGENT, "./app", "-v"]


def test_ray_gets_a_runtime_env_nsight_block_naming_each_worker():
    la = launch("ray", ["python", "app.py"], AGENT, "/r", None, profiler_args=("--cuda-memory-usage=true",))
    assert la.setup[0] == '[ -d "$RUN_DIR/ray" ] || mkdir -m 0700 -- "$RUN_DIR/ray"'
    block = json.loads(shlex.split(la.setup[1].split("=", 1)[1])[0])
    assert block == {"_nsight": {"t": "cuda,nvtx,osrt", "o": "/r/ray/worker-%h-%p", "cuda-memory-usage": "true"}}
    with pytest.raises(LauncherError):
        launch("ray", ["python", "app.py"], AGENT, "/r", None, tool="ncu")


def test_containers_mount_nsight_read_only_and_ask_for_no_privilege():
    nsight = ("/opt/nvidia/nsight-systems/2025.3.1",)
    pyxis = launch("srun", ["x"], AGENT, "/r", Container("pyxis", "nvcr.io/nvidia/pytorch:25.01-py3", nsight)).line
    assert pyxis == ("srun --container-image=nvcr.io/nvidia/pytorch:25.01-py3 --container-mounts=/r:/r,"
                     '/opt/nvidia/nsight-systems/2025.3.1:/opt/nvidia/nsight-systems/2025.3.1:ro '
                     '"${FLEET_TASK[@]}" "${COMMAND[@]}"')
    apptainer = launch("srun", ["x"], AGENT, "/r", Container("apptainer", "img.sif", nsight)).line
    assert apptainer == ("srun apptainer exec --nv --bind /r --bind /opt/nvidia/nsight-systems/2025.3.1:"
                         '/opt/nvidia/nsight-systems/2025.3.1:ro img.sif "${FLEET_TASK[@]}" "${COMMAND[@]}"')
    for line in (pyxis, apptainer):
        assert "privileged" not in line and "SYS_ADMIN" not in line
    assert containers.nsight_dirs({"nsys": "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys", "ncu": "/usr/bin/ncu"}) \
        == nsight
    with pytest.raises(ContainerError):
        launch("srun", ["x"], AGENT, "/r", Container("docker", "img"))


@pytest.mark.parametrize("kind", ["pyxis", "apptainer"])
@pytest.mark.parametrize("run_dir, nsight", [("/home/a,/:/hostroot/r", ()), ("/r", ("/opt/ns,/etc",)),
                                              ("/home/a:b/r", ())])
def test_a_path_that_would_split_a_mount_list_is_refused(kind, run_dir, nsight):
    # --container-mounts and --bind split on , and : (the first would mount / read-write at /hostroot)
    with pytest.raises(UnsafeValue, match="comma or colon"):
        launch("srun", ["x"], AGENT, run_dir, Container(kind, "img", nsight))


def test_docker_refuses_a_report_directory_that_would_split_its_volume():
    with pytest.raises(UnsafeValue, match="comma or colon"):
        containers.docker_run(Container("docker", "img"), "/var/tmp/a:/etc", user="1:1", gpus=None,
                              privileges=policy.docker_privileges("nsys", False, False, None))


@pytest.mark.parametrize("kind", ["pyxis", "apptainer"])
def test_a_container_mounts_the_node_local_scratch_its_ranks_write_to(kind):
    files = JobFiles("/shared/runs/r", "/shared/runs", scratch="/local/scratch")
    script = rendered(ProfileRequest(tool="nsys", command=("x",), run_id="r"),
                    JobSpec(container=Container(kind, "img")), files)
    args = json.loads(shlex.split(script[script.index("\nFLEET_TASK=(") + 12:script.index(")\n", script.index(
        "\nFLEET_TASK=("))])[2])
    assert args["report_dir"] == "/local/scratch"  # where each rank writes, inside the container
    step = next(line for line in script.splitlines() if line.startswith("srun ") and "FLEET_TASK" in line)
    assert ("/local/scratch:/local/scratch" if kind == "pyxis" else "--bind /local/scratch ") in step


def test_ncu_is_mounted_from_its_own_install_folder():
    # Nsight Compute's installer puts ncu at the top of its folder; the CUDA toolkit in bin/.
    assert containers.nsight_dirs({"ncu": "/usr/local/NVIDIA-Nsight-Compute-2025.3/ncu"}) == (
        "/usr/local/NVIDIA-Nsight-Compute-2025.3",)
    assert containers.nsight_dirs({"ncu": "/opt/nvidia/nsight-compute/2025.3.1/ncu"}) == (
        "/opt/nvidia/nsight-compute/2025.3.1",)
    assert containers.nsight_dirs({"ncu": "/usr/local/cuda/bin/ncu"}) == ("/usr/local/cuda",)


def _lab_state(euid: int, paranoid: int) -> policy.NodeState:
    return policy.NodeState.read({
        "uid": 1001, "gid": 1001, "euid": euid, "perf_event_paranoid": paranoid, "host_pid_namespace": True,
        "nvml": {"available": True}, "report_dir": {"path": "/var/tmp/fleet-ana", "writable": True},
        "tools": {"nsys": {"path": "/opt/nvidia/nsight-systems/2025.3.1/bin/nsys"},
                  "ncu": {"path": "/opt/nvidia/nsight-compute/2025.3.1/ncu"}},
        "gpus": [{"index": 0, "uuid": "GPU-a", "processes": []}, {"index": 1, "uuid": "GPU-b", "processes": []}]})


def _docker_plan(tool: str, euid: int = 1001, paranoid: int = 2, seccomp: str | None = None, gpus=None):
    from fleet.plan import plan
    from fleet.lab.profile import in_docker

    state = _lab_state(euid, paranoid)
    req = ProfileRequest(tool=tool, command=("python3", "app.py"), run_id="r",
                         lab=LabPart(gpus=gpus, docker_image="nvcr.io/nvidia/pytorch:25.01-py3"))
    p = plan("h01", state, req)
    assert p.status == "ok", p.reasons
    return in_docker(p, state, req, seccomp)


def test_docker_on_a_lab_server_gets_only_the_privilege_the_plan_needs():
    trace = _docker_plan("nsys", paranoid=3)  # sampling already given up by the policy
    argv = trace.command.argv()
    assert argv[:5] == ("docker", "run", "--rm", "--init", "--user") and argv[5] == "1001:1001"
    assert "-v" in argv and "/var/tmp/fleet-ana/r:/var/tmp/fleet-ana/r" in argv
    assert ("/opt/nvidia/nsight-systems/2025.3.1:/opt/nvidia/nsight-systems/2025.3.1:ro" in argv and
            "/opt/nvidia/nsight-compute/2025.3.1:/opt/nvidia/nsight-compute/2025.3.1:ro" in argv)
    image = argv.index("nvcr.io/nvidia/pytorch:25.01-py3")
    assert argv[image + 1:image + 3] == ("/opt/nvidia/nsight-systems/2025.3.1/bin/nsys", "profile")
    sampling = _docker_plan("nsys", seccomp="/etc/docker/seccomp-perf.json").command.argv()
    assert "seccomp=/etc/docker/seccomp-perf.json" in sampling and "--sample=none" not in sampling
    no_profile = _docker_plan("nsys")
    assert {"--sample=none", "--cpuctxsw=none"} <= set(no_profile.command.argv())
    assert any("seccomp profile" in g for g in no_profile.given_up)
    ncu = _docker_plan("ncu", euid=0).command.argv()
    assert ncu[ncu.index("--cap-add") + 1] == "SYS_ADMIN"
    for words in (argv, sampling, no_profile.command.argv(), ncu):
        assert "--privileged" not in words and ("--cap-add" in words) == (words is ncu)
    pinned = _docker_plan("nsys", gpus=(1,))
    assert pinned.command.argv()[pinned.command.argv().index("--gpus") + 1] == '"device=GPU-b"'
    assert "CUDA_VISIBLE_DEVICES" not in pinned.env


def test_sampling_given_up_in_docker_lands_among_nsys_flags_not_dockers():
    """An owned sysctl that cannot be set on the node gives sampling up at run time: the flags go
    to nsys, after ``nsys profile``, never among ``docker run``'s options (they did, spliced at 2)."""
    p = _docker_plan("nsys", seccomp="/etc/docker/seccomp-perf.json")
    given_up = p.without_sampling("could not set kernel.perf_event_paranoid (no sudo)")
    argv = given_up.command.argv()
    assert argv[:2] == ("docker", "run") and "--sample=none" not in argv[:argv.index("profile")]
    profile_at = argv.index("profile")
    assert argv[profile_at - 1].endswith("/nsys") and {"--sample=none", "--cpuctxsw=none"} <= set(
        argv[profile_at + 1:argv.index("--")])
    assert given_up.sysctls == {} and "could not set" in given_up.given_up[-1]
    assert given_up.without_sampling("again").command.argv().count("--sample=none") == 1


def test_squeue_json_of_newer_slurm_parses():
    """data_parser v0.0.40 and later: job_state is a list, job_id may be {"set", "number"}."""
    doc = {"jobs": [{"job_id": 7, "job_state": ["RUNNING"], "state_reason": "None", "nodes": "node[1-2]"},
                    {"job_id": {"set": True, "number": 8}, "job_state": ["PENDING", "REQUEUED"]}]}
    states = jobs.parse_squeue_json(json.dumps(doc))
    assert (states["7"].state, states["7"].nodes, states["8"].state) == ("RUNNING", "node[1-2]", "PENDING")
    assert states["7"].reason is None  # squeue's "None": no reason


def test_squeue_and_scontrol_saying_reason_none_give_no_reason():
    text = jobs.parse_squeue_text("7|RUNNING|None|node1|0:05\n8|PENDING|Resources||0:00\n9|PENDING|||0:00\n")
    assert [text[j].reason for j in ("7", "8", "9")] == [None, "Resources", None]
    st = jobs.parse_scontrol("JobId=14 JobState=RUNNING Reason=None ExitCode=0:0 RunTime=00:00:02 NodeList=node2")
    assert st.reason is None


def test_sacct_and_scontrol_answers_parse():
    sacct = jobs.parse_sacct("12|CANCELLED by 1001|0:15|node1|00:00:07\n13|COMPLETED|0:0|node[1-2]|00:01:00\n")
    assert (sacct["12"].state, sacct["12"].exit_code, sacct["13"].nodes) == ("CANCELLED", "0:15", "node[1-2]")
    st = jobs.parse_scontrol("JobId=14 JobName=x UserId=ana(1001) JobState=TIMEOUT Reason=TimeLimit "
                             "ExitCode=0:15 RunTime=00:01:02 NodeList=node2")
    assert (st.state, st.terminal, st.nodes) == ("TIMEOUT", True, "node2")
    assert jobs.parse_scontrol("slurm_load_jobs error: Invalid job id specified") is None


def test_the_jobs_own_processes_are_not_tenants_but_another_jobs_are():
    state = policy.NodeState.read({"gpus": [{"index": 0, "processes": [
        {"pid": 10, "foreign": False, "slurm_job": "41"},    # another rank of this job
        {"pid": 11, "foreign": False, "slurm_job": "40"},    # the same user's other job
        {"pid": 12, "foreign": True, "user": "bob"}]}]})
    found = policy.tenants(state, policy.Request(job="41"))
    assert [t.pid for t in found] == [11, 12]
    assert [t.pid for t in policy.tenants(state, policy.Request())] == [10, 11, 12]


def test_modules_shipped_to_nodes_parse_as_python_3_8():
    root = Path(__file__).resolve().parents[1] / "fleet"
    for path in [*sorted((root / "policy").glob("*.py")), root / "plan.py", *sorted((root / "agent").glob("*.py"))]:
        ast.parse(path.read_text(), str(path), feature_version=(3, 8))


def test_the_request_fleet_submits_is_what_the_prolog_reads():
    from fleet.agent import slurmd
    from fleet.slurm.script import REQUEST_FILE, request_doc

    doc = request_doc(ProfileRequest(tool="nsys", command=("x",), run_id="r", pause_dcgm=True), FILES)
    assert REQUEST_FILE == slurmd.REQUEST_NAME
    assert {k: v for k, v in doc.items() if isinstance(v, slurmd.REQUEST_KEYS.get(k, ()))} == doc
    assert doc["sysctls"] == ["kernel.perf_event_paranoid"]
    assert "nsys" not in doc  # the epilog finishes reports with the node's own importer, never one the job names
    assert request_doc(ProfileRequest(tool="ncu", command=("x",), run_id="r"), FILES)["sysctls"] == []


def test_ray_gets_no_counters_nor_fleets_options_through_its_dashless_form():
    """Ray takes nsys's options without dashes: `-X gpu-metrics-devices=all` and `-X o=...` went
    through the -X check and reached Ray's workers, which no agent checks for tenants."""
    from fleet.slurm.launchers import unsupported

    assert "only an nsys trace" in unsupported("ray", "nsys", (), gpu_metrics=True)
    assert "only an nsys trace" in unsupported("ray", "ncu")
    assert "gpu-metrics" in unsupported("ray", "nsys", ("gpu-metrics-devices=all",))
    assert "fleet's" in unsupported("ray", "nsys", ("o=/tmp/elsewhere",))
    assert unsupported("ray", "nsys", ("t=cuda,nvtx",)) is None and unsupported("srun", "ncu") is None


def test_an_nsys_rank_runs_until_the_jobs_end_less_stop_before_and_slurms_slack():
    from fleet.agent.task import time_to_run

    env = {"FLEET_JOB_END": "10000"}
    assert time_to_run(env, 120, "nsys", now=8000) == 10000 - 8000 - 120 - 60
    assert time_to_run(env, 120, "ncu", now=8000) is None  # ncu: SIGINT from the trap, as before
    assert time_to_run(env, 120, "nsys", now=9821) is None  # too near: the trap stops it
    assert time_to_run({"FLEET_JOB_END": ""}, 120, "nsys", now=0) is None  # squeue did not say
    assert time_to_run({}, 120, "nsys", now=0) is None
    # Slurm's INFINITE limit reads as a year from the start: a duration that long, not a refusal
    year = time_to_run({"FLEET_JOB_END": str(365 * 86400)}, 120, "nsys", now=0)
    assert year == 365 * 86400 - 180


def test_each_rank_s_window_is_its_delay_to_the_moment_every_rank_s_window_starts():
    from fleet.agent.task import rank_window

    env = {"FLEET_WINDOW_FROM": "1000"}
    # srun started this rank 3.4 s after the script's moment: 60 s after it is 56.6 s away, rounded up
    assert rank_window(env, [60, 30], now=1003.4) == ((57, 30), 1060)
    assert rank_window(env, [60, 30], now=1070) == ((0, 30), None)  # started late: at once, not the others' moment
    assert rank_window({}, [60, 30], now=5) == ((60, 30), None)  # no moment to count from: its own start
    assert rank_window({"FLEET_WINDOW_FROM": "1e3"}, [60, 30]) == ((60, 30), None)
    assert rank_window(env, None) == (None, None) and rank_window(env, ["60", 30]) == (None, None)
