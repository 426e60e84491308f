#!/usr/bin/env bash
# Run on a real GPU node (as root; only with CHECKS=changes, about 5 minutes): the nightly reference
# playbook run 18 times as a nightly history with a known truth, then `fleet nightly report`.
#   runs 1-5   workload version v1 (the playbook's `version` command reads a file the check writes)
#   run 6      v1 with another user's CUDA process on the GPU: contaminated, kept out, not a change
#   runs 7-10  v1 with the GPU's clocks locked low (nvidia-smi -lgc, where the machine allows it;
#              restored on exit whatever happens): an environment change, "SM clock A -> B MHz"
#   runs 11-13 v1, clocks restored: the environment changes back
#   runs 14-18 v2 with the planted slowdown (--slowdown): a code change, "workload v1 -> v2"
# Expected: the report exits 7 with a REGRESSION line naming the code change, the clock changes
# labelled environment (or, where the clocks cannot be locked, said so and not expected), run 6
# kept out as contaminated. Transcripts, the store's manifests and the page go to
# $OUT/changes-check/, packed as $OUT/changes-check.tgz.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/changes-check; mkdir -p "$D"
LOCKED=""; WERE_LOCKED=""
restore_clocks() { [ -n "$LOCKED" ] && nvidia-smi -i 0 -rgc > "$D/clocks-restored.txt" 2>&1; LOCKED=""; }
trap 'restore_clocks; tenant_down >/dev/null 2>&1; pack "$TOP" changes-check' EXIT
export FLEET_STORE=$D/store
VERSION_FILE=$CHECK_TMP/workload-version   # the workload's version, as git rev-parse would print it
echo v1 > "$VERSION_FILE"
book() {  # book NAME [--slowdown]: the reference playbook with its version command (and the slowdown)
  "$PY" - "$CHECK_TMP/$1.yaml" "$VERSION_FILE" "${2:-}" <<'PYEOF'
import sys, yaml
pb = yaml.safe_load(open("playbooks/reference.yaml"))
pb["version"] = ["cat", sys.argv[2]]
if sys.argv[3]:
    pb["command"] = pb["command"] + [sys.argv[3]]
yaml.safe_dump(pb, open(sys.argv[1], "w"))
PYEOF
}
book plain; book slowed --slowdown
PATH=$(dirname "$PY"):$PATH  # the playbook's python3: the node's, with torch
one_run() {  # one_run N WHAT PLAYBOOK
  step "fleet run $1: $2"
  fleet_log "run-$1.txt" run "$3"
  expect "changes: run $1 ($2) complete" "$D/run-$1.txt" 0 ": complete" "total GPU kernel time on"
}
{
echo "nsys: $NSYS; store: $FLEET_STORE"
gpu_idle
for i in 1 2 3 4 5; do one_run "$i" "v1" "$CHECK_TMP/plain.yaml"; done
tenant_up; sleep 5
step "fleet run 6: v1 beside a tenant"
fleet_log run-6.txt run "$CHECK_TMP/plain.yaml"
tenant_down
step "lock the GPU's clocks low (this disposable machine's GPU, no other tenant): nvidia-smi -lgc 990,990"
if nvidia-smi -i 0 -lgc 990,990 > "$D/clocks-locked.txt" 2>&1; then LOCKED=1; WERE_LOCKED=1; cat "$D/clocks-locked.txt"
else echo "the clocks cannot be locked here: $(tail -1 "$D/clocks-locked.txt"); the environment change is not expected"; fi
for i in 7 8 9 10; do one_run "$i" "v1, clocks ${LOCKED:+locked}${LOCKED:-as they were}" "$CHECK_TMP/plain.yaml"; done
restore_clocks
for i in 11 12 13; do one_run "$i" "v1, clocks restored" "$CHECK_TMP/plain.yaml"; done
echo v2 > "$VERSION_FILE"
for i in 14 15 16 17 18; do one_run "$i" "v2, slowed down" "$CHECK_TMP/slowed.yaml"; done
step "fleet nightly report"
fleet_log report.txt nightly report playbooks/reference.yaml --out "$D/site/nightly.html"
expect "changes: the slowdown is a code change and a regression" "$D/report.txt" 7 \
  "code (recent): workload v1 -> v2" "REGRESSION reference:" "kept out as contaminated: 1 run(s)"
if [ -n "${WERE_LOCKED:-}" ]; then
  expect "changes: the locked clocks are an environment change" "$D/report.txt" 7 "environment: SM clock"
fi
cp "$D/site/nightly.html" "$D/site/nightly.json" "$D/" 2>/dev/null
} 2>&1 | tee "$D/transcript.txt"
