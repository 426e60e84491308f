#!/usr/bin/env bash
# Run on a real GPU node (as root): windows the workload opens, through `fleet profile` itself, with
# the real nsys, and a lab torchrun of three ranks.
#  1. --nvtx-window step --repeat 2 on a 12 s workload whose every step is an NVTX range "step": two
#     reports, each one step's kernels; the workload runs on to its end, its own last line after the
#     windows; when each report appeared on the node, beside the workload's end
#  1b. the same with --detach on a 40 s workload: fleet leaves once both reports are written, the workload
#     runs on; fleet jobs shows it, fleet cancel ends it
#  2. --cuda-profiler-window on the same workload (cudaProfilerStart before step 20, Stop after step 40)
#  3. --nvtx-window epoch, a range the workload never opens: what nsys does then, and fleet's verdict
#  4. fleet profile --launcher torchrun of 3 ranks on GPU 0, then `fleet reports ranks`: named rank 0-2
# Transcripts go to $OUT/windows-check/, packed as $OUT/windows-check.tgz.
set -u
cd "$(dirname "$0")/../.." || exit 1
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/windows-check; mkdir -p "$D"
trap 'pack "$TOP" windows-check' EXIT
W=$CHECK_TMP/windows; mkdir -p "$W"; chmod 755 "$W"
STORE=$CHECK_TMP/windows-store
TORCHRUN=/opt/torch/.venv/bin/torchrun
APP=$W/steps.py  # as scripts/gpu-node/record-sessions.sh's: the recording the stand-in replays
write_steps_app "$APP"

# watch_reports FILE: every 0.2 s, each new .nsys-rep under the node's run folders and when it was
# first seen (this script's clock, epoch seconds), until killed; its pid in WATCHER.
watch_reports() {
  (declare -A seen; while :; do
     for f in /var/tmp/fleet-root/*/*.nsys-rep; do
       [ -e "$f" ] && [ -z "${seen[$f]:-}" ] && seen[$f]=1 && echo "$(date +%s.%N | cut -c1-14) $(stat -c %s "$f") $f"
     done; sleep 0.2
   done) > "$1" 2>&1 &
  WATCHER=$!
}
kernels() {  # kernels FILE: the kernel count of each report the run brought home, from its kernel summary
  local f       # (Instances, the third column of fleet's cuda_gpu_kern_sum CSV, as nsys stats writes it)
  for f in $(find "$STORE" -name '*_cuda_gpu_kern_sum.csv' -newer "$1" | sort); do
    echo "$(basename "$f" _cuda_gpu_kern_sum.csv): $(awk -F, 'NR > 1 {n += $3} END {print n + 0}' "$f") kernels"
  done
}

step "1. --nvtx-window step --repeat 2 on a 12 s workload"
touch "$W/t1"; watch_reports "$D/1-reports-seen.txt"
fleet_log 1-nvtx-repeat.txt profile --hosts localhost --gpu 0 --store "$STORE" --nvtx-window step --repeat 2 \
  -X --trace=cuda,nvtx -- "$PY" "$APP" 12
kill "$WATCHER" 2>/dev/null; cat "$D/1-reports-seen.txt"
kernels "$W/t1" | tee "$D/1-kernels.txt"
expect "windows: --nvtx-window step --repeat 2, two reports, the workload to its end" "$D/1-nvtx-repeat.txt" 0 \
  "nsys collected 2 windows (NVTX range 'step'), and the workload went on to its end" "app done: kernels launched"
gpu_idle

step "1b. --nvtx-window step --repeat 2 --detach on a 40 s workload: fleet leaves with both reports, it runs on"
fleet_log 1b-detach.txt profile --hosts localhost --gpu 0 --store "$STORE" --nvtx-window step --repeat 2 --detach \
  -X --trace=cuda,nvtx -- "$PY" "$APP" 40
expect "windows: --detach leaves with every window's report, the workload running on" "$D/1b-detach.txt" 0 \
  "nsys wrote the report of every window asked, and the workload runs on" "!app done"
RUN=$(sed -n 's/^run \([0-9a-f-]*\).*/\1/p' "$D/1b-detach.txt" | head -1)
fleet_log 1b-jobs.txt jobs --store "$STORE"
fleet_log 1b-cancel.txt cancel "${RUN:-none}" --store "$STORE"
expect "windows: fleet cancel ends the workload --detach left" "$D/1b-cancel.txt" 0 "SIGTERM to pid"
gpu_idle

step "2. --cuda-profiler-window on the same workload"
touch "$W/t2"
fleet_log 2-cuda-profiler.txt profile --hosts localhost --gpu 0 --store "$STORE" --cuda-profiler-window \
  -X --trace=cuda,nvtx -- "$PY" "$APP" 12
kernels "$W/t2" | tee "$D/2-kernels.txt"
expect "windows: --cuda-profiler-window, one report of steps 20 to 40" "$D/2-cuda-profiler.txt" 0 \
  "nsys collected 1 window (cudaProfilerStart() to cudaProfilerStop())" "app done: kernels launched"
gpu_idle

step "3. --nvtx-window epoch: a range the workload never opens"
fleet_log 3-never-opened.txt profile --hosts localhost --gpu 0 --store "$STORE" --nvtx-window epoch \
  -X --trace=cuda,nvtx -- "$PY" "$APP" 4
expect "windows: a range never opened fails the host, said" "$D/3-never-opened.txt" 1 "no window was taken" \
  "app done: kernels launched"
gpu_idle

step "4. a lab torchrun of 3 ranks, then reports ranks"
cat > "$W/three.py" <<'PYEOF'
import os, torch
a = torch.randn(1024, 1024, device="cuda")
with torch.cuda.nvtx.range("sync"):
    for _ in range(50):
        b = a @ a
    torch.cuda.synchronize()
print("rank", os.environ.get("RANK"), "done", flush=True)
PYEOF
chmod 644 "$W/three.py"
fleet_log 4-torchrun.txt profile --hosts localhost --gpu 0 --store "$STORE" --launcher torchrun -X --trace=cuda,nvtx -- \
  "$TORCHRUN" --standalone --nproc-per-node 3 "$W/three.py"
expect "windows: a lab torchrun of 3 ranks, a report each" "$D/4-torchrun.txt" 0 "rank0" "rank1" "rank2"
RUN=$(sed -n 's/^run \([0-9a-f-]*\).*/\1/p' "$D/4-torchrun.txt" | head -1)
fleet_log 4-reports-ranks.txt reports ranks "${RUN:-none}" --store "$STORE" --sync-range sync
expect "windows: reports ranks names rank 0, 1 and 2" "$D/4-reports-ranks.txt" 0 "rank 0" "rank 1" "rank 2"
gpu_idle
