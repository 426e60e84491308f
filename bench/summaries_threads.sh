#!/usr/bin/env bash
# On a GPU node (as root), from a folder holding fleet/: the three summaries of one export made
# with one thread per summary and with the large tables in spans sorted in threads
# (fleet/agent/summaries.py), timed, compared with each other byte for byte and with what
# `nsys stats` writes from the same export. The export is of 10 s of small kernels
# (bench/time_to_report.sh's workload), traced with -t cuda,nvtx,osrt.
# DEPS: the libdw1/libelf1 .debs nsys's importer needs.
set -u
cd "$(dirname "$0")/.." || exit 1
PY=${PY:-/opt/torch/.venv/bin/python3}
T=$(mktemp -d)
if [ -n "${DEPS:-}" ]; then
  for f in "$DEPS"/*.deb; do dpkg -x "$f" "$T/dw"; done
  export LD_LIBRARY_PATH=$T/dw/usr/lib/x86_64-linux-gnu
fi
NSYS=${NSYS:-$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys | head -1)}
cat > "$T/k.py" <<'PYEOF'
import time, torch
x = torch.zeros(256, device="cuda"); torch.cuda.synchronize(); end = time.time() + 10
while time.time() < end:
    torch.cuda.nvtx.range_push("step")
    for _ in range(100): x.add_(1)
    torch.cuda.synchronize(); torch.cuda.nvtx.range_pop()
PYEOF
"$NSYS" profile -t cuda,nvtx,osrt -o "$T/r" "$PY" "$T/k.py" > /dev/null 2>&1
"$NSYS" export --type sqlite -o "$T/r.sqlite" "$T/r.nsys-rep" > /dev/null 2>&1; ls -la "$T/r.sqlite"
PYTHONPATH=$PWD "$PY" - "$T/r.sqlite" <<'PYEOF'
import sys, time
from fleet.agent import summaries as S
export, names = sys.argv[1], ["cuda_gpu_kern_sum", "cuda_api_sum", "nvtx_sum"]
every_cpu = S.cpus
for label, cpus in (("one", lambda: 1), ("spans", every_cpu)):
    S.cpus = cpus
    t = time.perf_counter()
    failed = S.write(export, names, lambda n: "%s.%s.%s.csv" % (export, n, label))
    print("%s thread(s) per summary (%d CPUs): all three summaries %.2f s %s" % (
        label, cpus(), time.perf_counter() - t, failed or ""))
PYEOF
for n in cuda_gpu_kern_sum cuda_api_sum nvtx_sum; do
  cmp "$T/r.sqlite.$n.one.csv" "$T/r.sqlite.$n.spans.csv" && echo "SAME $n, one thread and spans"
done
"$NSYS" stats -q --report cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum --format csv --output "$T/st" "$T/r.sqlite" > /dev/null 2>&1
for n in cuda_gpu_kern_sum cuda_api_sum nvtx_sum; do cmp "$T/st_$n.csv" "$T/r.sqlite.$n.spans.csv" && echo "MATCH nsys stats $n"; done
