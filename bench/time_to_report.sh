#!/usr/bin/env bash
# Time to a report in hand, on a GPU node (as root): each workload once through nsys alone
# (`nsys profile`, then `nsys export --type sqlite`, the least that gives a report and the export
# the summaries and the cross-rank analysis need) and once through `fleet profile` on the machine
# itself (report, export and summaries in the store, verified), then a table with the goal of
# each row: fleet <= nsys profile + nsys export + 1 s for the kernel workloads, <= nsys profile
# + 0.5 s for /bin/true.
#
# The workloads: 10 s and 30 s of small kernels (a 256-float add, 100 to a step, each step an
# NVTX range, synchronized), and /bin/true. On the 10 s one it also checks fleet's summaries
# (fleet/agent/summaries.py) against `nsys stats` on the same export, and it records, for
# tests/test_summaries.py, what `nsys stats` writes from a short workload with push/pop, nested,
# start/end and never-closed NVTX ranges and three kinds of kernel (its export kept small: the
# tables the summaries read), and from the two recorded rank exports of tests/fixtures/ranks-h200.
#
# Run from a folder that holds fleet/ and bench/ side by side (and, for the ranks, RANKS: a folder
# with rank0.sqlite and rank1.sqlite). WHL: wheels fleet needs that the node's Python lacks; DEPS:
# the libdw1/libelf1 .debs nsys's importer needs. Writes $OUT/transcript.txt, $OUT/table.txt and
# $OUT/fixtures.tgz. BUDGET (seconds, default 330): a workload that no longer fits is skipped.
# WORKLOADS (default: true small-kernels-10s small-kernels-30s) and ROUNDS (default 1): each named
# workload that many times, round after round, a table row each.
set -u
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
PY=${PY:-/opt/torch/.venv/bin/python3}
OUT=${OUT:-/tmp/time-to-report}; mkdir -p "$OUT"
BUDGET=${BUDGET:-330}
T=$(mktemp -d /tmp/time-to-report.XXXXXX); chmod 711 "$T"
exec > >(tee "$OUT/transcript.txt") 2>&1
if [ -n "${WHL:-}" ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$T/site" "$WHL"/*.whl
fi
export PYTHONPATH=$ROOT${WHL:+:$T/site}
if [ -n "${DEPS:-}" ]; then
  for f in "$DEPS"/*.deb; do dpkg -x "$f" "$T/dw"; done
  export LD_LIBRARY_PATH=$T/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
NSYS=${NSYS:-$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1)}
TRACE=cuda,nvtx,osrt
echo "fleet at ${COMMIT:-$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null)}; $("$NSYS" --version)"
echo "$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); $(nproc) CPUs; $("$PY" --version)"
"$PY" -c 'import sqlite3; print("sqlite", sqlite3.sqlite_version)'

now() { date +%s.%N; }
since() { "$PY" -c "import sys; print('%.1f' % (float(sys.argv[2]) - float(sys.argv[1])))" "$1" "$(now)"; }
# run LABEL CMD...: the command with its line and exit status, its seconds in $LAST
run() {
  local label=$1 t; shift
  echo; echo "\$ $*"; t=$(now)
  "$@" > "$T/$label.log" 2>&1; local rc=$?
  LAST=$(since "$t"); RC=$rc; tail -n 12 "$T/$label.log"; echo "(exit status $rc after ${LAST}s)"
}

# SECONDS [STEPS_FILE]: steps for that long, their count written to STEPS_FILE; --steps N: N steps. The
# fleet run does the steps nsys alone did, so both do the same work (a run bounded by time does
# more steps the less it is slowed, and its report and export grow with them).
cat > "$T/small_kernels.py" <<'PYEOF'
import sys, time, torch
steps = int(sys.argv[2]) if sys.argv[1] == "--steps" else None
end = None if steps is not None else time.time() + float(sys.argv[1])
x = torch.zeros(256, device="cuda")
torch.cuda.synchronize()
done = 0
while (done < steps) if steps is not None else (time.time() < end):
    torch.cuda.nvtx.range_push("step")
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    done += 1
if steps is None and len(sys.argv) > 2:
    open(sys.argv[2], "w").write("%d\n" % done)
PYEOF
# Each line of fleet's output with the seconds since its start (nsys's \r progress stays in its line).
cat > "$T/stamp.py" <<'PYEOF'
import sys, time
t0 = float(sys.argv[1])
for raw in sys.stdin.buffer:
    line = raw.decode(errors="replace").rstrip("\n").split("\r")[-1]
    print("[%7.2f s] %s" % (time.time() - t0, line[:240]), flush=True)
PYEOF
cat > "$T/nvtx_kinds.py" <<'PYEOF'
import torch
nvtx = torch.cuda.nvtx
a, v = torch.randn(512, 512, device="cuda"), torch.zeros(4096, device="cuda")
whole = nvtx.range_start("whole")  # a start/end range
for step in range(300):
    nvtx.range_push("step")
    nvtx.range_push("inner")
    v.add_(1); v.mul_(0.5)
    nvtx.range_pop()
    b = a @ a
    torch.cuda.synchronize()
    nvtx.range_pop()
    if step % 100 == 0:
        nvtx.mark("hundred")
nvtx.range_end(whole)
nvtx.range_push("left-open")  # never closed
torch.cuda.synchronize()
PYEOF

summaries_of() {  # SQLITE PREFIX: fleet's three summaries of SQLITE as PREFIX_<name>.csv
  "$PY" -c 'import sys; from fleet.agent import summaries, reports
failed = summaries.write(sys.argv[1], reports.SUMMARIES, lambda n: "%s_%s.csv" % (sys.argv[2], n))
print("fleet summaries:", failed or "all made")' "$1" "$2"
}
compare() {  # PREFIX_A PREFIX_B: the three summaries, byte for byte
  local n
  for n in cuda_gpu_kern_sum cuda_api_sum nvtx_sum; do
    if cmp -s "$1_$n.csv" "$2_$n.csv"; then echo "MATCH $n ($(wc -l < "$1_$n.csv") lines)"
    else echo "DIFF  $n"; diff "$1_$n.csv" "$2_$n.csv" | head -8; fi
  done
}
stats_of() {  # SQLITE PREFIX: what nsys stats writes from SQLITE
  run "stats-$(basename "$2")" "$NSYS" stats -q --report cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum --format csv \
    --output "$2" "$1"
}

F=$T/fixtures; mkdir -p "$F/summaries-h200/nvtx-kinds" "$F/ranks-h200"
if [ "${FIXTURES:-1}" != 0 ]; then
echo; echo "### fixtures: nsys stats from the same exports fleet's summaries read"
run fixture-profile "$NSYS" profile -t "$TRACE" -f true -o "$T/nvtx-kinds" "$PY" "$T/nvtx_kinds.py"
run fixture-export "$NSYS" export --type sqlite -f true -o "$T/nvtx-kinds.sqlite" "$T/nvtx-kinds.nsys-rep"
stats_of "$T/nvtx-kinds.sqlite" "$F/summaries-h200/nvtx-kinds/export"
"$PY" - "$T/nvtx-kinds.sqlite" "$F/summaries-h200/nvtx-kinds/export.sqlite" <<'PYEOF'
import shutil, sqlite3, sys
shutil.copyfile(sys.argv[1], sys.argv[2])  # only the tables the summaries read, then vacuumed
keep = {"StringIds", "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS",
        "TARGET_INFO_SESSION_START_TIME"}
db = sqlite3.connect(sys.argv[2])
for (name,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
    if name not in keep:
        db.execute('DROP TABLE "%s"' % name)
db.commit(); db.execute("VACUUM"); db.close()
PYEOF
summaries_of "$F/summaries-h200/nvtx-kinds/export.sqlite" "$T/ours-nvtx-kinds"
compare "$F/summaries-h200/nvtx-kinds/export" "$T/ours-nvtx-kinds"
for r in 0 1; do
  if [ -e "${RANKS:-/nonexistent}/rank$r.sqlite" ]; then
    cp "$RANKS/rank$r.sqlite" "$T/rank$r.sqlite"
    stats_of "$T/rank$r.sqlite" "$F/ranks-h200/rank$r"
    summaries_of "$T/rank$r.sqlite" "$T/ours-rank$r"
    compare "$F/ranks-h200/rank$r" "$T/ours-rank$r"
  fi
done
ls -la "$F"/*/ "$F"/summaries-h200/*/
tar -C "$F" -czf "$OUT/fixtures.tgz" .
fi  # FIXTURES

echo "| workload | nsys profile | nsys export | profile + export | fleet profile | goal | met |" > "$OUT/table.txt"
echo "|---|---|---|---|---|---|---|" >> "$OUT/table.txt"
STORE=$T/store
workload() {  # KIND ROUND SECONDS(for the budget) CMD...
  local kind=$1 round=$2 need=$3; shift 3
  local label=$kind; [ "$round" -gt 1 ] && label=$kind-r$round
  if [ $((SECONDS + need)) -gt "$BUDGET" ]; then echo; echo "SKIP $label: about ${need}s left to run, ${SECONDS}s of $BUDGET used"; return; fi
  echo; echo "### $label"
  local steps=(); [ "$kind" != true ] && steps=("$T/$label.steps")
  run "$label-nsys" "$NSYS" profile -t "$TRACE" -f true -o "$T/$label" "$@" "${steps[@]}"; local p=$LAST
  [ -s "$T/$label.steps" ] && echo "(steps done: $(cat "$T/$label.steps"))"
  run "$label-export" "$NSYS" export --type sqlite -f true -o "$T/$label.sqlite" "$T/$label.nsys-rep"; local e=$LAST
  ls -la "$T/$label.nsys-rep" "$T/$label.sqlite"
  if [ "$label" = small-kernels-10s ]; then  # round 1: fleet's summaries against nsys stats, at a million rows
    stats_of "$T/$label.sqlite" "$T/nsys-$label"; echo "(nsys stats from the export alone: ${LAST}s)"
    local t; t=$(now); summaries_of "$T/$label.sqlite" "$T/ours-$label"; echo "(fleet's summaries: $(since "$t")s)"
    compare "$T/nsys-$label" "$T/ours-$label"
  fi
  local fleet_cmd=("$@")
  if [ -s "$T/$label.steps" ]; then fleet_cmd=("$1" "$2" --steps "$(cat "$T/$label.steps")"); fi
  echo; echo "\$ fleet profile ... -- ${fleet_cmd[*]}   (each line with the seconds since the start)"
  local t0; t0=$(now)
  "$PY" -m fleet profile --hosts localhost --gpu 0 --store "$STORE" -X --trace="$TRACE" -- "${fleet_cmd[@]}" 2>&1 \
    | "$PY" "$T/stamp.py" "$t0" > "$T/$label-fleet.log"; RC=${PIPESTATUS[0]}; LAST=$(since "$t0")
  grep -v '^\[[ 0-9.]* s\] \[1/1\]' "$T/$label-fleet.log"; echo "(exit status $RC after ${LAST}s)"
  local f=$LAST
  local node_dir; node_dir=$(sed -n 's/^\[[ 0-9.]* s\] *\t*\(\/.*\)\/[^/]*\.nsys-rep$/\1/p' "$T/$label-fleet.log" | head -1)
  echo "the node's run folder and the store, each file's time less the run's start (s):"
  for d in "$node_dir" "$(ls -d "$STORE"/lab/*/*/* 2>/dev/null | tail -1)"; do
    [ -d "$d" ] && find "$d" -maxdepth 1 -type f -printf '%T@ %s %p\n' | sort -n | "$PY" -c '
import sys; t0 = float(sys.argv[1])
for l in sys.stdin:
    t, size, path = l.split(" ", 2); print("  %+8.2f %12s %s" % (float(t) - t0, size, path.strip()))' "$t0"
  done
  # fleet's own record of the run's moments: the controller's from the command's start, each node's from
  # its agent's start (the manifest's phases, and each host's result's)
  "$PY" - "$(ls -d "$STORE"/lab/*/* 2>/dev/null | tail -1)/manifest.json" <<'PYEOF'
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except (OSError, ValueError) as e:
    sys.exit("no manifest to read the phases of: %s" % e)
print("fleet's phases (s): controller %s" % doc.get("phases"))
for h in doc.get("hosts", []):
    print("  %s's agent %s" % (h.get("host"), (h.get("result") or {}).get("phases")))
PYEOF
  "$PY" - "$kind" "$RC" "$p" "$e" "$f" >> "$OUT/table.txt" <<'PYEOF'
import sys
label, rc, (p, e, f) = sys.argv[1], sys.argv[2], map(float, sys.argv[3:])
if label == "true":
    goal, limit = "<= nsys profile + 0.5 s", p + 0.5
else:
    goal, limit = "<= profile + export + 1 s", p + e + 1
met = "yes" if f <= limit else "no (%+.1f s)" % (f - limit)
if rc != "0":
    met = "no (fleet exit %s)" % rc
print("| %s | %.1f s | %.1f s | %.1f s | %.1f s | %s (%.1f s) | %s |" % (label, p, e, p + e, f, goal, limit, met))
PYEOF
}
for round in $(seq 1 "${ROUNDS:-1}"); do
  for kind in ${WORKLOADS:-true small-kernels-10s small-kernels-30s}; do
    case $kind in
      true) workload true "$round" 10 /bin/true ;;
      small-kernels-10s) workload "$kind" "$round" 90 "$PY" "$T/small_kernels.py" 10 ;;
      small-kernels-30s) workload "$kind" "$round" 190 "$PY" "$T/small_kernels.py" 30 ;;
      *) echo "no workload $kind (true, small-kernels-10s, small-kernels-30s)"; exit 2 ;;
    esac
  done
done
echo; cat "$OUT/table.txt"
echo "(${SECONDS}s in all)"
