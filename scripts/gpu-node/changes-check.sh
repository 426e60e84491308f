#!/usr/bin/env bash
# Run on a real GPU node (as root; only with CHECKS=changes, about 6 minutes; CONFIRM=0: 5): the
# nightly reference playbook run 20 times as a nightly history with a known truth, then `fleet nightly report`.
#   runs 1-3   workload version v1 (the playbook's `version` command reads a file the check writes)
#   run 4      v1 with another user's CUDA process on the GPU: contaminated, kept out, not a change
#   runs 5-8   v1 with the GPU's clocks locked low (nvidia-smi -lgc, where the machine allows it;
#              restored on exit whatever happens): an environment change, "SM clock A -> B MHz"
#   runs 9-14  v1, clocks restored: the environment changes back
#   runs 15-20 v2 with the planted slowdown (--slowdown): a code change, "workload v1 -> v2" (6 and 6
#              runs either side: 924 arrangements, so the step at that known place can pass the
#              search's p < 0.005, which 3 and 5 runs, 56 arrangements, cannot)
#   then (unless CONFIRM=0) `fleet nightly confirm`: v1 and v2 rerun A/B/B/A (the playbook's checkout command writes the
#   version file, which the workload's wrapper reads), the slowdown must hold, and the report after it
#   must still count 20 runs
# Expected: the report exits 7 with a REGRESSION line naming the code change, the clock changes
# labelled environment (or, where the clocks cannot be locked, said so and not expected), run 4
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
book() {  # book NAME: the reference playbook, its workload the version the version file names (v2: with
  # the planted --slowdown, as a checkout of the slower code would be), with version and checkout commands
  "$PY" - "$CHECK_TMP/$1.yaml" "$VERSION_FILE" "$CHECK_TMP/workload.sh" "$PWD" <<'PYEOF'
import shlex, sys, yaml
out, version, wrapper, root = sys.argv[1:]
pb = yaml.safe_load(open("playbooks/reference.yaml"))
words = " ".join(shlex.quote(w if i != 1 else f"{root}/{w}") for i, w in enumerate(pb["command"]))
open(wrapper, "w").write(f'case "$(cat {shlex.quote(version)})" in v2) set -- --slowdown ;; *) set -- ;; esac\n'
                         f'exec {words} "$@"\n')
pb["command"] = ["sh", wrapper]
pb["version"] = ["cat", version]
pb["checkout"] = ["sh", "-c", f'printf "%s\\n" "$1" > {shlex.quote(version)}', "sh"]
yaml.safe_dump(pb, open(out, "w"))
PYEOF
}
book plain
PATH=$(dirname "$PY"):$PATH  # the playbook's python3: the node's, with torch
one_run() {  # one_run N WHAT PLAYBOOK
  step "fleet run $1: $2"
  fleet_log "run-$1.txt" run "$3"
  expect "changes: run $1 ($2) complete" "$D/run-$1.txt" 0 "complete: reports in" "total GPU kernel time on"
}
{
echo "nsys: $NSYS; store: $FLEET_STORE"
gpu_idle
for i in 1 2 3; do one_run "$i" "v1" "$CHECK_TMP/plain.yaml"; done
tenant_up; sleep 5
step "fleet run 4: v1 beside a tenant"
fleet_log run-4.txt run "$CHECK_TMP/plain.yaml"
tenant_down
step "lock the GPU's clocks low (this disposable machine's GPU, no other tenant): nvidia-smi -lgc 990,990"
if nvidia-smi -i 0 -lgc 990,990 > "$D/clocks-locked.txt" 2>&1; then LOCKED=1; WERE_LOCKED=1; cat "$D/clocks-locked.txt"
else echo "the clocks cannot be locked here: $(tail -1 "$D/clocks-locked.txt"); the environment change is not expected"; fi
CLOCKS=$([ -n "$LOCKED" ] && echo locked || echo "as they were")
for i in 5 6 7 8; do one_run "$i" "v1, clocks $CLOCKS" "$CHECK_TMP/plain.yaml"; done
restore_clocks
for i in 9 10 11 12 13 14; do one_run "$i" "v1, clocks restored" "$CHECK_TMP/plain.yaml"; done
echo v2 > "$VERSION_FILE"
for i in 15 16 17 18 19 20; do one_run "$i" "v2, slowed down" "$CHECK_TMP/plain.yaml"; done
step "fleet nightly report"
fleet_log report.txt nightly report playbooks/reference.yaml --out "$D/site/nightly.html"
expect "changes: the slowdown is a code change and a regression" "$D/report.txt" 7 \
  "code (recent): workload v1 -> v2" "REGRESSION reference:" "kept out as contaminated: 1 run(s)"
if [ -n "${WERE_LOCKED:-}" ]; then
  expect "changes: the locked clocks are an environment change" "$D/report.txt" 7 "environment: SM clock"
fi
# the GEMMs' own step at v2 (not only the NVTX range's): a change labelled code, on whatever GPU this is
if grep -qE '^  change: kernel \*gemm\* \(.*\) \+[0-9.]+% at run [0-9a-f-]+, code \(recent\): workload v1 -> v2$' "$D/report.txt"
then line="PASS  changes: the GEMMs' slowdown labelled code"; else line="FAIL  changes: the GEMMs' slowdown labelled code"; fi
echo "$line"; echo "$line" >> "$RESULTS"
if [ "${CONFIRM:-1}" != 0 ]; then
step "fleet nightly confirm: v1 and v2 rerun A/B/B/A on the same GPU"
fleet_log confirm.txt nightly confirm "$CHECK_TMP/plain.yaml"
expect "changes: the code change holds when rerun" "$D/confirm.txt" 0 \
  "confirming v1 (A) against v2 (B), the change at run" "holds: kernel *gemm*" "the workload is back at v2"
step "fleet nightly report again: the confirmation's four runs are no nights of the history"
fleet_log report-after.txt nightly report playbooks/reference.yaml --out "$D/site/after.html"
expect "changes: confirm runs kept out of the history" "$D/report-after.txt" 7 "over 20 run(s)" \
  "code (recent): workload v1 -> v2"
fi
cp "$D/site/nightly.html" "$D/site/nightly.json" "$D/" 2>/dev/null
} 2>&1 | tee "$D/transcript.txt"
