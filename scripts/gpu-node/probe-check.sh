#!/usr/bin/env bash
# Run on a real GPU node (as root): fleet probe/doctor alone, beside another user's CUDA process,
# after it is gone, and with MPS on; then what one probe costs. Transcripts go to
# $OUT/probe-check/ (one file per command, transcript.txt for all), packed as $OUT/probe-check.tgz.
# PY: a python3 with torch (the tenant) and nvidia-ml-py/click/PyYAML/rich (fleet).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/probe-check; mkdir -p "$D"
trap 'pack "$TOP" probe-check' EXIT
export FLEET_STORE=$D/store  # probe and doctor write nothing there; never the home directory

{
step "no tenant"
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current --format=csv,noheader
gpu_idle
fleet_log probe-alone.txt probe
fleet_log probe-alone.json probe --json
fleet_log doctor-alone.txt doctor
expect "probe: GPU free" "$D/probe-alone.txt" 0 "GPU 0" "no processes"
expect "probe --json: GPU free" "$D/probe-alone.json" 0 '"nodes"'
expect "doctor: GPU free, nothing refused" "$D/doctor-alone.txt" 0 "!REFUSED"

step "a second user's CUDA process"
tenant_up
fleet_log probe-tenant.txt probe
fleet_log probe-tenant.json probe --json
fleet_log doctor-tenant.txt doctor
fleet_log doctor-tenant.json doctor --json
expect "probe: tenant listed as FOREIGN" "$D/probe-tenant.txt" 0 "FOREIGN" "tenant"
expect "doctor: ncu refused beside the tenant" "$D/doctor-tenant.txt" 0 "REFUSED" "belongs to another user"
expect "doctor --json beside the tenant" "$D/doctor-tenant.json" 0 '"refused"'

step "tenant gone"
tenant_down
fleet_log probe-after.txt probe
expect "probe: tenant gone" "$D/probe-after.txt" 0 "no processes"

step "MPS"
export CUDA_MPS_PIPE_DIRECTORY=$CHECK_TMP/mps-pipe CUDA_MPS_LOG_DIRECTORY=$CHECK_TMP/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "mps daemon started"
"$PY" -c 'import torch,time; x=torch.ones(1<<20,device="cuda"); torch.cuda.synchronize(); print("mps client up", flush=True); time.sleep(120)' &
CLIENT=$!
for _ in $(seq 1 40); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
sleep 2
fleet_log probe-mps.txt probe
fleet_log doctor-mps.txt doctor
expect "probe: MPS seen" "$D/probe-mps.txt" 0 "[MPS]"
expect "doctor: ncu refused under MPS" "$D/doctor-mps.txt" 0 "REFUSED" "MPS"
kill "$CLIENT"; echo quit | nvidia-cuda-mps-control; wait "$CLIENT" 2>/dev/null
gpu_idle; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY

step "cost of one probe on this node"
TIMEFORMAT="%R s wall, %U+%S s cpu"
echo "python3 -c pass:"; for _ in 1 2 3; do time "$PY" -c pass; done
echo "fleet probe --json (whole command: interpreter, fleet, agent):"
for _ in 1 2 3; do time "$PY" -m fleet probe --json >/dev/null; done
"$PY" -m fleet probe --json | "$PY" -c 'import json,sys; print("agent elapsed_ms:", json.load(sys.stdin)["data"]["nodes"][0]["state"]["elapsed_ms"])'
wait
} 2>&1 | tee "$D/transcript.txt"
