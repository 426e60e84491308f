#!/usr/bin/env bash
# Run on a real GPU node (as root) that has no Slurm: fleet's Slurm pieces against the real NVML,
# nsys, ncu and PyTorch, with the environment slurmd and srun would give them.
#  1. one Slurm task under the agent's task mode, with the real nsys: its report and result
#  2. torchrun with two workers, wrapped by fleet's --launcher torchrun: one report per worker rank
#  3. ncu in task mode beside another user's CUDA process: refused before ncu starts
#  4. the Slurm prolog as root beside that tenant: its verdict names it; the owned sysctl is
#     held for the job and the epilog puts it back
#  5. ncu in task mode with the GPU free: a report
# Transcripts go to $OUT/slurm-check/, packed as $OUT/slurm-check.tgz.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
TOP=${OUT:-/tmp}; OUT=$TOP/slurm-check; mkdir -p "$OUT"
trap 'tar -C "$TOP" -czf "$TOP/slurm-check.tgz" slurm-check && rm -rf "$OUT"' EXIT
. scripts/gpu-node/common.sh
NCU=/usr/local/cuda/bin/ncu
RUNS=/tmp/fleet-runs; mkdir -p "$RUNS"; chmod 1777 "$RUNS"
AGENT=$RUNS/fleet-agent.py
"$PY" -c "from fleet.agent import bundle; open('$AGENT', 'w').write(bundle.script())"
APP=$RUNS/app.py
write_app "$APP"
args() {  # task-mode arguments: TOOL RUN-ID LAUNCHER [PROFILER-ARG...]
  "$PY" -c 'import json, sys; t, r, l = sys.argv[1:4]
print(json.dumps({"mode": "task", "tool": t, "run_id": r, "report_dir": sys.argv[4], "launcher": l, "ranks": None,
                  "tools": {"nsys": sys.argv[5], "ncu": sys.argv[6]}, "profiler_args": sys.argv[7:]}))' \
    "$1" "$2" "$3" "$RUNS" "$NSYS" "$NCU" "${@:4}"; }
show() { echo "--- $1"; "$PY" -c 'import json, sys; d = json.load(open(sys.argv[1]))
keep = ("host", "status", "rank", "slurm_node", "job_id", "gpu", "driver", "tool_version", "reasons", "tenants",
        "exit_status", "stopped", "given_up", "notes", "processes_seen")
print(json.dumps({k: d.get(k) for k in keep if k in d}, indent=1))
for r in d.get("reports", []) + d.get("summaries", []): print("  ", r["path"], r["size"], r["sha256"][:16])' "$1"; }

{
step "1. one Slurm task (SLURM_PROCID=0 on node h200, job 101) under the real nsys"
env SLURM_JOB_ID=101 SLURM_PROCID=0 SLURMD_NODENAME=h200 SLURM_STEP_GPUS=0 \
  "$PY" "$AGENT" "$(args nsys run101 srun --trace=cuda,nvtx)" "$PY" "$APP" 2
echo "(exit status $?)"
show "$RUNS/run101/h200/rank0.result.json"

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
cat "$RUNS/launch.sh" | cut -c1-400
env SLURM_JOB_ID=102 SLURMD_NODENAME=h200 PATH=/opt/torch/.venv/bin:$PATH bash "$RUNS/launch.sh"
echo "(exit status $?)"
for f in "$RUNS"/run102/h200/rank*.result.json; do show "$f"; done

step "3. a second user's CUDA process on GPU 0; ncu in task mode (job 103)"
id tenant >/dev/null 2>&1 || useradd -m tenant
su tenant -c "$PY -c 'import torch,time; x=torch.ones(1<<28,device=\"cuda\"); time.sleep(300)'" &
for i in $(seq 1 60); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
env SLURM_JOB_ID=103 SLURM_PROCID=0 SLURMD_NODENAME=h200 SLURM_STEP_GPUS=0 \
  "$PY" "$AGENT" "$(args ncu run103 srun --launch-count 3)" "$PY" "$APP" 1
echo "(exit status $?; 5 = refused)"
show "$RUNS/run103/h200/rank0.result.json"
ls "$RUNS/run103/h200/"

step "4. the Slurm prolog as root beside the tenant (job 104 of user jobuser opted in)"
id jobuser >/dev/null 2>&1 || useradd -m jobuser
mkdir -p /tmp/fleet-etc /tmp/jobwork; chmod 755 /tmp/fleet-etc
printf '{"owned_sysctls": {"kernel.perf_event_paranoid": 1}, "jobs_dir": "/tmp/fleet-run/jobs", "state_dir": "/tmp/fleet-state", "log_file": "/tmp/fleet-log/slurm.log"}\n' > /tmp/fleet-etc/node.json
echo '{"fleet": 1, "tool": "ncu", "sysctls": ["kernel.perf_event_paranoid"]}' > /tmp/jobwork/fleet-request.json
chown -R jobuser: /tmp/jobwork
JOBENV="SLURM_JOB_ID=104 SLURM_JOB_UID=$(id -u jobuser) SLURM_JOB_GID=$(id -g jobuser) SLURM_JOB_WORK_DIR=/tmp/jobwork SLURM_JOB_GPUS=0"
echo "perf_event_paranoid before: $(cat /proc/sys/kernel/perf_event_paranoid)"
env $JOBENV "$PY" "$AGENT" '{"mode":"slurmd","op":"prolog","config":"/tmp/fleet-etc/node.json"}'; echo "(prolog exit $?)"
echo "perf_event_paranoid in the job: $(cat /proc/sys/kernel/perf_event_paranoid)"
echo "verdict:"; cat /tmp/fleet-run/jobs/104/verdict.json; echo
env $JOBENV "$PY" "$AGENT" '{"mode":"slurmd","op":"task-prolog","config":"/tmp/fleet-etc/node.json"}'
env $JOBENV "$PY" "$AGENT" '{"mode":"slurmd","op":"epilog","config":"/tmp/fleet-etc/node.json"}'; echo "(epilog exit $?)"
echo "perf_event_paranoid after: $(cat /proc/sys/kernel/perf_event_paranoid)"
cat /tmp/fleet-log/slurm.log

step "5. the tenant gone: ncu in task mode (job 105)"
pkill -u tenant -f "torch.ones"; for i in $(seq 1 30); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . || break; sleep 1; done
env SLURM_JOB_ID=105 SLURM_PROCID=0 SLURMD_NODENAME=h200 SLURM_STEP_GPUS=0 \
  "$PY" "$AGENT" "$(args ncu run105 srun --launch-count 3)" "$PY" "$APP" 1
echo "(exit status $?)"
show "$RUNS/run105/h200/rank0.result.json"
} > "$OUT/transcript.txt" 2>&1
cat "$OUT/transcript.txt" | cut -c1-600
