#!/usr/bin/env bash
# Run on a real GPU node (as root): fleet top with the GPU free and beside another user's CUDA
# process; fleet profile --gpu free refused beside it and run with the GPU free; the look's agent's CPU
# per sample at 1 Hz; and ncu's kernel count with and without a
# look running beside it (ncu must report no error and profile as many kernels). Transcripts go to
# $OUT/top-check/, packed as $OUT/top-check.tgz.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/top-check; mkdir -p "$D"
trap 'pack "$TOP" top-check' EXIT
export FLEET_STORE=$D/store
W=$CHECK_TMP/top; mkdir -p "$W"; chmod 755 "$W"
APP=$W/app.py; write_app "$APP"; chmod 644 "$APP"
# A workload of a fixed number of kernels, for ncu alone and beside a look: APP runs for a time, and
# ncu's replay slows it by as much as the machine happens to, so its kernel count is not the same twice.
FIXED=$W/fixed.py; cat > "$FIXED" <<'PYEOF'
import torch
a = torch.randn(2048, 2048, device="cuda")
for _ in range(12):
    b = a @ a
torch.cuda.synchronize()
print("fixed done: 12 matrix products", flush=True)
PYEOF
chmod 644 "$FIXED"

# ncu_kernels FILE: the kernels ncu's report in FILE lists (one "..., Context N, Stream M, ..." line each).
ncu_kernels() { grep -c ', Context [0-9]*, Stream [0-9]*' "$1"; }

{
step "the GPU free"
gpu_idle
fleet_log top-free.txt top --once
fleet_log top-free.json top --once --json
expect "top --once: GPU free" "$D/top-free.txt" 0 " free " " ok " "!shared"

step "beside another user's CUDA process"
tenant_up
fleet_log top-tenant.txt top --once
fleet_log top-tenant.json top --once --json
expect "top --once: the tenant named, ncu refused" "$D/top-tenant.txt" 0 "tenant:$(cat "$TENANT_PID")" "shared" "refused"
expect "top --once --json: the tenant's process, ncu refused" "$D/top-tenant.json" 0 '"user": "tenant"' '"ncu": "refused"' '"free": false'
fleet_log top-free-only.txt top --once --free
expect "top --once --free: no GPU free beside the tenant" "$D/top-free-only.txt" 0 "HOST" "! free " "! ok " "!shared"
step "fleet profile --gpu free beside the tenant: no free GPU on this one-GPU node"
fleet_log gpu-free-tenant.txt profile --hosts localhost --gpu free --tool ncu --store "$D/store" -- "$PY" "$APP" 1
expect "profile --gpu free beside a tenant: refused, the tenant named" "$D/gpu-free-tenant.txt" 5 "no free GPU here" \
  "belongs to another user"
tenant_down

step "fleet profile --gpu free with the GPU free"
fleet_log gpu-free.txt profile --hosts localhost --gpu free --tool ncu --store "$D/store" -X --launch-count -X 3 \
  -- "$PY" "$APP" 1
expect "profile --gpu free, the GPU free: ncu ran on it" "$D/gpu-free.txt" 0 "GPU 0 chosen" ".ncu-rep ("

step "the look's agent: CPU per sample at 1 Hz (20 samples)"
{ echo "\$ $(q "$PY" -m fleet top --json --interval 1 --count 22)"
  "$PY" -m fleet top --json --interval 1 --count 22 > "$W/look.jsonl" 2>&1 &
  FLEET=$!; sleep 3
  AGENT=$(for p in $(ps -o pid= --ppid "$FLEET"); do grep -q '"mode":"look"' "/proc/$p/cmdline" && echo "$p"; done | head -1)
  ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
  t0=$(ticks "$AGENT"); s0=$(grep -c '"seq"' "$W/look.jsonl"); sleep 15
  t1=$(ticks "$AGENT"); s1=$(grep -c '"seq"' "$W/look.jsonl"); wait "$FLEET"
  HZ=$(getconf CLK_TCK)
  awk -v t="$((t1 - t0))" -v n="$((s1 - s0))" -v hz="$HZ" 'BEGIN {
    ms = 1000 * t / hz / n; printf "agent pid '"$AGENT"': %d ticks (%d per s) over %d samples: %.2f ms per sample, %.2f %% of one core at 1 Hz\n", t, hz, n, ms, ms / 10
    exit (ms < 10 ? 0 : 1) }'
  echo "(exit status $?)"; } > "$D/agent-cpu.txt" 2>&1
cat "$D/agent-cpu.txt"
expect "top: the agent's CPU per sample under 1 % of one core at 1 Hz" "$D/agent-cpu.txt" 0 "per sample"

step "ncu alone, then with a look beside it"
{ echo "\$ $(q "$NCU" --clock-control none -c 30 "$PY" "$FIXED")"
  "$NCU" --clock-control none -c 30 "$PY" "$FIXED" > "$W/ncu-alone.txt" 2>&1; echo "ncu exit $?"
  echo "kernels profiled: $(ncu_kernels "$W/ncu-alone.txt")"; grep -E '==ERROR==' "$W/ncu-alone.txt"
  "$PY" -m fleet top --json --interval 0.5 > "$W/look-ncu.jsonl" 2>&1 &
  FLEET=$!; sleep 3
  "$NCU" --clock-control none -c 30 "$PY" "$FIXED" > "$W/ncu-look.txt" 2>&1; echo "ncu exit $? (with the look)"
  kill -INT "$FLEET"; wait "$FLEET"
  echo "kernels profiled with the look: $(ncu_kernels "$W/ncu-look.txt"); samples the look took meanwhile: $(grep -c '"seq"' "$W/look-ncu.jsonl")"
  grep -E '==ERROR==' "$W/ncu-look.txt"
  a=$(ncu_kernels "$W/ncu-alone.txt"); b=$(ncu_kernels "$W/ncu-look.txt")
  [ "$a" -gt 0 ] && [ "$a" = "$b" ] && ! grep -q '==ERROR==' "$W/ncu-look.txt"; echo "(exit status $?)"; } > "$D/ncu-beside.txt" 2>&1
cat "$D/ncu-beside.txt"; cp "$W/ncu-alone.txt" "$W/ncu-look.txt" "$D/"
expect "top beside ncu: no ncu error, the same kernel count" "$D/ncu-beside.txt" 0 "kernels profiled with the look"
} 2>&1 | tee "$D/transcript.txt"
