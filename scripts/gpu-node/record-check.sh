#!/usr/bin/env bash
# Run on a real GPU node (as root): what the real nsys, ncu, QdstrmImporter and nvidia-smi print,
# write and return in each case fleet handles, recorded raw (no fleet in between), for the
# stand-ins in tests/standins/ to replay. Each case is a folder of $OUT/record-check/: cmd.txt (the
# exact command), output.txt (stdout and stderr as they came), status.txt (the exit status),
# files.txt (what it left: size and name), and the small files it wrote (CSV summaries). Packed
# as $OUT/record-check.tgz; reports are listed, not kept.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/record-check; mkdir -p "$D"
trap 'pack "$TOP" record-check' EXIT
W=$CHECK_TMP/record; mkdir -p "$W"; chmod 755 "$W"
APP=$W/app.py; write_app "$APP"; chmod 644 "$APP"
NOKERNEL=$W/nokernel.py  # CUDA initialised, memory allocated, no kernel launched
printf 'import torch\nx = torch.empty(1 << 20, device="cuda")\ntorch.cuda.synchronize()\nprint("no kernel, done", flush=True)\n' > "$NOKERNEL"
IMPORTER=$(ls /opt/nvidia/nsight-compute/*/host/linux-desktop-glibc_2_11_3-x64/QdstrmImporter 2>/dev/null | head -1)
STATS="stats -q --report cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum --format csv"

# record CASE CMD...: CMD run to its end, recorded in $D/CASE.
record() {
  local c=$D/$1; shift; mkdir -p "$c"
  q "$@" > "$c/cmd.txt"
  "$@" > "$c/output.txt" 2>&1; echo $? > "$c/status.txt"
  echo "== $(basename "$c"): exit $(cat "$c/status.txt")"; cut -c1-300 "$c/output.txt" | tail -15
}
# record_signal CASE SIGNAL AFTER WHAT CMD...: CMD started, SIGNAL sent after AFTER seconds to WHAT
# (nsys: nsys alone, by its pid; tree: nsys and everything below it, by pid; app: the workload alone).
record_signal() {
  local c=$D/$1 sig=$2 after=$3 what=$4; shift 4; mkdir -p "$c"
  q "$@" > "$c/cmd.txt"
  "$@" > "$c/output.txt" 2>&1 &
  local pid=$! victims
  sleep "$after"
  victims=$pid
  [ "$what" = tree ] && victims="$pid $(descendants_named "$pid" '.*' | tr '\n' ' ')"
  [ "$what" = app ] && victims=$(descendants_named "$pid" 'python3.*' | head -1)
  echo "kill -$sig $victims (at ${after}s; nsys is $pid)" > "$c/signal.txt"
  if [ -z "$victims" ]; then echo "nothing to signal: $what not found" >> "$c/signal.txt"; else
    ps -o pid,ppid,comm -p "$(echo $victims | tr ' ' ',')" >> "$c/signal.txt" 2>&1
    kill -"$sig" $victims
  fi
  wait "$pid"; echo $? > "$c/status.txt"
  echo "== $(basename "$c"): $(head -1 "$c/signal.txt"), exit $(cat "$c/status.txt")"; cut -c1-300 "$c/output.txt" | tail -15
}
# left CASE DIR: what the case left in DIR (size, name), and any CSV or .qdstrm listing, kept.
left() { (cd "$2" && find . -maxdepth 1 -type f -newer "$D/$1/cmd.txt" -printf '%s %P\n' | sort -k2) > "$D/$1/files.txt"; cat "$D/$1/files.txt"; }
stats() {  # stats CASE REPORT: nsys stats on REPORT, the CSVs kept in CASE
  record "$1" "$NSYS" $STATS --output "$D/$1/s" "$2"
  ls -la "$D/$1/"
}

{
echo "nsys: $NSYS"; echo "ncu: $NCU"; echo "importer: $IMPORTER"; nvidia-smi -L
gpu_idle
step "versions and environment"
record nsys-version "$NSYS" --version
record nsys-status-root "$NSYS" status -e
id tenant >/dev/null 2>&1 || useradd -m tenant
record nsys-status-user su tenant -c "$(q "$NSYS" status -e)"
record ncu-version "$NCU" --version
record importer-version "$IMPORTER" --version
record nvidia-smi-query nvidia-smi --query-gpu=index,name,uuid,driver_version,mig.mode.current,compute_mode,persistence_mode --format=csv
record nvidia-smi-apps-idle nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv

step "nsys: with kernels, without kernels"
record nsys-no-kernels "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/no-kernels" "$PY" "$NOKERNEL"; left nsys-no-kernels "$W"
stats nsys-no-kernels-stats "$W/no-kernels.nsys-rep"
record nsys-with-nvtx "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/taken" "$PY" "$APP" 2; left nsys-with-nvtx "$W"

step "nsys: the output name taken"
record nsys-taken-name "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/taken" "$PY" "$APP" 1; left nsys-taken-name "$W"
ls -la /tmp/nsys-report-* 2>/dev/null | head

step "nsys: SIGTERM to nsys alone while the workload runs"
record_signal nsys-sigterm TERM 8 nsys "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/sigterm" "$PY" "$APP" 20; left nsys-sigterm "$W"
[ -f "$W/sigterm.nsys-rep" ] && stats nsys-sigterm-stats "$W/sigterm.nsys-rep"
gpu_idle

step "nsys: SIGINT to nsys alone while the workload runs"
record_signal nsys-sigint INT 8 nsys "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/sigint" "$PY" "$APP" 20; left nsys-sigint "$W"
[ -f "$W/sigint.nsys-rep" ] && stats nsys-sigint-stats "$W/sigint.nsys-rep"
gpu_idle

# Which way of stopping a workload early keeps its kernels: nsys's own --duration (with its
# default --kill sigterm), and SIGTERM to the application alone.
step "nsys: --duration=5 on a 20 s workload"
record nsys-duration "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --duration=5 --output="$W/duration" "$PY" "$APP" 20; left nsys-duration "$W"
[ -f "$W/duration.nsys-rep" ] && stats nsys-duration-stats "$W/duration.nsys-rep"
gpu_idle
step "nsys: SIGTERM to the application alone, not to nsys"
record_signal nsys-app-sigterm TERM 8 app "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/appterm" "$PY" "$APP" 20; left nsys-app-sigterm "$W"
[ -f "$W/appterm.nsys-rep" ] && stats nsys-app-sigterm-stats "$W/appterm.nsys-rep"
gpu_idle

step "nsys: SIGKILL to nsys and all below it while collecting"
record_signal nsys-sigkill-collecting KILL 8 tree "$NSYS" profile --trace=cuda,nvtx --sample=none --cpuctxsw=none --output="$W/killed" "$PY" "$APP" 20; left nsys-sigkill-collecting "$W"
ls -la /tmp/nsys-report-* 2>/dev/null | head
gpu_idle

step "ncu: a report, its name taken, the raw page"
record ncu-report "$NCU" --launch-count 2 -o "$W/ncu" "$PY" "$APP" 1; left ncu-report "$W"
record ncu-taken-name "$NCU" --launch-count 2 -o "$W/ncu" "$PY" "$APP" 1; left ncu-taken-name "$W"
record ncu-import-raw "$NCU" --import "$W/ncu.ncu-rep" --page raw --csv
} 2>&1 | tee "$D/transcript.txt"
