#!/usr/bin/env bash
# Run on a GPU node (as root): which rank was slow, and why, from two ranks on one GPU.
# The workload: two ranks under torchrun, a gloo all-reduce (a CPU tensor) as the blocking sync
# in an NVTX range "sync", each step an NVTX range "step", rank 1 doing 3x rank 0's matrix
# products; each rank marks "rank N" in NVTX.
#  1. record: no fleet. Each torchrun worker under its own nsys (-t cuda,nvtx,osrt), then
#     `nsys export --type sqlite`: the two-rank exports of tests/fixtures/ranks-h200/
#  2. `fleet profile` of the same torchrun (one nsys over the launcher and its workers): the
#     run's SQLite export comes home, verified, listed as "export:"
#  3. `fleet reports ranks RUN --sync-range sync` (table, --json, --html): names rank 1, the
#     rank-seconds lost, "more work", and that the ranks shared GPU 0
# Transcripts go to $OUT/ranks-check/ (one file per command, transcript.txt for all), the
# recorded exports to $OUT/ranks-check/recorded/, the store (less its .nsys-rep) as store.tgz, all
# packed as $OUT/ranks-check.tgz.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1). WHL: a folder of the
# wheels fleet needs that the node's Python lacks, installed into this run's scratch if given
# (matrix.sh installs them itself).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
if [ -n "${WHL:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$CHECK_TMP/site" "$WHL"/*.whl
  export PYTHONPATH=$PYTHONPATH:$CHECK_TMP/site
fi
TOP=${OUT:-/tmp}; D=$TOP/ranks-check; mkdir -p "$D/recorded"
# Everything packed in one file at the end, the recorded exports with it (they are the fixtures):
# a copy brought back from the node is then one file, however many steps wrote.
trap 'tar -C "$TOP" -czf "$TOP/ranks-check.tgz" ranks-check && rm -rf "${TOP:?}/ranks-check"' EXIT
STORE=$CHECK_TMP/ranks-store; export FLEET_STORE=$STORE
STEPS=${STEPS:-12}; PRODUCTS=${PRODUCTS:-20}
APP=$D/ranks_app.py
cat > "$APP" <<'PYEOF'
import os, sys, torch, torch.distributed as dist
steps, products, slow = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
nvtx = torch.cuda.nvtx
nvtx.mark(f"rank {rank}")
a = torch.randn(4096, 4096, device="cuda")
token = torch.zeros(1)
for step in range(steps):
    with nvtx.range("step"):
        for _ in range(products * (3 if rank == slow else 1)):
            b = a @ a
        torch.cuda.synchronize()
        with nvtx.range("sync"):
            dist.all_reduce(token)
dist.destroy_process_group()
print("rank", rank, "done:", steps, "steps,", products * (3 if rank == slow else 1), "products each", flush=True)
PYEOF
TORCHRUN=/opt/torch/.venv/bin/torchrun
{
echo "nsys: $NSYS ($("$NSYS" --version 2>&1 | tail -1))"
nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,driver_version --format=csv,noheader
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
gpu_idle

step "1. record: each torchrun worker under its own nsys, then its SQLite export"
cat > "$D/recorded/rank.sh" <<SH
#!/bin/bash
exec "$NSYS" profile -t cuda,nvtx,osrt --sample=none --cpuctxsw=none -f true -o "$D/recorded/rank\$RANK" "$PY" "$APP" "\$@"
SH
F=$D/1-record.txt
{ echo "\$ $(q "$TORCHRUN" --standalone --nproc-per-node 2 --no-python bash "$D/recorded/rank.sh" "$STEPS" "$PRODUCTS" 1)"
  cat "$D/recorded/rank.sh"
  t=$SECONDS; "$TORCHRUN" --standalone --nproc-per-node 2 --no-python bash "$D/recorded/rank.sh" "$STEPS" "$PRODUCTS" 1
  echo "(exit status $? after $((SECONDS - t))s)"
  for r in 0 1; do
    echo "\$ $(q "$NSYS" export --type sqlite -f true -o "$D/recorded/rank$r.sqlite" "$D/recorded/rank$r.nsys-rep")"
    "$NSYS" export --type sqlite -f true -o "$D/recorded/rank$r.sqlite" "$D/recorded/rank$r.nsys-rep"
    echo "(exit status $?)"
  done
  ls -l "$D/recorded"; } > "$F" 2>&1
grep -v '^\[' "$F" | cut -c1-300
rm -f "$D/recorded"/*.nsys-rep
ok=0; [ -s "$D/recorded/rank0.sqlite" ] && [ -s "$D/recorded/rank1.sqlite" ] || ok=1
echo "(exit status $ok)" >> "$F"
expect "ranks: two per-rank exports recorded" "$F" 0 "rank 0 done" "rank 1 done"
O=$D/1-osrt.txt  # what a CPU-side sync looks like in the OS runtime trace: each rank's main thread's calls
{ echo "\$ the OS runtime calls of each rank's main thread, most time first"
  "$PY" - "$D"/recorded/rank*.sqlite <<'PYEOF'
import sqlite3, sys
for path in sys.argv[1:]:
    db = sqlite3.connect(path)
    print(path.rsplit("/", 1)[1])
    for row in db.execute("SELECT s.value, COUNT(*), SUM(o.end - o.start) / 1e6, MIN(o.end - o.start) / 1e6, "
                          "MAX(o.end - o.start) / 1e6 FROM OSRT_API o JOIN StringIds s ON s.id = o.nameId "
                          "WHERE (o.globalTid >> 24) & 16777215 = o.globalTid & 16777215 "
                          "GROUP BY s.value ORDER BY 3 DESC LIMIT 8"):
        print("  %-28s %5d calls %10.1f ms (min %.3f, max %.1f)" % row)
PYEOF
  echo "(exit status $?)"; } > "$O" 2>&1
cat "$O"
gpu_idle

step "2. fleet profile of the 2-rank torchrun"
fleet_log 2-profile.txt profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx,osrt -- \
  "$TORCHRUN" --standalone --nproc-per-node 2 "$APP" "$STEPS" "$PRODUCTS" 1
expect "ranks: fleet profile brings the export home" "$D/2-profile.txt" 0 ".nsys-rep (" "export:" ".sqlite (" "verified"
RUN=$(sed -n 's/^run \([0-9a-f-]*\).*/\1/p;s/.*"run_id": "\([^"]*\)".*/\1/p' "$D/2-profile.txt" | head -1)
[ -n "$RUN" ] || RUN=$(ls "$STORE"/*/* -d 2>/dev/null | tail -1 | xargs -r basename)
echo "run: $RUN"
# The store without its reports, to read again elsewhere (its exports and manifest are small).
(cd "$CHECK_TMP" && find ranks-store -type f ! -name '*.nsys-rep' ! -name catalog.sqlite | tar -czf "$D/store.tgz" -T -)

step "3. fleet reports ranks"
fleet_log 3-ranks.txt reports ranks "$RUN" --store "$STORE" --sync-range sync
expect "ranks: the slow rank, its cause, the shared GPU" "$D/3-ranks.txt" 0 "straggler: rank 1" "rank-seconds" \
  "more work" "shared GPU 0"
fleet_log 3-ranks.json reports ranks "$RUN" --store "$STORE" --sync-range sync --json
expect "ranks: --json in fleet's envelope" "$D/3-ranks.json" 0 '"fleet_json": 1' '"command": "reports ranks"'
fleet_log 3-ranks-cpu.txt reports ranks "$RUN" --store "$STORE" --sync-call pthread_cond_wait
fleet_log 3-ranks-html.txt reports ranks "$RUN" --store "$STORE" --sync-range sync --html "$D/ranks.html"
expect "ranks: the HTML page" "$D/3-ranks-html.txt" 0 "ranks.html"
} 2>&1 | tee "$D/transcript.txt" | cut -c1-600
