#!/usr/bin/env bash
# Run on a real GPU node (as root; alone, not in matrix.sh): what the real nsys does with named
# sessions and windows of a workload that goes on running, recorded raw (no fleet in between), for
# the stand-ins to replay and for the design of windows and of a yield that leaves the workload
# running. Each case is a folder of $OUT/record-sessions/: cmd.txt, output.txt, status.txt,
# timing.txt (seconds, from this script's clock), the CSV kernel summaries of the reports it wrote
# and what the workload printed after the window. Packed as $OUT/record-sessions.tgz.
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.." || exit 1
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/record-sessions; mkdir -p "$D"
trap 'pack "$TOP" record-sessions' EXIT
W=$CHECK_TMP/sessions; mkdir -p "$W"; chmod 755 "$W"
APP=$W/steps.py  # GEMMs for SECONDS, each step an NVTX range "step"; cudaProfilerStart/Stop around steps 20-40
write_steps_app "$APP"
BASE="-t cuda,nvtx --sample=none --cpuctxsw=none"
STATS="stats -q --report cuda_gpu_kern_sum,nvtx_sum --format csv"
now() { date +%s.%N | cut -c1-14; }

# run CASE CMD...: CMD to its end, recorded in $D/CASE, with the time it took.
run() {
  local c=$D/$1; shift; mkdir -p "$c"
  q "$@" >> "$c/cmd.txt"
  local t0; t0=$(now)
  "$@" >> "$c/output.txt" 2>&1; echo $? >> "$c/status.txt"
  echo "$(q "$@" | cut -c1-80): $(awk "BEGIN {print $(now) - $t0}") s" >> "$c/timing.txt"
  echo "== $(basename "$c"): exit $(tail -1 "$c/status.txt")"; tail -6 "$c/output.txt" | cut -c1-300
}
# start CASE CMD...: CMD in the background (its output in CASE/bg-output.txt); its pid in $BG.
start() {
  local c=$D/$1; shift; mkdir -p "$c"
  echo "background: $(q "$@")" >> "$c/cmd.txt"
  "$@" > "$c/bg-output.txt" 2>&1 &
  BG=$!; echo "started at $(now)" >> "$c/timing.txt"
}
# app_pid: the workload's pid, from its first line.
# (waited for, up to 30 s: the workload imports torch first)
app_pid() {
  local i pid
  for i in $(seq 300); do
    pid=$(sed -n 's/^app started, pid \([0-9]*\)$/\1/p' "$D/$1/bg-output.txt" | head -1)
    [ -n "$pid" ] && { echo "$pid"; return; }
    sleep 0.1
  done
}
alive() { if kill -0 "$1" 2>/dev/null; then echo "workload $1 still running at $(now)"; else echo "workload $1 gone at $(now)"; fi; }
stats() { mkdir -p "$D/$1/stats"; "$NSYS" $STATS --output "$D/$1/stats/$(basename "$2" .nsys-rep)" "$2" > /dev/null 2>&1
          for f in "$D/$1/stats/"*kern_sum*.csv; do [ -e "$f" ] && echo "$(basename "$f"): $(awk -F, 'NR>1 {n+=$3} END {print n+0}' "$f") kernels"; done; }
finish() {  # finish CASE PID: wait for the background command; its exit status and the workload's last line
  wait "$2"; echo "background exit $? at $(now)" >> "$D/$1/timing.txt"
  tail -3 "$D/$1/bg-output.txt"; ls -la "$W/$1"* 2>/dev/null | tail -5
}

{
echo "nsys: $NSYS"; "$NSYS" --version; nvidia-smi -L
gpu_idle

step "profile --session-new, stopped by 'nsys stop' after 8 s of a 25 s workload: does the workload go on?"
C=profile-stop; start $C "$NSYS" profile --session-new=fleet-a $BASE -o "$W/$C" "$PY" "$APP" 25
sleep 8
run $C "$NSYS" sessions list
A=$(app_pid $C); echo "workload pid $A" | tee -a "$D/$C/timing.txt"
run $C "$NSYS" stop --session=fleet-a
alive "$A" | tee -a "$D/$C/timing.txt"
run $C "$NSYS" sessions list
finish $C $BG; sleep 1; alive "$A" | tee -a "$D/$C/timing.txt"
while kill -0 "$A" 2>/dev/null; do sleep 1; done; echo "workload ended at $(now)" >> "$D/$C/timing.txt"
tail -2 "$D/$C/bg-output.txt"
stats $C "$W/$C.nsys-rep"

step "the same with GPU metrics: the time 'nsys stop' takes to release the counters"
C=metrics-stop; start $C "$NSYS" profile --session-new=fleet-b $BASE --gpu-metrics-devices=0 -o "$W/$C" "$PY" "$APP" 25
sleep 8; A=$(app_pid $C)
run $C "$NSYS" stop --session=fleet-b
alive "$A" | tee -a "$D/$C/timing.txt"
finish $C $BG
while kill -0 "$A" 2>/dev/null; do sleep 1; done; echo "workload ended at $(now)" >> "$D/$C/timing.txt"
tail -2 "$D/$C/bg-output.txt"; stats $C "$W/$C.nsys-rep"

step "stop of a session that does not exist, and a second stop"
run no-session "$NSYS" stop --session=fleet-none
run no-session "$NSYS" sessions list

step "--delay 4 --duration 6 --kill none: a window by nsys's own clock; does nsys return before the workload ends?"
C=delay-duration; start $C "$NSYS" profile --session-new=fleet-c $BASE --delay=4 --duration=6 --kill=none -o "$W/$C" "$PY" "$APP" 20
sleep 2; A=$(app_pid $C); echo "workload pid $A" >> "$D/$C/timing.txt"
run $C "$NSYS" sessions list
finish $C $BG; alive "$A" | tee -a "$D/$C/timing.txt"
while kill -0 "$A" 2>/dev/null; do sleep 1; done; echo "workload ended at $(now)" >> "$D/$C/timing.txt"
tail -2 "$D/$C/bg-output.txt"; stats $C "$W/$C.nsys-rep"

step "nsys launch, then two start/stop windows"
# (nsys 2025.3's launch refuses --sample: "set on the profile and start commands")
C=launch-windows; start $C "$NSYS" launch --session-new=fleet-d -t cuda,nvtx "$PY" "$APP" 20
sleep 3; A=$(app_pid $C); echo "workload pid $A" >> "$D/$C/timing.txt"
run $C "$NSYS" sessions list
for i in 1 2; do
  run $C "$NSYS" start --session=fleet-d --sample=none --cpuctxsw=none -o "$W/$C-$i"
  sleep 3
  run $C "$NSYS" stop --session=fleet-d
  alive "$A" | tee -a "$D/$C/timing.txt"
done
run $C "$NSYS" sessions list
finish $C $BG; alive "$A" | tee -a "$D/$C/timing.txt"
for i in 1 2; do stats $C "$W/$C-$i.nsys-rep"; done

step "NVTX capture range 'step', repeated twice: two reports while the workload goes on"
C=nvtx-repeat; start $C "$NSYS" profile $BASE --capture-range=nvtx --nvtx-capture=step --capture-range-end=repeat:2 --env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0 -o "$W/$C" "$PY" "$APP" 12
A=""; sleep 2; A=$(app_pid $C)
finish $C $BG; alive "$A" | tee -a "$D/$C/timing.txt"
find "$W" -maxdepth 1 -name "$C*" -printf "%s %f\n" > "$D/$C/reports-written.txt"; cat "$D/$C/reports-written.txt"
for r in "$W/$C"*.nsys-rep; do stats $C "$r"; done

step "cudaProfilerApi capture range (steps 20 to 40), ended by stop: the workload goes on"
C=cuda-api; start $C "$NSYS" profile $BASE --capture-range=cudaProfilerApi --capture-range-end=stop -o "$W/$C" "$PY" "$APP" 12
sleep 2; A=$(app_pid $C)
finish $C $BG; alive "$A" | tee -a "$D/$C/timing.txt"
while kill -0 "$A" 2>/dev/null; do sleep 1; done; echo "workload ended at $(now)" >> "$D/$C/timing.txt"
tail -2 "$D/$C/bg-output.txt"; stats $C "$W/$C.nsys-rep"
} 2>&1 | tee "$D/transcript.txt"
