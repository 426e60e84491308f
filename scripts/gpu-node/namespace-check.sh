#!/usr/bin/env bash
# Run on a real GPU node (as root): fleet inside its own PID namespace (`unshare --pid --fork
# --mount-proc`, as in a container or a pod), where NVML lists only that namespace's processes.
#  1. another user's CUDA process outside, fleet inside: probe says what is unseen, with figures;
#     ncu refused; nsys trace allowed with a warning
#  2. no tenant, fleet inside: ncu allowed (nothing holds GPU memory), or refused with the reason
#  3. fleet on the host, a tenant inside a namespace: the tenant is named, ncu refused
#  4. a measurement: what NVML lists, from inside a namespace, of a CUDA process of that namespace
# Transcripts go to $OUT/namespace-check/, packed as $OUT/namespace-check.tgz.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/namespace-check; mkdir -p "$D"
trap 'pack "$TOP" namespace-check' EXIT
export FLEET_STORE=$D/store
APP=$D/app.py
write_app "$APP"
# ns_log FILE ARG...: fleet_log, with fleet in a new PID namespace (and its own /proc).
ns_log() {
  local f=$1; shift
  local t=$SECONDS
  { echo "\$ unshare --pid --fork --mount-proc $(q "$PY" -m fleet "$@")"
    unshare --pid --fork --mount-proc "$PY" -m fleet "$@"; echo "(exit status $? after $((SECONDS - t))s)"; } > "$D/$f" 2>&1
  cat "$D/$f"
}

{
step "another user's CUDA process outside, fleet inside a PID namespace"
gpu_idle
tenant_up
ns_log 1-probe-ns-tenant.txt probe
expect "namespace: probe inside says what it cannot see, with figures" "$D/1-probe-ns-tenant.txt" 0 "UNSEEN" "GiB in use by processes not visible from here"
ns_log 1-ncu-ns-tenant.txt profile --hosts localhost --tool ncu --gpu 0 -- "$PY" "$APP" 1
expect "namespace: ncu refused beside a tenant it cannot list" "$D/1-ncu-ns-tenant.txt" 5 "unseen tenant" "not visible from here"
ns_log 1-nsys-ns-tenant.txt doctor
expect "namespace: doctor allows nsys trace with a warning, refuses ncu" "$D/1-nsys-ns-tenant.txt" 0 "warning: GPU 0" "REFUSED"
tenant_down

step "no tenant, fleet inside a PID namespace"
ns_log 2-ncu-ns-alone.txt profile --hosts localhost --tool ncu --gpu 0 -X --launch-count -X 3 -- "$PY" "$APP" 1
expect "namespace: ncu allowed on a GPU nothing holds" "$D/2-ncu-ns-alone.txt" 0 ".ncu-rep (" "verified"
gpu_idle

step "fleet on the host, another user's CUDA process inside a PID namespace"
id tenant >/dev/null 2>&1 || useradd -m tenant
install -d -o tenant -m 700 "$CHECK_TMP/tenant"; rm -f "$CHECK_TMP/tenant/ns.ready"
unshare --pid --fork --kill-child --mount-proc su tenant -c "env -u PYTHONPATH $PY -c 'import time, torch
x = torch.ones(1 << 28, device=\"cuda\"); torch.cuda.synchronize()
open(\"$CHECK_TMP/tenant/ns.ready\", \"w\").write(\"up\"); time.sleep(120)'" &
NS_TENANT=$!
for _ in $(seq 1 60); do [ -s "$CHECK_TMP/tenant/ns.ready" ] && break; sleep 1; done
fleet_log 3-probe-host.txt probe
fleet_log 3-ncu-host.txt profile --hosts localhost --tool ncu --gpu 0 -- "$PY" "$APP" 1
expect "namespace: from the host, a tenant inside a namespace is named" "$D/3-probe-host.txt" 0 "FOREIGN" "tenant"
expect "namespace: from the host, ncu refused beside it" "$D/3-ncu-host.txt" 5 "belongs to another user"

step "measured: NVML inside a namespace, of a CUDA process of that namespace"
{ echo "\$ unshare --pid --fork --mount-proc (a CUDA process and NVML's lists, both inside)"
  unshare --pid --fork --mount-proc env -u PYTHONPATH "$PY" -c '
import os, subprocess, sys, time, pynvml as nv
child = subprocess.Popen([sys.executable, "-c", "import time, torch; x = torch.ones(1 << 26, device=\"cuda\"); torch.cuda.synchronize(); time.sleep(30)"])
time.sleep(12)
nv.nvmlInit(); h = nv.nvmlDeviceGetHandleByIndex(0)
print("inside: my pid", os.getpid(), "the CUDA child pid", child.pid)
print("compute list:", [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)])
m = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2); print("v2 used", m.used, "reserved", m.reserved)
try: print("samples:", sorted(set(s.pid for s in nv.nvmlDeviceGetProcessUtilization(h, 0))))
except nv.NVMLError as e: print("samples:", e)
print("/proc/%d/status NSpid:" % child.pid, [l for l in open("/proc/%d/status" % child.pid) if l.startswith("NSpid")])
child.kill()'; echo "(exit status $?)"; } > "$D/4-measured-own-process-in-ns.txt" 2>&1
cat "$D/4-measured-own-process-in-ns.txt"
kill "$NS_TENANT" 2>/dev/null; wait "$NS_TENANT" 2>/dev/null; rm -f "$CHECK_TMP/tenant/ns.ready"
gpu_idle
} 2>&1 | tee "$D/transcript.txt"
