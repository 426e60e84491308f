#!/usr/bin/env bash
# Run on a real GPU node (as root): fleet profile with the real nsys and ncu.
#  1. another user's CUDA process on GPU 0: ncu refused; nsys trace allowed, report brought home
#  2. the tenant gone: ncu allowed, report brought home
#  3. nsys SIGKILLed mid-run: the .qdstrm it leaves is finished by fleet
# Transcripts go to $OUT/profile-check/, packed as $OUT/profile-check.tgz.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
TOP=${OUT:-/tmp}; OUT=$TOP/profile-check; mkdir -p "$OUT"
trap 'tar -C "$TOP" -czf "$TOP/profile-check.tgz" profile-check && rm -rf "$OUT"' EXIT
. scripts/gpu-node/common.sh
REPORTS=$OUT/reports
APP=$OUT/app.py
write_app "$APP"
log() { local f=$1; shift; { echo "\$ fleet $*"; "$PY" -m fleet "$@"; echo "(exit status $?)"; } > "$OUT/$f" 2>&1; cat "$OUT/$f"; }

if [ "${ONLY:-}" = importer ]; then
step "nsys cannot generate its report (its importer lacks libdw): fleet finishes the .qdstrm"
printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec %s "$@"\n' "$NSYS" > "$OUT/nsys-without-libdw"; chmod +x "$OUT/nsys-without-libdw"
printf 'all:\n  hosts:\n    h200:\n      ansible_connection: local\n      nsys_path: %s\n' "$OUT/nsys-without-libdw" > "$OUT/inventory.yaml"
log 7-qdstrm-finished.txt -i "$OUT/inventory.yaml" profile --hosts h200 --gpu 0 --out "$REPORTS" -X --trace=cuda,nvtx -- "$PY" "$APP" 3
exit 0
fi
if [ "${ONLY:-}" != killed ]; then  # ONLY=killed runs step 3 alone
step "a second user's CUDA process on GPU 0"
id tenant >/dev/null 2>&1 || useradd -m tenant
su tenant -c "$PY -c 'import torch,time; x=torch.ones(1<<28,device=\"cuda\"); time.sleep(300)'" &
for i in $(seq 1 60); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . && break; sleep 1; done
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
log 1-ncu-refused.txt profile --hosts localhost --tool ncu --gpu 0 --out "$REPORTS" -- "$PY" "$APP" 1
log 2-nsys-beside-tenant.txt profile --hosts localhost --gpu 0 --out "$REPORTS" -X --trace=cuda,nvtx -- "$PY" "$APP" 2

step "the tenant gone"
pkill -u tenant -f "torch.ones"; for i in $(seq 1 30); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . || break; sleep 1; done
log 3-ncu-alone.txt profile --hosts localhost --tool ncu --gpu 0 --out "$REPORTS" -X --launch-count -X 3 -- "$PY" "$APP" 1

fi

step "nsys SIGKILLed while it generates the report: fleet finishes the .qdstrm"
F=$OUT/4-nsys-killed-generating.txt
( echo "\$ fleet profile --hosts localhost --gpu 0 -X --trace=cuda,nvtx -- app.py 15   (nsys SIGKILLed once it prints 'Generating')"
  PYTHONUNBUFFERED=1 "$PY" -m fleet profile --hosts localhost --gpu 0 --out "$REPORTS" -X --trace=cuda,nvtx -- "$PY" "$APP" 15
  echo "(exit status $?)" ) > "$F" 2>&1 &
for i in $(seq 1 900); do grep -q "Generating" "$F" && break; sleep 0.05; done
{ echo "processes at 'Generating':"; ps -eo pid,ppid,args | grep -i -E 'nsys|qdstrm|import' | grep -v grep | cut -c1-160
  echo "SIGKILL to them"; } > "$F.kill"
pkill -KILL -f 'target-linux-x64/nsys|QdstrmImporter'
wait; cat "$F.kill" >> "$F"; rm -f "$F.kill"; cat "$F"

step "nsys SIGKILLed while collecting: the raw data cannot be finished by nsys 2025.3"
F=$OUT/5-nsys-killed-collecting.txt
( sleep 10; pkill -KILL -f 'nsys profile' ) &
log 5-nsys-killed-collecting.txt profile --hosts localhost --gpu 0 --out "$REPORTS" -X --trace=cuda,nvtx -- "$PY" "$APP" 20
wait

step "node state afterwards"
log 6-repair.txt repair localhost
ls -la /var/lock/fleet-gpu-* 2>&1 | head -3
find "$REPORTS" -type f -printf '%s %p\n' | sort -k2 | tee "$OUT/reports.txt"
for f in $(find "$REPORTS" -name '*.ncu-rep' | head -1); do /usr/local/cuda/bin/ncu --import "$f" --page raw --csv 2>/dev/null | head -3 | cut -c1-300; done
for f in $(find "$REPORTS" -name '*.nsys-rep'); do echo "== $f"; "$NSYS" stats -q --report cuda_gpu_kern_sum --format csv "$f" 2>&1 | head -4 | cut -c1-200; done
rm -rf "$REPORTS"/*/*/*.ncu-rep "$REPORTS"/*/*/*.nsys-rep  # keep the tarball small; sizes are in reports.txt
