#!/usr/bin/env bash
# Run on a real GPU node (as root): fleet probe/doctor alone, beside another
# user's CUDA process, and after it is gone; MPS on top. Transcripts go to
# $OUT/gpu-check/ and, packed, $OUT/gpu-check.tgz.
# PY: a python3 with torch (the tenant) and pynvml/click/PyYAML (fleet).
set -u
cd "$(dirname "$0")/../.."
TOP=${OUT:-/tmp}; OUT=$TOP/gpu-check; mkdir -p "$OUT"
trap 'tar -C "$TOP" -czf "$TOP/gpu-check.tgz" gpu-check && rm -rf "$OUT"' EXIT
PY=${PY:-/opt/torch/.venv/bin/python3}  # by full path: another user's python3 may be another one
export PYTHONPATH=$PWD
fleet() { "$PY" -m fleet "$@"; }
step() { echo; echo "### $*"; }
log() { local f=$1; shift; { echo "\$ fleet $*"; fleet "$@"; echo "(exit status $?)"; } > "$OUT/$f" 2>&1; cat "$OUT/$f"; }

step "no tenant"
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current --format=csv,noheader
log probe-alone.txt probe
log probe-alone.json probe --json
log doctor-alone.txt doctor

step "a second user's CUDA process"
id tenant >/dev/null 2>&1 || useradd -m tenant
su tenant -c "$PY -c 'import torch,time; x=torch.ones(1<<28,device=\"cuda\"); print(\"tenant up\", flush=True); time.sleep(120)'" &
for i in $(seq 1 60); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
log probe-tenant.txt probe
log probe-tenant.json probe --json
log doctor-tenant.txt doctor
log doctor-tenant.json doctor --json

step "tenant gone"
pkill -u tenant -f "torch.ones" ; for i in $(seq 1 30); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . || break; sleep 1; done
log probe-after.txt probe

step "MPS"
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "mps daemon started"
"$PY" -c 'import torch,time; x=torch.ones(1<<20,device="cuda"); print("mps client up", flush=True); time.sleep(40)' &
for i in $(seq 1 40); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
sleep 2
log probe-mps.txt probe
log doctor-mps.txt doctor
echo quit | nvidia-cuda-mps-control; wait

step "cost of one probe on this node"
TIMEFORMAT="%R s wall, %U+%S s cpu"
echo "python3 -c pass:"; for i in 1 2 3 4 5; do time "$PY" -c pass; done
echo "fleet probe --json (whole command: interpreter, fleet, agent):"; for i in 1 2 3 4 5; do time "$PY" -m fleet probe --json >/dev/null; done
"$PY" -m fleet probe --json | "$PY" -c 'import json,sys; print("agent elapsed_ms:", json.load(sys.stdin)["nodes"][0]["state"]["elapsed_ms"])'
