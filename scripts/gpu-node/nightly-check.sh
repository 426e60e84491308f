#!/usr/bin/env bash
# Run on a real GPU node (as root): the nightly reference playbook, playbooks/reference.yaml, run
# with `fleet run` RUNS times (default 5), then SLOW times (default 2) with the workload's planted
# regression (--slowdown: one redundant GEMM per step), into one store; then `fleet nightly report`
# judges the history. Expected: every run ok and its metrics stored; the GEMM metric called a
# Regression (exit 7) after the slowed runs, the NVTX step at least Suspicious.
# Transcripts, the store's manifests, metric history and summaries, and the report page go to
# $OUT/nightly-check/, packed as $OUT/nightly-check.tgz (reports listed in reports.txt, left out).
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/nightly-check; mkdir -p "$D"
trap 'pack "$TOP" nightly-check' EXIT
export FLEET_STORE=$D/store
RUNS=${RUNS:-5}; SLOW=${SLOW:-2}
SLOWED=$CHECK_TMP/reference-slowdown.yaml  # the same playbook (same name, same history), --slowdown added
"$PY" - "$SLOWED" <<'PYEOF'
import sys, yaml
pb = yaml.safe_load(open("playbooks/reference.yaml"))
pb["command"] = pb["command"] + ["--slowdown"]
yaml.safe_dump(pb, open(sys.argv[1], "w"))
PYEOF
PATH=$(dirname "$PY"):$PATH  # the playbook's python3: the node's, with torch
{
echo "nsys: $NSYS; store: $FLEET_STORE; $RUNS runs, then $SLOW with --slowdown"
gpu_idle
for i in $(seq 1 $((RUNS + SLOW))); do
  pb=playbooks/reference.yaml; what="run $i"
  [ "$i" -gt "$RUNS" ] && pb=$SLOWED && what="run $i, slowed down"
  step "fleet run, $what"
  fleet_log "run-$i.txt" run "$pb"
  expect "nightly: $what, complete and metrics stored" "$D/run-$i.txt" 0 ": complete" "total GPU kernel time on" "nvtx *train_step on"
done
step "fleet nightly report"
fleet_log report.txt nightly report playbooks/reference.yaml --out "$D/site/nightly.html"
expect "nightly: the slowed GEMMs called a Regression" "$D/report.txt" 7 "Regression"
cp "$D/site/nightly.html" "$D/nightly.html" 2>/dev/null
cp "$D/site/nightly.json" "$D/nightly.json" 2>/dev/null
"$PY" -m fleet reports ls
} 2>&1 | tee "$D/transcript.txt"
