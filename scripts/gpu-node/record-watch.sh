#!/usr/bin/env bash
# Run on a real GPU node (as root), no fleet in between: what the real tools and driver do in the
# cases fleet's run watch handles, recorded raw for the fake NVML and the stand-ins:
#  - a workload that exits 3, and one killed by SIGSEGV, under ncu and under nsys (+ nsys stats)
#  - SIGINT to ncu's process group mid-profiling (Ctrl-C), and to ncu alone: how long until ncu
#    exits (the counters released), what it prints, what the workload does
#  - what NVML answers for clocks, clock event (throttle) reasons, temperature, power and PCI
#    info, idle, under ncu, beside a tenant; each call's cost; which calls are NOT_SUPPORTED
#  - when a new CUDA process first shows in NVML (process list, memory) after it starts
# Each case is a folder of $OUT/record-watch/ (cmd.txt, output.txt, status.txt, files.txt,
# signal.txt, timing.txt), packed as $OUT/record-watch.tgz; reports are listed, not kept.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/record-watch; mkdir -p "$D"
trap 'pack "$TOP" record-watch' EXIT
W=$CHECK_TMP/recw; mkdir -p "$W"; chmod 755 "$W"
APP=$W/app.py; write_app "$APP"; chmod 644 "$APP"
# ends.py HOW: a few SGEMMs, then exit 3 (HOW=exit3) or SIGSEGV to itself (HOW=segv)
cat > "$W/ends.py" <<'PYEOF'
import os, signal, sys, torch
a = torch.randn(2048, 2048, device="cuda")
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    b = a @ a
torch.cuda.synchronize()
print("workload: ending by", sys.argv[1], flush=True)
if sys.argv[1] == "segv":
    os.kill(os.getpid(), signal.SIGSEGV)
sys.exit(3)
PYEOF
STATS="stats -q --report cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum --format csv"
record() {
  local c=$D/$1; shift; mkdir -p "$c"
  q "$@" > "$c/cmd.txt"
  "$@" > "$c/output.txt" 2>&1; echo $? > "$c/status.txt"
  echo "== $(basename "$c"): exit $(cat "$c/status.txt")"; cut -c1-300 "$c/output.txt" | tail -12
}
left() { (cd "$2" && find . -maxdepth 1 -type f -newer "$D/$1/cmd.txt" -printf '%s %P\n' | sort -k2) > "$D/$1/files.txt"; cat "$D/$1/files.txt"; }
# sigint CASE AFTER WHAT CMD...: CMD started in its own process group; SIGINT after AFTER s to
# WHAT (group: the group, as Ctrl-C; ncu: ncu's pid alone); times to ncu's and the app's end.
sigint() {
  local c=$D/$1 after=$2 what=$3; shift 3; mkdir -p "$c"
  q "$@" > "$c/cmd.txt"
  setsid "$@" > "$c/output.txt" 2>&1 &
  local pid=$! app t0
  sleep "$after"
  app=$(descendants_named "$pid" 'python3.*' | head -1)
  t0=$(date +%s.%N)
  if [ "$what" = group ]; then kill -INT -- -"$pid"; else kill -INT "$pid"; fi
  echo "kill -INT $([ "$what" = group ] && echo "-- -$pid (ncu's group)" || echo "$pid (ncu alone)") at ${after}s; app pid ${app:-none}" > "$c/signal.txt"
  wait "$pid"; echo $? > "$c/status.txt"
  local t1; t1=$(date +%s.%N)
  echo "ncu exited $("$PY" -c "print(round($t1 - $t0, 3))") s after the signal" > "$c/timing.txt"
  if [ -n "$app" ] && kill -0 "$app" 2>/dev/null; then
    echo "the app (pid $app) still runs after ncu exited" >> "$c/timing.txt"
    for _ in $(seq 1 30); do kill -0 "$app" 2>/dev/null || break; sleep 1; done
    echo "the app ended $("$PY" -c "print(round($(date +%s.%N) - $t0, 3))") s after the signal (or was left after 30 s)" >> "$c/timing.txt"
    kill -9 "$app" 2>/dev/null
  else echo "the app was gone when ncu exited" >> "$c/timing.txt"; fi
  echo "== $(basename "$c"): exit $(cat "$c/status.txt")"; cat "$c/timing.txt"; cut -c1-300 "$c/output.txt" | tail -12
}
{
echo "ncu: $NCU ($("$NCU" --version | tail -1))"; echo "nsys: $NSYS ($("$NSYS" --version))"; nvidia-smi -L
nvidia-smi --query-gpu=driver_version --format=csv,noheader
"$PY" -c 'import pynvml; print("nvidia-ml-py", getattr(pynvml, "__version__", "?"))' 2>&1
gpu_idle
step "NVML's conditions calls, idle"
mkdir -p "$D/nvml-conditions"
cat > "$W/conditions.py" <<'PYEOF'
import json, sys, time, pynvml as nv
nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)
calls = {
 "clock_sm": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM),
 "clock_mem": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM),
 "clock_graphics": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS),
 "clock_video": lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_VIDEO),
 "max_clock_sm": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM),
 "max_clock_mem": lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM),
 "app_clock_sm": lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM),
 "event_reasons": lambda: hex(nv.nvmlDeviceGetCurrentClocksEventReasons(h)),
 "throttle_reasons": lambda: hex(nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)),
 "supported_event_reasons": lambda: hex(nv.nvmlDeviceGetSupportedClocksEventReasons(h)),
 "temperature_gpu": lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
 "power_mw": lambda: nv.nvmlDeviceGetPowerUsage(h),
 "fan_speed": lambda: nv.nvmlDeviceGetFanSpeed(h),
 "pci_bus_id": lambda: nv.nvmlDeviceGetPciInfo(h).busId,
 "pci_bus_id_legacy": lambda: nv.nvmlDeviceGetPciInfo(h).busIdLegacy,
 "uuid": lambda: nv.nvmlDeviceGetUUID(h),
 "mem_v2_used": lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used,
 "compute_procs": lambda: [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)],
}
out = {"label": sys.argv[1]}
for name, fn in calls.items():
    t = time.perf_counter()
    try: v = fn()
    except nv.NVMLError as e: v = "NVMLError: %s (%d)" % (e, e.value)
    except Exception as e: v = "%s: %s" % (type(e).__name__, e)
    out[name] = v if not isinstance(v, bytes) else v.decode()
    out[name + "_us"] = round((time.perf_counter() - t) * 1e6, 1)
t = time.perf_counter()
for _ in range(100):
    nv.nvmlDeviceGetComputeRunningProcesses(h); nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM); nv.nvmlDeviceGetPowerUsage(h)
out["one_look_us"] = round((time.perf_counter() - t) * 1e4, 1)
print(json.dumps(out))
PYEOF
"$PY" "$W/conditions.py" idle | tee "$D/nvml-conditions/idle.json"

step "ncu: a workload that exits 3, one killed by SIGSEGV"
record ncu-app-exit3 "$NCU" --launch-count 2 -o "$W/e3" "$PY" "$W/ends.py" exit3; left ncu-app-exit3 "$W"
record ncu-app-segv "$NCU" --launch-count 2 -o "$W/sg" "$PY" "$W/ends.py" segv; left ncu-app-segv "$W"
step "nsys: a workload that exits 3, one killed by SIGSEGV (after many kernels)"
record nsys-app-exit3 "$NSYS" profile -t cuda,nvtx --sample=none --cpuctxsw=none -o "$W/ne3" "$PY" "$W/ends.py" exit3; left nsys-app-exit3 "$W"
record nsys-app-segv "$NSYS" profile -t cuda,nvtx --sample=none --cpuctxsw=none -o "$W/nsg" "$PY" "$W/ends.py" segv 2000; left nsys-app-segv "$W"
[ -f "$W/nsg.nsys-rep" ] && { mkdir -p "$D/nsys-app-segv-stats"; "$NSYS" $STATS --output "$D/nsys-app-segv-stats/s" "$W/nsg.nsys-rep" > "$D/nsys-app-segv-stats/output.txt" 2>&1; ls -la "$D/nsys-app-segv-stats"; }

step "ncu mid-profiling: SIGINT to its group (Ctrl-C), and to ncu alone; NVML under ncu"
( sleep 6; "$PY" "$W/conditions.py" under-ncu > "$D/nvml-conditions/under-ncu.json" ) &
sigint ncu-sigint-group 10 group "$NCU" --clock-control base -o "$W/ig" "$PY" "$APP" 40; left ncu-sigint-group "$W"
cat "$D/nvml-conditions/under-ncu.json"
sigint ncu-sigint-alone 8 ncu "$NCU" --clock-control base -o "$W/ia" "$PY" "$APP" 20; left ncu-sigint-alone "$W"

step "a tenant's first appearance in NVML, and NVML beside it"
id tenant >/dev/null 2>&1 || useradd -m tenant
mkdir -p "$D/nvml-appearance"
cat > "$W/appear.py" <<'PYEOF'
import subprocess, sys, time, pynvml as nv
nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)
t0 = time.time()
p = subprocess.Popen(["su", "tenant", "-c", "env -u PYTHONPATH %s -c 'import time, torch; t=time.time(); x = torch.ones(1 << 28, device=\"cuda\"); torch.cuda.synchronize(); print(\"tenant: cuda up %%.3f s after its start\" %% (time.time() - t), flush=True); time.sleep(8)'" % sys.argv[1]])
listed = mem = None
base = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used
while time.time() - t0 < 30 and p.poll() is None:
    now = time.time() - t0
    if listed is None and nv.nvmlDeviceGetComputeRunningProcesses(h): listed = now; print("listed at %.3f s" % now, [(q.pid, q.usedGpuMemory) for q in nv.nvmlDeviceGetComputeRunningProcesses(h)], flush=True)
    used = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2).used
    if mem is None and used - base > 64 << 20: mem = now; print("v2 used up %d at %.3f s" % (used - base, now), flush=True)
    if listed is not None and mem is not None: break
    time.sleep(0.02)
print("started at 0, listed at", listed, "memory at", mem)
PYEOF
"$PY" "$W/appear.py" "$PY" > "$D/nvml-appearance/output.txt" 2>&1 &
AP=$!
sleep 5; "$PY" "$W/conditions.py" beside-tenant > "$D/nvml-conditions/beside-tenant.json" 2>&1
wait $AP; cat "$D/nvml-appearance/output.txt"; cat "$D/nvml-conditions/beside-tenant.json"
gpu_idle
} 2>&1 | tee "$D/transcript.txt"
