#!/usr/bin/env bash
# Run on a real GPU node (as root): a playbook's metrics read from what the real nsys and ncu write.
# One nsys and one ncu rank in the agent's task mode, then every metric kind of fleet/playbook.py
# computed from the summaries they left. Transcript: $OUT/metrics-check.txt.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
RUNS=/tmp/fleet-runs; mkdir -p "$RUNS"
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
for tool in nsys ncu; do
  args=$("$PY" -c 'import json, sys; print(json.dumps({"mode": "task", "tool": sys.argv[1], "run_id": "m", "report_dir": sys.argv[2],
      "launcher": "srun", "ranks": None, "tools": {"nsys": sys.argv[3], "ncu": "/usr/local/cuda/bin/ncu"},
      "profiler_args": ["--launch-count", "6"] if sys.argv[1] == "ncu" else ["--trace=cuda,nvtx"]}))' "$tool" "$RUNS" "$NSYS")
  env SLURM_JOB_ID=7 SLURM_PROCID=$([ $tool = nsys ] && echo 0 || echo 1) SLURMD_NODENAME=h200 \
    "$PY" "$RUNS/fleet-agent.py" "$args" "$PY" "$RUNS/app.py" > /dev/null 2>&1
  echo "$tool task exit status $?"
done
ls -la "$RUNS/m/h200/"
for f in "$RUNS"/m/h200/rank0_cuda_gpu_kern_sum.csv "$RUNS"/m/h200/rank0_nvtx_sum.csv; do echo "== $f"; head -4 "$f" | cut -c1-250; done
"$PY" - "$RUNS/m/h200" <<'PYEOF'
import sys
from pathlib import Path
from fleet.playbook import Metric, metric_values
d = Path(sys.argv[1])
nsys = {n: d / f"rank0_{n}.csv" for n in ("cuda_gpu_kern_sum", "nvtx_sum")}
for m in (Metric("gpu_kernel_total"), Metric("kernel", "*gemm*"), Metric("top_kernels", count=3), Metric("nvtx", "*step")):
    print(m.kind, metric_values(m, nsys))
for m in (Metric("ncu", "gpu__time_duration.sum"), Metric("ncu", "gpu__time_duration.sum", kernel="*gemm*"),
          Metric("ncu", "dram__bytes_read.sum")):
    print(m.kind, metric_values(m, {"ncu_raw": d / "rank1_ncu_raw.csv"}))
PYEOF
} > "$OUT/metrics-check.txt" 2>&1
cat "$OUT/metrics-check.txt"
