#!/usr/bin/env bash
# Run on a GPU node with two GPUs (as root): the neighbour check is per GPU.
#  1. another user's CUDA process on GPU 1 only: probe lists it on GPU 1 and nowhere else
#  2. ncu on GPU 0 runs beside it (a report); ncu on GPU 1 is refused, nothing started
#  3. an nsys trace on GPU 1 runs beside it
#  4. (the tenant gone) torchrun with two workers, one a GPU, in the agent's task mode as a
#     Slurm job's batch script runs it (SLURM_JOB_GPUS=0,1): a report per rank, each on its GPU
# Transcripts go to $OUT/twogpu-check/, packed as $OUT/twogpu-check.tgz.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/twogpu-check; mkdir -p "$D"
trap 'pack "$TOP" twogpu-check' EXIT
STORE=$D/store
APP=$D/app.py
write_app "$APP"
{
gpu_idle
step "1. another user's CUDA process on GPU 1 only"
TENANT_GPU=1 tenant_up
fleet_log probe.txt probe
fleet_log probe.json probe --json
{ echo "\$ the GPUs another user's process is on, from probe --json"
  "$PY" -c 'import json, sys
text = open(sys.argv[1]).read()  # the logged command line, the JSON, "(exit status ...)"
doc = json.loads(text[text.index("\n{") + 1:text.rindex("\n(exit status")])["data"]["nodes"][0]["state"]
on = sorted(g["index"] for g in doc["gpus"] for p in g.get("processes") or [] if p.get("foreign"))
print("tenant on GPUs:", on)
sys.exit(0 if on == [1] else 1)' "$D/probe.json"; echo "(exit status $?)"; } > "$D/tenant-gpus.txt" 2>&1
cat "$D/tenant-gpus.txt"
expect "twogpu: the tenant listed on GPU 1 only" "$D/tenant-gpus.txt" 0 "tenant on GPUs: [1]"

step "2. ncu on GPU 0 beside it, then on GPU 1"
fleet_log ncu-gpu0.txt profile --hosts localhost --tool ncu --gpu 0 --store "$STORE" -X --launch-count -X 3 -- "$PY" "$APP" 1
expect "twogpu: ncu on GPU 0 beside a tenant on GPU 1" "$D/ncu-gpu0.txt" 0 ".ncu-rep" "verified"
fleet_log ncu-gpu1.txt profile --hosts localhost --tool ncu --gpu 1 --store "$STORE" -X --launch-count -X 3 -- "$PY" "$APP" 1
expect "twogpu: ncu on GPU 1 refused beside the tenant" "$D/ncu-gpu1.txt" 5 "refused" "GPU 1" "!.ncu-rep"

step "3. an nsys trace on GPU 1 beside it"
fleet_log nsys-gpu1.txt profile --hosts localhost --gpu 1 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 1
expect "twogpu: nsys trace on GPU 1 beside the tenant" "$D/nsys-gpu1.txt" 0 ".nsys-rep" "verified"
tenant_down

step "4. torchrun, two workers on two GPUs, in the agent's task mode"
RUNS=$CHECK_TMP/runs; mkdir -p "$RUNS"
AGENT=$RUNS/fleet-agent.py
"$PY" -c "from fleet.agent import bundle; open('$AGENT', 'w').write(bundle.script())"
cat > "$RUNS/worker.py" <<'PYEOF'
import os, torch
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
a = torch.randn(2048, 2048, device="cuda")
for _ in range(200):
    b = a @ a
torch.cuda.synchronize()
print("worker", os.environ["RANK"], "on", torch.cuda.get_device_name(), "device", torch.cuda.current_device(), flush=True)
PYEOF
"$PY" - "$AGENT" "$NSYS" "$RUNS" "$RUNS/worker.py" > "$RUNS/launch.sh" <<'PYEOF'
import json, shlex, sys
from fleet.plan import ProfileRequest
from fleet.slurm.launchers import launch
from fleet.slurm.script import JobFiles, JobSpec, task_args
agent_file, nsys, root, worker = sys.argv[1:5]
req = ProfileRequest(tool="nsys", command=(), run_id="run2gpu", profiler_args=("--trace=cuda,nvtx",))
args = json.dumps(task_args(req, JobSpec(launcher="torchrun"), JobFiles(root + "/run2gpu", root, tools={"nsys": nsys})))
cmd = ["/opt/torch/.venv/bin/torchrun", "--standalone", "--nproc-per-node", "2", worker]
la = launch("torchrun", cmd, ["/opt/torch/.venv/bin/python3", agent_file, args], "/unused", None)
print("COMMAND=(" + " ".join(shlex.quote(w) for w in cmd) + ")")
print("\n".join(la.setup))
print('"${LAUNCH[@]}"  # in a job: ' + la.line)
PYEOF
F=$D/torchrun-2gpu.txt
{ echo "\$ env SLURM_JOB_ID=202 SLURM_JOB_GPUS=0,1 SLURMD_NODENAME=h200x2 bash launch.sh"; cat "$RUNS/launch.sh" | cut -c1-300
  env SLURM_JOB_ID=202 SLURM_JOB_GPUS=0,1 SLURMD_NODENAME=h200x2 PATH=/opt/torch/.venv/bin:$PATH bash "$RUNS/launch.sh"
  echo "(exit status $?)"
  for r in "$RUNS"/run2gpu/h200x2/rank*.result.json; do
    "$PY" -c 'import json, sys
sys.path[:0] = ["."]
from fleet.agent.wire import answers
doc = answers(open(sys.argv[1]).read(), "profile")[-1]
print(sys.argv[1].rsplit("/", 1)[1], doc["status"], [r["path"].rsplit("/", 1)[1] for r in doc["reports"]])' "$r"
  done; } > "$F" 2>&1
grep -v '^\[' "$F" | cut -c1-400
expect "twogpu: torchrun on two GPUs, one report per rank" "$F" 0 "worker 0 on NVIDIA H200 device 0" \
  "worker 1 on NVIDIA H200 device 1" "rank0.result.json ok" "rank1.result.json ok" "rank0.nsys-rep" "rank1.nsys-rep"
} 2>&1 | tee "$D/transcript.txt" | cut -c1-600
