# Sourced by the GPU-node checks: the node's Python with torch, fleet on PYTHONPATH, nsys's
# importer libraries (DEPS: a folder of libdw1/libelf1 .debs), the nsys inside Nsight Compute.
PY=${PY:-/opt/torch/.venv/bin/python3}  # by full path: another user's python3 may be another one
export PYTHONPATH=$PWD
if [ -n "${DEPS:-}" ]; then
  for f in "$DEPS"/*.deb; do dpkg -x "$f" /tmp/dw; done
  export LD_LIBRARY_PATH=/tmp/dw/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
NSYS=$(ls /opt/nvidia/nsight-compute/*/host/target-linux-x64/nsys | head -1)
step() { echo; echo "### $*"; }

# A CUDA workload: SGEMMs in an NVTX range for SECONDS (default 2), then its rank, if any.
write_app() {
  cat > "$1" <<'PYEOF'
import os, sys, time, torch
seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 2
a = torch.randn(2048, 2048, device="cuda")
end = time.time() + seconds
with torch.cuda.nvtx.range("fleet-check"):
    while time.time() < end:
        b = a @ a
        torch.cuda.synchronize()
print("app done, rank", os.environ.get("RANK", os.environ.get("SLURM_PROCID")), flush=True)
PYEOF
}
