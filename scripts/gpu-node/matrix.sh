#!/usr/bin/env bash
# The GPU-node acceptance matrix in one command, as root on a node with NVIDIA GPUs, nsys/ncu and
# PyTorch (an H200 test machine): set-up, then probe-check, profile-check, metrics-check and, where
# the node allows it, slurm-check, each under a time limit inside BUDGET seconds.
#   WHL     wheels fleet needs that the node's Python lacks (asyncssh, cryptography, cffi,
#           pycparser), installed with pip --no-index --target (default .h200/whl)
#   DEPS    libdw1 and libelf1 .debs for nsys's importer (default .h200/deps)
#   OUT     where the transcripts go (default /tmp/fleet-matrix)
#   SUDO_DEB  a sudo .deb to install first where the node has no sudo (a disposable test machine
#           only), for profile-check's non-root step with a sudoers line
#   BUDGET  seconds the whole matrix may take (default 500); a check that no longer fits is
#           skipped with a line saying so
#   CHECKS  the checks to run (default: probe profile namespace watch metrics slurm top; twogpu on a node
#           with two GPUs; windows, the windows a workload opens and a lab torchrun of 3 ranks; nightly,
#           the reference playbook's runs and report, and record, the
#           real tools' behaviour recorded for the stand-ins, only when named)
# What is left under $OUT, at most eight files: summary.txt (one PASS, FAIL or SKIP line per step),
# matrix.txt (everything printed), and a NAME-check.tgz for each check run (its transcripts, the
# store's manifests and summaries, not the reports).
set -u
START=$SECONDS
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
abs() { case $1 in /*) echo "$1";; *) echo "$PWD/$1";; esac; }
OUT=$(abs "${OUT:-/tmp/fleet-matrix}"); WHL=$(abs "${WHL:-.h200/whl}"); DEPS=$(abs "${DEPS:-.h200/deps}")
BUDGET=${BUDGET:-500}; CHECKS=${CHECKS:-probe profile namespace watch metrics slurm top}
export OUT DEPS PYTHONUNBUFFERED=1 RESULTS=$OUT/summary.txt
mkdir -p "$OUT"; : > "$RESULTS"
CHECK_TMP=$(mktemp -d /tmp/fleet-check.XXXXXX) && chmod 711 "$CHECK_TMP"; export CHECK_TMP  # this run's own
SITE=$CHECK_TMP/site  # on root's PYTHONPATH: never a fixed /tmp path another user could plant
export PYTHONPATH=$SITE
cd "$ROOT"
. scripts/gpu-node/common.sh  # PY, PYTHONPATH=$ROOT:$SITE, nsys's importer libraries, helpers
D=$CHECK_TMP/setup; mkdir -p "$D"
note() { echo "$*"; echo "$*" >> "$RESULTS"; }

run_check() {  # NAME NEED CAP: the check NAME-check.sh, if NEED seconds are left, for at most CAP
  local name=$1 need=$2 cap=$3 left limit t rc
  left=$((BUDGET - (SECONDS - START)))
  if [ "$left" -lt "$need" ]; then
    note "SKIP  $name-check: ${left}s of the ${BUDGET}s budget left, it needs about ${need}s"; return
  fi
  limit=$((left < cap ? left : cap))
  echo; echo "=================== $name-check (at most ${limit}s) ==================="
  t=$SECONDS
  timeout -k 10 "$limit" bash "$HERE/$name-check.sh"; rc=$?
  [ "$rc" = 124 ] || [ "$rc" = 137 ] && note "FAIL  $name-check: stopped at its ${limit}s limit"
  [ -s "$TENANT_PID" ] && kill "$(cat "$TENANT_PID")" 2>/dev/null  # a check cut short: its tenant, by pid
  pack "$OUT" "$name-check"  # if its own exit did not
  note "TIME  $name-check: $((SECONDS - t))s (exit $rc)"
}

{
echo "fleet GPU-node matrix: $(date -u +%FT%TZ) on $(hostname), budget ${BUDGET}s, checks: $CHECKS"
echo "fleet from $ROOT; wheels $WHL; debs $DEPS; transcripts $OUT"
nvidia-smi --query-gpu=index,name,driver_version,mig.mode.current,compute_mode --format=csv,noheader
uname -r; "$PY" --version; echo "nsys: $NSYS"; echo "ncu: $NCU"
echo; echo "=================== set-up ==================="
echo "\$ $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE $WHL/*.whl"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHL"/*.whl
echo "(exit status $?)" | tee "$D/pip.txt"
{ "$PY" -c 'import asyncssh, cryptography, fleet, pynvml, rich, click, yaml
print("fleet", fleet.__version__, "from", fleet.__file__, "| asyncssh", asyncssh.__version__)'; echo "(exit status $?)"; } > "$D/import.txt" 2>&1
cat "$D/import.txt"
expect "set-up: wheels installed, fleet imports" "$D/import.txt" 0 "$ROOT/fleet/"
IMPORTER=$(ls /opt/nvidia/nsight-compute/*/host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter 2>/dev/null | head -1)
{ echo "\$ ldd ${IMPORTER:-QdstrmImporter (not found)} | grep 'not found'  (LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-})"
  missing=$([ -n "$IMPORTER" ] && ldd "$IMPORTER" 2>&1 | grep 'not found'); echo "$missing"
  [ -n "$IMPORTER" ] && [ -z "$missing" ]; echo "(exit status $?)"; } > "$D/ldd.txt" 2>&1
cat "$D/ldd.txt"
expect "set-up: nsys's importer finds its libraries (libdw, libelf)" "$D/ldd.txt" 0
fleet_log version.txt --version
if [ -n "${SUDO_DEB:-}" ] && ! command -v sudo >/dev/null; then
  echo "\$ dpkg -i $SUDO_DEB"; dpkg -i "$SUDO_DEB" > "$D/sudo.txt" 2>&1; echo "(exit status $?)" >> "$D/sudo.txt"
  tail -3 "$D/sudo.txt"
fi

for check in $CHECKS; do
  case $check in
    probe) run_check probe 60 150 ;;
    profile) run_check profile 150 360 ;;
    namespace) run_check namespace 60 150 ;;
    watch) run_check watch 100 300 ;;
    metrics) run_check metrics 40 100 ;;
    windows) run_check windows 120 240 ;;
    top) run_check top 70 150 ;;
    slurm)
      why=""
      [ "$(id -u)" = 0 ] || why="not root (the prolog and epilog run as root)"
      command -v useradd >/dev/null && command -v su >/dev/null || why="${why:+$why; }no useradd or su"
      [ -x /opt/torch/.venv/bin/torchrun ] || why="${why:+$why; }no /opt/torch/.venv/bin/torchrun"
      p=/proc/sys/kernel/perf_event_paranoid
      (v=$(cat $p) && echo "$v" > $p) 2>/dev/null || why="${why:+$why; }$p cannot be written (the prolog sets it)"
      command -v srun >/dev/null && echo "slurm-check: srun is here, but the check runs the agent as slurmd and srun would" \
        || echo "slurm-check: no Slurm on this node; the check gives fleet's agent the environment slurmd and srun would"
      if [ -n "$why" ]; then note "SKIP  slurm-check: this node cannot run it: $why"; else run_check slurm 90 180; fi ;;
    nightly) run_check nightly 150 330 ;;
    changes) run_check changes 300 560 ;;
    record) run_check record 100 260 ;;
    twogpu)
      if [ "$(nvidia-smi -L | grep -c '^GPU')" -ge 2 ]; then run_check twogpu 60 150
      else note "SKIP  twogpu-check: this node has one GPU"; fi ;;
    *) note "SKIP  $check: no such check" ;;
  esac
done
rm -rf "$OUT/store"  # nothing else may be left: at most 8 files come back

echo; echo "=================== summary ($((SECONDS - START))s) ==================="
cat "$RESULTS"
echo "PASS $(grep -c '^PASS' "$RESULTS"), FAIL $(grep -c '^FAIL' "$RESULTS"), SKIP $(grep -c '^SKIP' "$RESULTS")"
ls -la "$OUT"
} 2>&1 | tee "$OUT/matrix.txt"
