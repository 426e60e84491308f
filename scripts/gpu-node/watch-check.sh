#!/usr/bin/env bash
# Run on a real GPU node (as root): the run watch, through fleet's agent (probe, plan, run: what
# `fleet profile` runs on a node), with the real driver, ncu and nsys.
#  1. another user's CUDA process arrives 10 s into a 40 s ncu run: ncu is stopped, its report
#     kept, the run yielded; the step prints how soon the counters were released
#  2. the same with the agent inside a PID namespace and the tenant outside (memory only)
#  3. a workload that exits 3, under ncu and under nsys: its status and ncu's error line recorded
#  4. a workload that segfaults under nsys: the signal, and why its kernel summary is empty
#  5. another user's CUDA process arrives about 10 s into a 30 s nsys --gpu-metrics run: nsys stop of
#     the run's session ends the collection, the report keeps its kernels, the workload runs on to its
#     end (its own "kernels launched" line after the stop); how soon the metrics were released
#  6. --window 5:10 on a 60 s workload: nsys collects seconds 5 to 15 and exits with its report, the agent
#     stays with the workload to its end (its exit status the run's); the share of its kernels the report holds
# ONLY="session window" runs steps 5 and 6 alone (either word, one of them).
# Transcripts go to $OUT/watch-check/, packed as $OUT/watch-check.tgz.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/watch-check; mkdir -p "$D"
trap 'pack "$TOP" watch-check' EXIT
W=$CHECK_TMP/watch; mkdir -p "$W"; chmod 755 "$W"
APP=$W/app.py; write_app "$APP"; chmod 644 "$APP"
printf 'import os, signal, sys, torch\na = torch.randn(2048, 2048, device="cuda")\nfor _ in range(200):\n    b = a @ a\ntorch.cuda.synchronize()\nprint("workload: ending by", sys.argv[1], flush=True)\nif sys.argv[1] == "segv":\n    os.kill(os.getpid(), signal.SIGSEGV)\nsys.exit(3)\n' > "$W/ends.py"; chmod 644 "$W/ends.py"
# The agent as fleet runs it on a node: probe, plan, run; then what the result says, in lines.
cat > "$W/agent.py" <<'PYEOF'
import json, sys, time
from fleet.agent import node, run, wire
from fleet.plan import LabPart, ProfileRequest, plan
from fleet.policy import NodeState
tool, rd, ncu, nsys = sys.argv[1:5]
metrics = tool == "nsys-metrics"  # nsys with --gpu-metrics
window = (5, 10) if tool == "nsys-window" else None  # --window 5:10
tool = "nsys" if metrics or window else tool
state = NodeState.read(node.probe({"tools": {"ncu": ncu, "nsys": nsys}, "report_dir": rd, "environment_check": False}))
p = plan("gpu-node", state, ProfileRequest(tool=tool, command=tuple(sys.argv[5:]), run_id="watch", gpu_metrics=metrics,
                                           lab=LabPart(gpus=(0,), window=window)))
print("nsys session:", p.session)
if p.status != "ok":
    print("PLAN REFUSED:", p.reasons); sys.exit(5)
started = time.time()
code = run.main({"plan": p.to_json(), "result_line": False})
with open(run.result_path(p)) as f:
    [r] = wire.answers(f.read(), "profile")
print("\n=== result: status %s, agent exit %s" % (r["status"], code))
print("workload:", json.dumps(r.get("workload")), "| profiler_errors:", json.dumps(r.get("profiler_errors")))
print("reports:", [(x["path"].rsplit("/", 1)[-1], x["size"]) for x in r["reports"]])
n = r.get("newcomer")
if n:
    print("newcomer:", json.dumps(n))
    print("started_wall %.3f released_wall %.3f" % (started, started + n["released_s"]))
    print("counters released %.2f s after the agent first saw the newcomer (looks %.2f s apart)"
          % (n["overlap_s"], n["appeared_s"] - (n["last_clear_s"] or 0)))
for note in r["notes"]:
    print("note:", note)
for summary in r.get("summaries") or []:
    if summary["path"].endswith("_cuda_gpu_kern_sum.csv"):
        with open(summary["path"]) as f:
            rows = [line.split(",") for line in f.read().splitlines()[1:]]
        print("kernels in the report: %d" % sum(int(row[2]) for row in rows if len(row) > 2 and row[2].isdigit()))
c = r.get("conditions") or {}
print("conditions:", json.dumps(c.get("gpus")), len(c.get("samples") or []), "samples, e.g.",
      json.dumps((c.get("samples") or [None])[len(c.get("samples") or [None]) // 2]))
PYEOF
agent() {  # agent FILE PREFIX... TOOL CMD...: the agent (PREFIX: unshare ... or nothing), logged
  local f=$1; shift
  local t=$SECONDS
  { echo "\$ $(q "$@")"; "$@"; echo "(exit status $? after $((SECONDS - t))s)"; } > "$D/$f" 2>&1
  grep -v '==PROF== Profiling' "$D/$f" | tail -25
}
# tenant_at SECONDS: another user's CUDA process started then; it writes when its CUDA is up.
tenant_at() {
  id tenant >/dev/null 2>&1 || useradd -m tenant
  install -d -o tenant -m 700 "$CHECK_TMP/tenant"; rm -f "$TENANT_PID" "$CHECK_TMP/tenant/up"
  ( sleep "$1"; su tenant -c "env -u PYTHONPATH CUDA_VISIBLE_DEVICES=0 $PY -c 'import os, time, torch
x = torch.ones(1 << 28, device=\"cuda\"); torch.cuda.synchronize()
open(\"$CHECK_TMP/tenant/up\", \"w\").write(\"%.3f\" % time.time()); open(\"$TENANT_PID\", \"w\").write(str(os.getpid()))
time.sleep(120)'" ) &
}
# released FILE: seconds from the tenant's CUDA being up to the counters' release (wall clocks)
released() {
  local up rel; up=$(cat "$CHECK_TMP/tenant/up" 2>/dev/null); rel=$(sed -n 's/.*released_wall \([0-9.]*\).*/\1/p' "$D/$1")
  [ -n "$up" ] && [ -n "$rel" ] && "$PY" -c "print('counters released %.2f s after the tenant had CUDA up' % ($rel - $up))"
}
printf 'import sys, time, torch\na = torch.randn(2048, 2048, device="cuda")\nend, n = time.time() + float(sys.argv[1]), 0\nwhile time.time() < end:\n    b = a @ a\n    n += 1\n    if n %% 50 == 0:\n        torch.cuda.synchronize()\ntorch.cuda.synchronize()\nprint("workload: kernels launched", n, "ended at %%.3f" %% time.time(), flush=True)\n' > "$W/counts.py"; chmod 644 "$W/counts.py"
{
gpu_idle
want() { [ -z "${ONLY:-}" ] || [[ " $ONLY " == *" $1 "* ]]; }  # want STEP: ONLY names it, or nothing
if [ -z "${ONLY:-}" ]; then
step "another user's CUDA process 10 s into a 40 s ncu run"
tenant_at 6  # its CUDA is up about 4 s after it starts
agent 1-ncu-tenant.txt "$PY" "$W/agent.py" ncu "$W/r1" "$NCU" "$NSYS" "$PY" "$APP" 40
released 1-ncu-tenant.txt | tee -a "$D/1-ncu-tenant.txt"
expect "watch: ncu yields to a tenant arriving mid-run, its report kept" "$D/1-ncu-tenant.txt" 0 \
  "status yielded" '"user": "tenant"' ".ncu-rep'," "counters released"
tenant_down

step "the same, the agent inside a PID namespace, the tenant outside"
tenant_at 6
agent 2-ncu-ns-tenant.txt unshare --pid --fork --mount-proc "$PY" "$W/agent.py" ncu "$W/r2" "$NCU" "$NSYS" "$PY" "$APP" 40
released 2-ncu-ns-tenant.txt | tee -a "$D/2-ncu-ns-tenant.txt"
expect "watch: in a PID namespace, ncu yields to an unseen tenant outside" "$D/2-ncu-ns-tenant.txt" 0 \
  "status yielded" '"unseen": true' "counters released"
tenant_down

step "a workload that exits 3, under ncu and under nsys"
agent 3-ncu-exit3.txt "$PY" "$W/agent.py" ncu "$W/r3" "$NCU" "$NSYS" "$PY" "$W/ends.py" exit3
expect "watch: ncu, a workload that exits 3: recorded, with ncu's error line" "$D/3-ncu-exit3.txt" 0 \
  '"exit_status": 3' "The application returned an error code (3)."
agent 3-nsys-exit3.txt "$PY" "$W/agent.py" nsys "$W/r3n" "$NCU" "$NSYS" "$PY" "$W/ends.py" exit3
expect "watch: nsys, a workload that exits 3: recorded" "$D/3-nsys-exit3.txt" 0 '"exit_status": 3'

step "a workload that segfaults under nsys"
agent 4-nsys-segv.txt "$PY" "$W/agent.py" nsys "$W/r4" "$NCU" "$NSYS" "$PY" "$W/ends.py" segv
expect "watch: nsys, a workload killed by SIGSEGV: said, and why its kernels are gone" "$D/4-nsys-segv.txt" 0 \
  '"signal": "SIGSEGV"' "died with the process"
fi

if want session; then
step "another user's CUDA process about 10 s into a 30 s nsys --gpu-metrics run: the session stopped, the workload goes on"
tenant_at 6
# nsys's own word on the session's state every 0.2 s (its `sessions list`): when the collection ended. nsys
# keeps its sessions by TMPDIR (a list without the run's own TMPDIR found none): the agent's, the run's private one.
( until [ -e "$W/r5.done" ]; do echo "$(date +%s.%N) $(TMPDIR=$W/r5/watch/.tmp-gpu-node "$NSYS" sessions list 2>&1 |
    awk '$NF == "fleet-watch-gpu-node" {print $3}')"
    sleep 0.2; done ) > "$D/5-session-states.txt" 2>&1 &
STATES=$!  # waited for by pid: a bare `wait` would also wait out the tenant's 120 s sleep
agent 5-nsys-metrics-tenant.txt "$PY" "$W/agent.py" nsys-metrics "$W/r5" "$NCU" "$NSYS" "$PY" "$W/counts.py" 30
touch "$W/r5.done"; wait "$STATES"
released 5-nsys-metrics-tenant.txt | tee -a "$D/5-nsys-metrics-tenant.txt"
# the state's changes, and how long after the tenant's CUDA was up the collection was seen to end
awk -v up="$(cat "$CHECK_TMP/tenant/up" 2>/dev/null)" '$2 != last {printf "%s %s", $1, $2; if (up) printf " (%+.2f s from the tenant up)", $1 - up; print ""; last = $2}' \
  "$D/5-session-states.txt" | tee -a "$D/5-nsys-metrics-tenant.txt"
expect "watch: nsys --gpu-metrics yields through its session, kernels kept, the workload runs on" \
  "$D/5-nsys-metrics-tenant.txt" 0 "status yielded" '"user": "tenant"' "through its session (nsys stop)" \
  "workload: kernels launched" '"exit_status": 0' "counters released" "!kernels in the report: 0" "kernels in the report"
tenant_down
fi

if want window; then
step "--window 5:10 on a 60 s workload: the report covers the window, the workload runs its 60 s"
agent 6-nsys-window.txt "$PY" "$W/agent.py" nsys-window "$W/r6" "$NCU" "$NSYS" "$PY" "$W/counts.py" 60
"$PY" - "$D/6-nsys-window.txt" <<'PYEOF' | tee -a "$D/6-nsys-window.txt"
import re, sys
text = open(sys.argv[1]).read()
kept, launched = re.search(r"kernels in the report: (\d+)", text), re.search(r"kernels launched (\d+)", text)
if kept and launched:
    print("the report holds %.1f%% of the workload's kernels: about %.1f s of its 60 s"
          % (100.0 * int(kept.group(1)) / int(launched.group(1)), 60.0 * int(kept.group(1)) / int(launched.group(1))))
PYEOF
expect "watch: --window 5:10, the report of the window, the workload on to its end" "$D/6-nsys-window.txt" 0 \
  "status ok" "(--window) and wrote its report; the workload went on and ended by itself (exit status 0)" \
  "workload: kernels launched" "!kernels in the report: 0" "of its 60 s"
fi
gpu_idle
} 2>&1 | tee "$D/transcript.txt"
