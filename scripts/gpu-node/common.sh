# Sourced by the GPU-node checks, from the repository root (or a copy of it: fleet/ and
# scripts/gpu-node/ side by side). Sets: PY, the node's Python with torch; PYTHONPATH with fleet
# first; nsys's importer libraries (DEPS: a folder of libdw1/libelf1 .debs); NSYS, the nsys inside
# Nsight Compute; NCU. Helpers: step, fleet_log (a fleet command's exact line, output and exit
# status into a transcript), expect (PASS or FAIL for one transcript, appended to $RESULTS),
# tenant_up/tenant_down (another user's CUDA process on GPU 0), gpu_idle, write_app, pack.
# This run's own scratch (root's, 0711): no fixed /tmp path another user could plant or another
# run could share. matrix.sh makes it once and its checks inherit it.
if [ -z "${CHECK_TMP:-}" ]; then CHECK_TMP=$(mktemp -d /tmp/fleet-check.XXXXXX) && chmod 711 "$CHECK_TMP"; fi
export CHECK_TMP
PY=${PY:-/opt/torch/.venv/bin/python3}  # by full path: another user's python3 may be another one
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # wheels fleet needs (WHL, installed by matrix.sh) stay on it
if [ -n "${DEPS:-}" ] && [ ! -e "$CHECK_TMP/dw/.unpacked" ]; then
  for f in "$DEPS"/*.deb; do dpkg -x "$f" "$CHECK_TMP/dw"; done && touch "$CHECK_TMP/dw/.unpacked"
fi
[ -n "${DEPS:-}" ] && export LD_LIBRARY_PATH=$CHECK_TMP/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys 2>/dev/null | head -1)
NCU=${NCU:-/usr/local/cuda/bin/ncu}
RESULTS=${RESULTS:-/dev/null}  # matrix.sh collects every check's PASS/FAIL lines here
# descendants_named PID REGEX: the pids below PID (children, theirs, ...) whose command name
# matches REGEX. The checks stop only processes their own commands started, never every nsys on
# the node by name.
descendants_named() {
  local frontier=$1 found="" p
  while [ -n "$frontier" ]; do
    local next=""
    for p in $frontier; do next+=" $(ps -o pid= --ppid "$p" | tr '\n' ' ')"; done
    frontier=$(echo $next)
    found+=" $frontier"
  done
  for p in $found; do ps -o comm= -p "$p" 2>/dev/null | grep -qxE "$2" && echo "$p"; done
}
# holding PATH|DIR/...: pids of the processes that have PATH, or a file below DIR/, open: the
# helpers a profiler started apart from its own process tree, found by this run's own files.
holding() {
  local p f l want
  for p in /proc/[0-9]*; do
    for f in "$p"/fd/*; do
      l=$(readlink "$f" 2>/dev/null) || continue
      for want in "$@"; do
        if [ "$l" = "$want" ] || { [ "${want%/}" != "$want" ] && [ "${l#"$want"}" != "$l" ]; }; then
          echo "${p#/proc/}"; continue 3
        fi
      done
    done
  done | sort -un
}
# output_dir_of PID: the directory of nsys's --output= (this run's report directory).
output_dir_of() { tr '\0' '\n' < "/proc/$1/cmdline" 2>/dev/null | sed -n 's/^--output=\(.*\)\/[^/]*$/\1/p' | head -1; }
step() { echo; echo "### $*   [${SECONDS}s into this check]"; }

# q WORD...: the words as a shell would need them typed (quoted only where needed).
q() {
  local w out=""
  for w in "$@"; do
    if [[ $w =~ ^[A-Za-z0-9_./=:,@%+-]+$ ]]; then out+="$w "; else out+="'${w//\'/\'\\\'\'}' "; fi
  done
  echo "${out% }"
}

# fleet_log FILE ARG...: `python3 -m fleet ARG...` with its exact command line, its output and its
# exit status written to $D/FILE, then shown.
fleet_log() {
  local f=$1; shift
  local t=$SECONDS
  { echo "\$ $(q "$PY" -m fleet "$@")"; "$PY" -m fleet "$@"; echo "(exit status $? after $((SECONDS - t))s)"; } > "$D/$f" 2>&1
  cat "$D/$f"
}

# expect NAME FILE STATUS [TEXT...]: PASS when FILE's last "(exit status N)" is STATUS, FILE holds
# every TEXT and none of the !TEXTs; otherwise FAIL, with why and the host's status line.
expect() {
  local name=$1 file=$2 want=$3 got why="" t line
  shift 3
  got=$(sed -n 's/^(exit status \(-\{0,1\}[0-9]*\).*/\1/p' "$file" 2>/dev/null | tail -1)
  [ "$got" = "$want" ] || why="exit status ${got:-none}, expected $want"
  for t in "$@"; do
    case $t in
      !*) ! grep -qF -- "${t#!}" "$file" 2>/dev/null || why="${why:+$why; }'${t#!}' seen" ;;
      *) grep -qF -- "$t" "$file" 2>/dev/null || why="${why:+$why; }no '$t'" ;;
    esac
  done
  if [ -z "$why" ]; then
    line="PASS  $name"
  else
    line="FAIL  $name: $why"
    local said
    said=$(grep -m1 -E '^[^ ]+: (ok|failed|refused|no-report|unreachable|stopped|error)' "$file" 2>/dev/null | cut -c1-300)
    [ -n "$said" ] && line="$line | $said"
  fi
  echo "$line"; echo "$line" >> "$RESULTS"
}

# Another user's CUDA process on GPU ${TENANT_GPU:-0} (1 GiB), its pid in $TENANT_PID, until tenant_down.
TENANT_PID=$CHECK_TMP/tenant/pid
tenant_up() {
  id tenant >/dev/null 2>&1 || useradd -m tenant
  install -d -o tenant -m 700 "$CHECK_TMP/tenant"; rm -f "$TENANT_PID"
  su tenant -c "env -u PYTHONPATH CUDA_VISIBLE_DEVICES=${TENANT_GPU:-0} $PY -c 'import os, time, torch
x = torch.ones(1 << 28, device=\"cuda\"); torch.cuda.synchronize()
open(\"$TENANT_PID\", \"w\").write(str(os.getpid())); print(\"tenant up, pid\", os.getpid(), flush=True)
time.sleep(600)'" &
  for _ in $(seq 1 60); do [ -s "$TENANT_PID" ] && break; sleep 1; done
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader
}
tenant_down() {
  [ -s "$TENANT_PID" ] && kill "$(cat "$TENANT_PID")" && echo "tenant pid $(cat "$TENANT_PID") stopped"
  rm -f "$TENANT_PID"
  gpu_idle
}
# gpu_idle [SECONDS]: wait until no process is on the GPUs (default 40 s); say who is left if not.
gpu_idle() {
  for _ in $(seq 1 "${1:-40}"); do
    nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -q . || return 0
    sleep 1
  done
  echo "GPU still in use:"; nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader
  return 1
}

# A CUDA workload: SGEMMs for SECONDS (default 2), in an NVTX range unless the second argument is
# "nonvtx", then its rank, if any.
write_app() {
  cat > "$1" <<'PYEOF'
import contextlib, os, sys, time, torch
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2
nvtx = not (len(sys.argv) > 2 and sys.argv[2] == "nonvtx")
a = torch.randn(2048, 2048, device="cuda")
end = time.time() + seconds
with torch.cuda.nvtx.range("fleet-check") if nvtx else contextlib.nullcontext():
    while time.time() < end:
        b = a @ a
        torch.cuda.synchronize()
print("app done, rank", os.environ.get("RANK", os.environ.get("SLURM_PROCID")), flush=True)
PYEOF
}

# write_steps_app FILE: GEMMs for SECONDS (its argument), 10 a step, each step an NVTX range "step", 50 ms
# apart, cudaProfilerStart before step 20 and cudaProfilerStop after step 40; its pid first, and last
# "app done: kernels launched K steps S at T" (record-sessions.sh recorded nsys with it; windows-check.sh).
write_steps_app() {
  cat > "$1" <<'PYEOF'
import os, sys, time, torch
seconds = float(sys.argv[1])
a = torch.randn(2048, 2048, device="cuda")
end = time.time() + seconds
launched = step = 0
print("app started, pid", os.getpid(), flush=True)
while time.time() < end:
    if step == 20:
        torch.cuda.cudart().cudaProfilerStart()
    with torch.cuda.nvtx.range("step"):
        for _ in range(10):
            b = a @ a
            launched += 1
        torch.cuda.synchronize()
    if step == 40:
        torch.cuda.cudart().cudaProfilerStop()
    step += 1
    time.sleep(0.05)
print("app done: kernels launched", launched, "steps", step, "at", round(time.time(), 3), flush=True)
PYEOF
  chmod 644 "$1"
}

# pack TOP NAME: TOP/NAME/ becomes TOP/NAME.tgz, without the reports themselves (their sizes are
# listed in TOP/NAME/reports.txt first) nor nsys's SQLite exports, so that what comes back stays small.
pack() {
  local top=$1 name=$2
  [ -d "$top/$name" ] || return 0
  find "$top/$name" -type f \( -name '*.nsys-rep' -o -name '*.ncu-rep' -o -name '*.qdstrm' -o -name '*.partial' \) \
    -printf '%s %P\n' 2>/dev/null | sort -k2 > "$top/$name/reports.txt"
  find "$top/$name" -type f \( -name '*.nsys-rep' -o -name '*.ncu-rep' -o -name '*.qdstrm' -o -name '*.partial' \
    -o -name fleet-agent.py -o \( -name '*.sqlite' ! -name catalog.sqlite \) \) -delete
  tar -C "$top" -czf "$top/$name.tgz" "$name" && rm -rf "${top:?}/$name"
}
