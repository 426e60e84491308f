# Sourced by profile-check.sh, in its transcript block: the steps fork, timeout, nonroot, gather,
# and the store check at the end. Uses its D, STORE, APP, PY, has and common.sh's helpers.

if has fork; then
step "a workload that forks: the parent forks a child that runs the app, and waits for it"
printf 'import os, sys\npid = os.fork()\nif pid == 0:\n    os.execv(sys.executable, [sys.executable] + sys.argv[1:])\n_, status = os.waitpid(pid, 0)\nprint("parent done, child status", status, flush=True)\nsys.exit(os.waitstatus_to_exitcode(status))\n' > "$D/forking.py"
fleet_log 9-fork.txt profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$D/forking.py" "$APP" 2
expect "profile: a workload that forks its CUDA child, report home" "$D/9-fork.txt" 0 ": ok" ".nsys-rep (" "verified" "app done" "parent done"
gpu_idle
fi

if has timeout; then
step "--timeout 12 on a 30 s workload: nsys stops it (--duration), the report finished with its kernels"
# A signal to nsys or to the workload loses every kernel (record-check); nsys's own --duration keeps them.
# 12 s, not 5: on a fresh machine torch and CUDA took over 5 s to start, the GPU first busy 6.2 s into
# the run (2026-12-01, 23:02 UTC), so a 5 s limit ended the workload before its first kernel.
fleet_log 10-timeout.txt profile --hosts localhost --gpu 0 --store "$STORE" --timeout 12 -X --trace=cuda,nvtx -- "$PY" "$APP" 30
expect "profile: --timeout 12 stops a 30 s workload, said, report home with its kernels" "$D/10-timeout.txt" 0 \
  "the workload was stopped at its time limit of 12s, by nsys (--duration)" "verified" ".nsys-rep (" \
  "_cuda_gpu_kern_sum.csv (" "!_cuda_gpu_kern_sum.csv (0 bytes" "!app done"
gpu_idle
fi

if has nonroot; then
step "a non-root user, kernel.perf_event_paranoid owned in the inventory: without sudo, then with it"
id fleetuser >/dev/null 2>&1 || useradd -m fleetuser
# fleet and its wheels, world-readable, for a user who cannot enter root's $CHECK_TMP/site.
U=$CHECK_TMP/fleetuser; rm -rf "$U"; mkdir -p "$U/py" "$U/home"; chmod 755 "$U" "$U/py"
cp -r fleet "$U/py/"; for d in ${PYTHONPATH//:/ }; do [ -d "$d" ] && [ "$d" != "$PWD" ] && cp -r "$d"/. "$U/py/"; done
chmod -R a+rX "$U/py"; chown fleetuser "$U/home"
printf 'all:\n  hosts:\n    localhost:\n      ansible_connection: local\n      ansible_python_interpreter: %s\n      owned_sysctls:\n        kernel.perf_event_paranoid: 2\n' "$PY" > "$U/inventory.yaml"
chmod 644 "$U/inventory.yaml"
ORIG=$(cat /proc/sys/kernel/perf_event_paranoid); sysctl -qw kernel.perf_event_paranoid=3
trap 'sysctl -qw kernel.perf_event_paranoid="$ORIG"; pack "$TOP" profile-check' EXIT
note_skip() { echo "SKIP  $*"; echo "SKIP  $*" >> "$RESULTS"; }
as_user() {  # as_user FILE ARG...: fleet_log, run as fleetuser with its own store
  local f=$1; shift
  local t=$SECONDS
  { echo "\$ (as fleetuser) $(q "$PY" -m fleet -i "$U/inventory.yaml" "$@")"
    su fleetuser -s /bin/sh -c "cd $(q "$U/home") && HOME=$(q "$U/home") PYTHONPATH=$(q "$U/py") LD_LIBRARY_PATH=$(q "${LD_LIBRARY_PATH:-}") FLEET_STORE=$(q "$U/home/store") FLEET_NODE_CONFIG=$(q "$U/node.json") exec $(q "$PY" -m fleet -i "$U/inventory.yaml" "$@")"
    echo "(exit status $? after $((SECONDS - t))s)"; } > "$D/$f" 2>&1
  cat "$D/$f"
}
cp "$APP" "$U/app.py"; chmod 644 "$U/app.py"
echo "perf_event_paranoid before: $(cat /proc/sys/kernel/perf_event_paranoid)"
as_user 11-nonroot-no-sudo.txt profile --hosts localhost --gpu 0 -X --trace=cuda,nvtx -- "$PY" "$U/app.py" 2
expect "profile: non-root without sudo: said, sampling given up, run ok" "$D/11-nonroot-no-sudo.txt" 0 \
  "could not set kernel.perf_event_paranoid" "run as root, have an admin allow it without a password (sudoers)" \
  "gave up:" ".nsys-rep (" "verified"
if ! command -v sudo >/dev/null; then
  note_skip "profile: non-root with sudo for it: this node has no sudo"
else
SUDOERS=/etc/sudoers.d/fleet-matrix-$$
trap 'rm -f "$SUDOERS"; sysctl -qw kernel.perf_event_paranoid="$ORIG"; pack "$TOP" profile-check' EXIT
# Root through sudo sets only what the node's root-owned config lists: this run's own, let through sudo.
printf '{"owned_sysctls": {"kernel.perf_event_paranoid": 2}}\n' > "$U/node.json"; chmod 644 "$U/node.json"
printf 'Defaults:fleetuser env_keep += "FLEET_NODE_CONFIG"\nfleetuser ALL=(root) NOPASSWD: %s\n' "$PY" > "$SUDOERS"  # the agent re-runs itself as root: sudo -n $PY -c ...
chmod 440 "$SUDOERS"
visudo -cf "$SUDOERS" || echo "sudoers line rejected"
( while sleep 0.5; do cat /proc/sys/kernel/perf_event_paranoid; done ) > "$D/11b-paranoid-seen.txt" &
WATCH=$!
as_user 11b-nonroot-sudo.txt profile --hosts localhost --gpu 0 -X --trace=cuda,nvtx -- "$PY" "$U/app.py" 3
kill "$WATCH"; wait "$WATCH" 2>/dev/null
AFTER=$(cat /proc/sys/kernel/perf_event_paranoid)
echo "perf_event_paranoid during the run: $(sort -u "$D/11b-paranoid-seen.txt" | tr '\n' ' '); after: $AFTER" | tee -a "$D/11b-nonroot-sudo.txt"
grep -qx 2 "$D/11b-paranoid-seen.txt" && [ "$AFTER" = 3 ] && echo "sysctl held and restored" >> "$D/11b-nonroot-sudo.txt"
expect "profile: non-root with sudo for it: the sysctl held and restored" "$D/11b-nonroot-sudo.txt" 0 \
  "sysctl held and restored" ".nsys-rep (" "verified" "!could not set"
rm -f "$SUDOERS"; trap 'sysctl -qw kernel.perf_event_paranoid="$ORIG"; pack "$TOP" profile-check' EXIT
fi
sysctl -qw kernel.perf_event_paranoid="$ORIG"; trap 'pack "$TOP" profile-check' EXIT
gpu_idle
fi

if has gather; then
step "the fleet client SIGKILLed mid-run: fleet gather brings the report home, fleet repair finds nothing"
F=$D/12-client-killed.txt
( echo "\$ $(q "$PY" -m fleet profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 8)  (fleet SIGKILLed once nsys runs)"
  exec "$PY" -m fleet profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 8 ) > "$F" 2>&1 &
CLIENT=$!
NSYS_PID="" RUN_DIR=""
# The first nsys below the client may be the probe's short `nsys --version`: wait for the one that
# profiles, whose --output= names the run's folder.
for _ in $(seq 1 600); do
  for p in $(descendants_named "$CLIENT" nsys); do
    RUN_DIR=$(output_dir_of "$p"); [ -n "$RUN_DIR" ] && { NSYS_PID=$p; break 2; }
  done
  sleep 0.1
done
RUN_ID=$(basename "${RUN_DIR:-none}")
sleep 2; echo "SIGKILL to the fleet client: $CLIENT (run ${RUN_ID:-unknown}, its nsys $NSYS_PID)" >> "$F"
kill -KILL "$CLIENT"; wait "$CLIENT" 2>/dev/null
for _ in $(seq 1 600); do kill -0 "$NSYS_PID" 2>/dev/null || break; sleep 0.5; done  # the node's run ends
sleep 5; cat "$F"
fleet_log 12b-gather.txt gather "${RUN_ID:-none}" --store "$STORE"
expect "gather: a killed client's report brought home" "$D/12b-gather.txt" 0 ": ok" ".nsys-rep (verified)"
fleet_log 12c-repair.txt repair localhost
expect "repair: nothing left changed after the killed client" "$D/12c-repair.txt" 0 "nothing to put back"
gpu_idle
fi

step "the store checked: every catalogued report's sha256 matches its file"
fleet_log 13-reports-ls.json reports ls --store "$STORE" --json
"$PY" - "$D/13-reports-ls.json" > "$D/13-store-check.txt" 2>&1 <<'PYEOF'
import hashlib, json, sys
text = open(sys.argv[1]).read()
doc = json.loads(text[text.index("\n") + 1:text.rindex("\n(exit status")])
data = doc.get("data", doc) if isinstance(doc, dict) else doc  # fleet's --json envelope
rows = data.get("reports", []) if isinstance(data, dict) else data
bad = 0
for r in rows:
    if not r.get("sha256") or not r.get("path"):
        continue
    try:
        got = hashlib.sha256(open(r["path"], "rb").read()).hexdigest()
    except OSError as e:
        got = str(e)
    bad += got != r["sha256"]
    print("ok  " if got == r["sha256"] else "BAD ", r["run_id"], r["path"])
print("%d reports checked, %d mismatched" % (sum(1 for r in rows if r.get("sha256") and r.get("path")), bad))
print("(exit status %d)" % (1 if bad else 0))
PYEOF
cat "$D/13-store-check.txt"
expect "store: every catalogued report matches its sha256" "$D/13-store-check.txt" 0 " 0 mismatched"
