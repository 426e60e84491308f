#!/usr/bin/env bash
# Run on a real GPU node (as root): NVML's answers to a live look (GPM, utilization, memory,
# clocks, process lists), raw, once a second, in four phases, for the fake NVML to replay
# (record-gpm.py says what each holds), into $OUT/record-gpm/gpm.json with this transcript.
#   idle      nobody on GPU 0
#   gemm      another user's SGEMM loop on it
#   holding   that user holding 1 GiB, idle
#   ncu       ncu profiling an SGEMM loop of root's (its kernel count kept, and the same run's
#             count without the sampler beside it)
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/record-gpm; mkdir -p "$D"
J=$D/gpm.json; W=$CHECK_TMP/gpm; mkdir -p "$W"; chmod 755 "$W"
REC="$PY scripts/gpu-node/record-gpm.py"
APP=$W/app.py; write_app "$APP"; chmod 644 "$APP"
{
step "versions"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "$NCU" --version | tail -1
"$PY" -c 'import importlib.metadata as m; print("nvidia-ml-py", m.version("nvidia-ml-py"))'
step "idle"; gpu_idle; $REC idle 5 "$J"
step "gemm: another user's SGEMM loop"
id tenant >/dev/null 2>&1 || useradd -m tenant
su tenant -c "env -u PYTHONPATH $PY $APP 30 nonvtx" > "$W/tenant.txt" 2>&1 &
sleep 8; $REC gemm 6 "$J"
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
wait; gpu_idle
step "holding: another user holds 1 GiB, idle"
tenant_up; $REC holding 4 "$J"; tenant_down
step "ncu alone: kernel count"
"$NCU" --clock-control none -k regex:gemm -c 20 "$PY" "$APP" 3 nonvtx > "$W/ncu-alone.txt" 2>&1; echo "ncu exit $?"
grep -c "Context [0-9]*, Stream" "$W/ncu-alone.txt"; grep -E "==ERROR==|==WARNING==" "$W/ncu-alone.txt" | head -5
step "ncu with the GPM sampler beside it"
"$NCU" --clock-control none -k regex:gemm -c 20 "$PY" "$APP" 3 nonvtx > "$W/ncu-look.txt" 2>&1 &
NCU_PID=$!; sleep 4; $REC ncu 4 "$J"; wait $NCU_PID; echo "ncu exit $?"
grep -c "Context [0-9]*, Stream" "$W/ncu-look.txt"; grep -E "==ERROR==|==WARNING==" "$W/ncu-look.txt" | head -5
cp "$W/ncu-alone.txt" "$W/ncu-look.txt" "$D/"
} 2>&1 | tee "$D/transcript.txt"
