#!/usr/bin/env bash
# Run on a GPU node with two GPUs (as root): the neighbour check is per GPU.
#  1. another user's CUDA process on GPU 1 only: probe lists it on GPU 1 and nowhere else
#  2. ncu on GPU 0 runs beside it (a report); ncu on GPU 1 is refused, nothing started
#  3. an nsys trace on GPU 1 runs beside it
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
} 2>&1 | tee "$D/transcript.txt" | cut -c1-600
