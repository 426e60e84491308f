#!/usr/bin/env bash
# Run on a real GPU node (as root): a playbook's metrics read from what the real nsys and ncu write.
# One nsys and one ncu rank in the agent's task mode, then every metric kind of fleet/nightly/playbook.py
# computed from the summaries they left. Transcript: $OUT/metrics-check/transcript.txt, packed as
# $OUT/metrics-check.tgz with the summaries (the reports are listed in reports.txt and left out).
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/metrics-check; mkdir -p "$D"
trap 'pack "$TOP" metrics-check' EXIT
RUNS=$D/runs; mkdir -p "$RUNS"
"$PY" -c "from fleet.agent import bundle; open('$RUNS/fleet-agent.py', 'w').write(bundle.script())"
cat > "$RUNS/app.py" <<'PYEOF'
import torch
a = torch.randn(2048, 2048, device="cuda")
for _ in range(20):
    with torch.cuda.nvtx.range("step"):
        b = a @ a
        c = torch.relu(b)
torch.cuda.synchronize()
PYEOF
{
gpu_idle
for tool in nsys ncu; do
  step "$tool, one Slurm task in the agent's task mode"
  args=$("$PY" -c 'import json, sys
from fleet.plan import ProfileRequest
from fleet.slurm.script import JobFiles, JobSpec, task_args
tool, root = sys.argv[1:3]
flags = ("--launch-count", "6") if tool == "ncu" else ("--trace=cuda,nvtx",)
files = JobFiles(root + "/m", root, tools={"nsys": sys.argv[3], "ncu": sys.argv[4]})
print(json.dumps(task_args(ProfileRequest(tool=tool, command=(), run_id="m", profiler_args=flags), JobSpec(), files)))' \
      "$tool" "$RUNS" "$NSYS" "$NCU")
  rank=$([ $tool = nsys ] && echo 0 || echo 1)
  F=$D/$tool-task.txt
  { echo "\$ $(q env SLURM_JOB_ID=7 SLURM_PROCID=$rank SLURMD_NODENAME=h200 "$PY" "$RUNS/fleet-agent.py" "$args" "$PY" "$RUNS/app.py")"
    env SLURM_JOB_ID=7 SLURM_PROCID=$rank SLURMD_NODENAME=h200 "$PY" "$RUNS/fleet-agent.py" "$args" "$PY" "$RUNS/app.py"
    echo "(exit status $?)"; } > "$F" 2>&1
  grep -v '^\[' "$F" | cut -c1-400
  expect "metrics: $tool task rank" "$F" 0
done
step "the summaries the ranks left, and every metric kind"
ls -la "$RUNS/m/h200/"
for f in "$RUNS"/m/h200/rank0_cuda_gpu_kern_sum.csv "$RUNS"/m/h200/rank0_nvtx_sum.csv; do echo "== $f"; head -4 "$f" | cut -c1-250; done
{ echo "\$ python3 - (fleet.nightly.playbook.metric_values over the summaries)"
"$PY" - "$RUNS/m/h200" <<'PYEOF'
import sys
from pathlib import Path
from fleet.nightly.playbook import Metric, metric_values
d = Path(sys.argv[1])
nsys = {n: d / f"rank0_{n}.csv" for n in ("cuda_gpu_kern_sum", "nvtx_sum")}
empty = []
for m in (Metric("gpu_kernel_total"), Metric("kernel", "*gemm*"), Metric("top_kernels", count=3), Metric("nvtx", "*step")):
    v = metric_values(m, nsys)
    print(m.label, v)
    empty += [] if v else [m.label]
ncu = {"ncu_raw": d / "rank1_ncu_raw.csv"}
for m in (Metric("ncu", "gpu__time_duration.sum"), Metric("ncu", "gpu__time_duration.sum", kernel="*gemm*")):
    v = metric_values(m, ncu)
    print(m.label, v)
    empty += [] if v else [m.label]
print("metric kinds with no value:", ", ".join(empty) or "none")
absent = metric_values(Metric("ncu", "dram__bytes_read.sum"), ncu)  # not in ncu's default sections
print("a metric ncu did not collect (dram__bytes_read.sum):", absent or "no value, as it should")
sys.exit(1 if empty or absent else 0)
PYEOF
echo "(exit status $?)"; } > "$D/metrics.txt" 2>&1
cat "$D/metrics.txt"
expect "metrics: every metric kind has values" "$D/metrics.txt" 0 "no value: none" "no value, as it should"
} 2>&1 | tee "$D/transcript.txt"
