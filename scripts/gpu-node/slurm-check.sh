#!/usr/bin/env bash
# Run on a real GPU node (as root) that has no Slurm: fleet's Slurm pieces against the real NVML,
# nsys, ncu and PyTorch, with the environment slurmd and srun would give them.
#  1. one Slurm task under the agent's task mode, with the real nsys: its report and result
#  2. torchrun with two workers, wrapped by fleet's --launcher torchrun: one report per worker rank
#  3. ncu in task mode beside another user's CUDA process: refused before ncu starts
#  4. the Slurm prolog as root beside that tenant: its verdict names it; the owned sysctl is
#     held for the job and the epilog puts it back
#  5. ncu in task mode with the GPU free: a report
# Needs: root, useradd and su, /opt/torch/.venv/bin/torchrun, a writable
# /proc/sys/kernel/perf_event_paranoid. Transcripts go to $OUT/slurm-check/ (one file per step,
# transcript.txt for all), packed as $OUT/slurm-check.tgz with the ranks' results and summaries.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/slurm-check; mkdir -p "$D"
RUNS=$CHECK_TMP/runs; mkdir -p "$RUNS"; chmod 1777 "$RUNS"  # shared by root and jobuser, as a scratch is
ETC=$CHECK_TMP/fleet-etc; WORK=$CHECK_TMP/jobwork; NODE=$CHECK_TMP/node  # root's config, the job's directory
keep_results() { mkdir -p "$D/runs"; (cd "$RUNS" && find . \( -name '*.json' -o -name '*.csv' \) -exec cp --parents {} "$D/runs/" \;); }
trap 'keep_results; pack "$TOP" slurm-check' EXIT
AGENT=$RUNS/fleet-agent.py
"$PY" -c "from fleet.agent import bundle; open('$AGENT', 'w').write(bundle.script())"
APP=$RUNS/app.py
write_app "$APP"
args() {  # task-mode arguments: TOOL RUN-ID LAUNCHER [PROFILER-ARG...]
  "$PY" -c 'import json, sys
from fleet.plan import ProfileRequest
from fleet.slurm.script import JobFiles, JobSpec, task_args
t, r, l, root = sys.argv[1:5]
req = ProfileRequest(tool=t, command=(), run_id=r, profiler_args=tuple(sys.argv[7:]))
files = JobFiles(root + "/" + r, root, tools={"nsys": sys.argv[5], "ncu": sys.argv[6]})
print(json.dumps(task_args(req, JobSpec(launcher=l), files)))' \
    "$1" "$2" "$3" "$RUNS" "$NSYS" "$NCU" "${@:4}"; }
show() { echo "--- $1"; "$PY" -c 'import json, sys
from fleet.agent.wire import answers
[d] = answers(open(sys.argv[1]).read(), "profile")
keep = ("host", "status", "rank", "slurm_node", "job_id", "gpu", "driver", "tool_version", "reasons", "tenants",
        "exit_status", "stopped", "given_up", "notes", "processes_seen")
print(json.dumps({k: d.get(k) for k in keep if k in d}, indent=1))
for r in d.get("reports", []) + d.get("summaries", []): print("  ", r["path"], r["size"], r["sha256"][:16])' "$1"; }
# logged FILE CMD...: CMD's exact line, output and exit status into $D/FILE, then shown.
logged() {
  local f=$1; shift
  { echo "\$ $(q "$@")" | cut -c1-1500; "$@"; echo "(exit status $?)"; } > "$D/$f" 2>&1
  grep -v '^\[' "$D/$f"
}

{
gpu_idle
step "1. one Slurm task (SLURM_PROCID=0 on node h200, job 101) under the real nsys"
logged 1-task-nsys.txt env SLURM_JOB_ID=101 SLURM_PROCID=0 SLURMD_NODENAME=h200 SLURM_STEP_GPUS=0 \
  "$PY" "$AGENT" "$(args nsys run101 srun --trace=cuda,nvtx)" "$PY" "$APP" 2
show "$RUNS/run101/h200/rank0.result.json" | tee -a "$D/1-task-nsys.txt"
expect "slurm: one task under nsys" "$D/1-task-nsys.txt" 0 '"status": "ok"' "rank0.nsys-rep"

step "2. torchrun, two workers, wrapped by fleet's --launcher torchrun (the batch script's lines)"
cat > "$RUNS/worker.py" <<'PYEOF'
import os, time, torch
a = torch.randn(1024, 1024, device="cuda")
for _ in range(200):
    b = a @ a
torch.cuda.synchronize()
print("worker", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "local", os.environ["LOCAL_RANK"], flush=True)
PYEOF
"$PY" - "$AGENT" "$(args nsys run102 torchrun --trace=cuda,nvtx)" "$RUNS/worker.py" > "$RUNS/launch.sh" <<'PYEOF'
import shlex, sys
from fleet.slurm.launchers import launch
agent_file, task_args, worker = sys.argv[1:4]
cmd = ["/opt/torch/.venv/bin/torchrun", "--standalone", "--nproc-per-node", "2", worker]
la = launch("torchrun", cmd, ["/opt/torch/.venv/bin/python3", agent_file, task_args], "/unused", None)
print("COMMAND=(" + " ".join(shlex.quote(w) for w in cmd) + ")")
print("\n".join(la.setup))
print('printf "%q " "${LAUNCH[@]}"; echo')
print('"${LAUNCH[@]}"  # in a job: ' + la.line)
PYEOF
cut -c1-400 "$RUNS/launch.sh"
logged 2-torchrun.txt env SLURM_JOB_ID=102 SLURMD_NODENAME=h200 PATH=/opt/torch/.venv/bin:$PATH bash "$RUNS/launch.sh"
for f in "$RUNS"/run102/h200/rank*.result.json; do show "$f"; done | tee -a "$D/2-torchrun.txt"
expect "slurm: torchrun, two workers, one report each" "$D/2-torchrun.txt" 0 "worker 0 of 2" "worker 1 of 2" \
  "rank0.nsys-rep" "rank1.nsys-rep"

step "3. a second user's CUDA process on GPU 0; ncu in task mode (job 103)"
tenant_up
logged 3-task-ncu-refused.txt env SLURM_JOB_ID=103 SLURM_PROCID=0 SLURMD_NODENAME=h200 SLURM_STEP_GPUS=0 \
  "$PY" "$AGENT" "$(args ncu run103 srun --launch-count 3)" "$PY" "$APP" 1
show "$RUNS/run103/h200/rank0.result.json" | tee -a "$D/3-task-ncu-refused.txt"
ls "$RUNS/run103/h200/" | tee -a "$D/3-task-ncu-refused.txt"
expect "slurm: ncu task refused beside a tenant" "$D/3-task-ncu-refused.txt" 5 '"status": "refused"' "!rank0.ncu-rep"

step "4. the Slurm prolog as root beside the tenant (job 104 of user jobuser opted in)"
id jobuser >/dev/null 2>&1 || useradd -m jobuser
mkdir -p "$ETC" "$WORK"; chmod 755 "$ETC"
printf '{"owned_sysctls": {"kernel.perf_event_paranoid": 1}, "jobs_dir": "%s/jobs", "state_dir": "%s/state", "log_file": "%s/log/slurm.log"}\n' "$NODE" "$NODE" "$NODE" > "$ETC/node.json"
echo '{"fleet": 1, "tool": "ncu", "sysctls": ["kernel.perf_event_paranoid"]}' > "$WORK/fleet-request.json"
chown -R jobuser: "$WORK"
JOBENV="SLURM_JOB_ID=104 SLURM_JOB_UID=$(id -u jobuser) SLURM_JOB_GID=$(id -g jobuser) SLURM_JOB_WORK_DIR=$WORK SLURM_JOB_GPUS=0"
{
before=$(cat /proc/sys/kernel/perf_event_paranoid); echo "perf_event_paranoid before: $before"
echo "\$ env $JOBENV $PY fleet-agent.py '{\"mode\":\"slurmd\",\"op\":\"prolog\",\"config\":\"$ETC/node.json\"}'"
env $JOBENV "$PY" "$AGENT" '{"mode":"slurmd","op":"prolog","config":"'"$ETC"'/node.json"}'; echo "(prolog exit $?)"
echo "perf_event_paranoid in the job: $(cat /proc/sys/kernel/perf_event_paranoid)"
echo "verdict:"; cat "$NODE/jobs/104/verdict.json"; echo
echo "\$ env $JOBENV $PY fleet-agent.py '{\"mode\":\"slurmd\",\"op\":\"task-prolog\",...}'"
env $JOBENV "$PY" "$AGENT" '{"mode":"slurmd","op":"task-prolog","config":"'"$ETC"'/node.json"}'; echo "(task-prolog exit $?)"
echo "\$ env $JOBENV $PY fleet-agent.py '{\"mode\":\"slurmd\",\"op\":\"epilog\",...}'"
env $JOBENV "$PY" "$AGENT" '{"mode":"slurmd","op":"epilog","config":"'"$ETC"'/node.json"}'; echo "(epilog exit $?)"
after=$(cat /proc/sys/kernel/perf_event_paranoid); echo "perf_event_paranoid after: $after"
cat "$NODE/log/slurm.log"
[ "$before" = "$after" ]; echo "(exit status $?: 0 = put back as it was)"
} > "$D/4-prolog-epilog.txt" 2>&1
cat "$D/4-prolog-epilog.txt"
expect "slurm: prolog/epilog as root beside the tenant" "$D/4-prolog-epilog.txt" 0 "(prolog exit 0)" \
  "perf_event_paranoid in the job: 1" "belongs to another user" "(epilog exit 0)"

step "5. the tenant gone: ncu in task mode (job 105)"
tenant_down
logged 5-task-ncu.txt env SLURM_JOB_ID=105 SLURM_PROCID=0 SLURMD_NODENAME=h200 SLURM_STEP_GPUS=0 \
  "$PY" "$AGENT" "$(args ncu run105 srun --launch-count 3)" "$PY" "$APP" 1
show "$RUNS/run105/h200/rank0.result.json" | tee -a "$D/5-task-ncu.txt"
expect "slurm: ncu task with the GPU free" "$D/5-task-ncu.txt" 0 '"status": "ok"' "rank0.ncu-rep"
wait
} 2>&1 | tee "$D/transcript.txt" | cut -c1-600
