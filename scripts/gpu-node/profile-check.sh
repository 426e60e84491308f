#!/usr/bin/env bash
# Run on a real GPU node (as root): fleet profile with the real nsys and ncu, reports into a store
# under $OUT (--store). STEPS (default all of them; ONLY=STEP runs one) picks:
#  tenant   another user's CUDA process on GPU 0: ncu refused; nsys trace allowed, report brought
#           home; then the tenant gone: ncu allowed, report brought home
#  nonvtx   an nsys trace of a workload without NVTX ranges
#  flags    the user's own -X flags: --sample wins over fleet's (nsys refuses an option twice),
#           -o is refused before anything runs
#  killed   nsys SIGKILLed while generating its report (fleet finishes the .qdstrm), and while
#           collecting (nsys 2025.3 cannot finish that data: fleet says so)
#  importer nsys whose importer lacks libdw leaves a .qdstrm: fleet finishes it
#  fork     a workload whose parent forks a child running the app: ok, report home
#  timeout  --timeout 12 on a 30 s workload: the stop said, the report finished and home
#  nonroot  a non-root user with kernel.perf_event_paranoid owned in the inventory: without sudo
#           (said in words with the remedy, CPU sampling given up, run ok), then with a sudoers
#           line for it (the sysctl held for the run and restored)
#  gather   the fleet client SIGKILLed mid-run (by its pid): fleet gather brings the report home,
#           fleet repair finds nothing left changed
#  store    (always, at the end) every catalogued report's sha256 matches its file
# Transcripts go to $OUT/profile-check/ (one file per command, transcript.txt for all), with the
# store's manifests and summaries, packed as $OUT/profile-check.tgz (the reports themselves are
# listed in reports.txt and left out).
# DEPS: a folder of .deb files unpacked for nsys's importer (libdw1, libelf1).
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/profile-check; mkdir -p "$D"
trap 'pack "$TOP" profile-check' EXIT
STORE=$D/store; export FLEET_STORE=$STORE
STEPS=${ONLY:-${STEPS:-tenant nonvtx flags killed importer fork timeout nonroot gather}}
APP=$D/app.py
write_app "$APP"
has() { case " $STEPS " in *" $1 "*) return 0;; esac; return 1; }

{
echo "nsys: $NSYS"; echo "store: $STORE"; echo "steps: $STEPS"
gpu_idle
if has tenant; then
step "a second user's CUDA process on GPU 0"
tenant_up
fleet_log 1-ncu-refused.txt profile --hosts localhost --tool ncu --gpu 0 --store "$STORE" -- "$PY" "$APP" 1
expect "profile: ncu refused beside a tenant" "$D/1-ncu-refused.txt" 5 "refused" "belongs to another user"
fleet_log 2-nsys-beside-tenant.txt profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 2
expect "profile: nsys allowed beside a tenant, report home" "$D/2-nsys-beside-tenant.txt" 0 ".nsys-rep (" "verified"

step "the tenant gone"
tenant_down
fleet_log 3-ncu-alone.txt profile --hosts localhost --tool ncu --gpu 0 --store "$STORE" -X --launch-count -X 3 -- "$PY" "$APP" 1
expect "profile: ncu with the tenant gone, report home" "$D/3-ncu-alone.txt" 0 ".ncu-rep (" "verified"
fi

if has nonvtx; then
step "nsys trace of a workload without NVTX ranges"
fleet_log 4-nsys-without-nvtx.txt profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda -- "$PY" "$APP" 2 nonvtx
expect "profile: nsys of a workload without NVTX" "$D/4-nsys-without-nvtx.txt" 0 ".nsys-rep (" "verified"
gpu_idle
fi

if has flags; then
step "the user's own nsys flags beside fleet's"
fleet_log 4b-user-sample.txt profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -X --sample=process-tree -- "$PY" "$APP" 1
expect "profile: the user's --sample wins, no option twice" "$D/4b-user-sample.txt" 0 ".nsys-rep (" "verified" "!cannot be specified more than once"
fleet_log 4c-user-output.txt profile --hosts localhost --gpu 0 --store "$STORE" -X -o -X mine -- "$PY" "$APP" 1
expect "profile: -X -o refused before anything runs" "$D/4c-user-output.txt" 2 "is fleet's"
gpu_idle
fi

if has killed; then
step "nsys SIGKILLed while it generates the report: fleet finishes the .qdstrm"
F=$D/5-nsys-killed-generating.txt
( echo "\$ $(q "$PY" -m fleet profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 10)  (nsys and its importer SIGKILLed once it prints 'Generating')"
  PYTHONUNBUFFERED=1 "$PY" -m fleet profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 10
  echo "(exit status $?)" ) > "$F" 2>&1 &
RUN=$!
for _ in $(seq 1 1200); do grep -q "^Generating '" "$F" && break; kill -0 "$RUN" 2>/dev/null || break; sleep 0.05; done
NSYS_PIDS=$(descendants_named "$RUN" 'nsys|QdstrmImporter' | tr '\n' ' ')  # this run's only
GEN=$(sed -n "s/^Generating '\([^']*\)'.*/\1/p" "$F" | head -1)
OUTDIR=$(for p in $NSYS_PIDS; do output_dir_of "$p"; done | head -1)
# nsys's importer runs apart from its process tree: found by the files of this run it holds open.
PIDS=$(echo $NSYS_PIDS $(holding ${GEN:+"$GEN"} ${OUTDIR:+"$OUTDIR/"}) | tr ' ' '\n' | sort -un | tr '\n' ' '); PIDS=${PIDS% }
{ echo "processes at 'Generating' (below this run's fleet, or holding $GEN or files in $OUTDIR/)"; [ -n "$PIDS" ] && ps -o pid,ppid,args -p "${PIDS// /,}" | cut -c1-160
  echo "SIGKILL to ${PIDS:-none}"; } > "$F.kill"
[ -n "$PIDS" ] && kill -KILL $PIDS
wait "$RUN"; cat "$F.kill" >> "$F"; rm -f "$F.kill"; cat "$F"
expect "profile: nsys killed while generating, .qdstrm finished" "$F" 0 "finished from .qdstrm"
gpu_idle

step "nsys SIGKILLed while collecting: nsys 2025.3 cannot finish that data, fleet says so"
F=$D/6-nsys-killed-collecting.txt
# nsys collects into its TMPDIR: the run's own private folder (.tmp-HOST beside the reports), /tmp before.
QDSTRMS="/tmp/nsys-report-*.qdstrm /var/tmp/fleet-*/*/.tmp-*/nsys-report-*.qdstrm"
BEFORE=$(ls $QDSTRMS 2>/dev/null)
fleet_log 6-nsys-killed-collecting.txt profile --hosts localhost --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 14 &
RUN=$!
( sleep 10; NSYS_PIDS=$(descendants_named "$RUN" nsys | tr '\n' ' ')  # this run's nsys only
  NEW=$(comm -13 <(echo "$BEFORE") <(ls $QDSTRMS 2>/dev/null))  # the data this run collects
  PIDS=$(echo $NSYS_PIDS $(holding $NEW) | tr ' ' '\n' | sort -un | tr '\n' ' '); PIDS=${PIDS% }
  { echo "SIGKILL to nsys: ${PIDS:-none} (below this run's fleet, or holding its data $NEW)"
    [ -n "$PIDS" ] && ps -o pid,ppid,args -p "${PIDS// /,}" | cut -c1-160; } > "$F.kill"; [ -n "$PIDS" ] && kill -KILL $PIDS ) &
KILLER=$!
wait "$RUN"; wait "$KILLER"; cat "$F.kill" >> "$F"; cat "$F.kill"; rm -f "$F.kill"
expect "profile: nsys killed while collecting: failed, data kept, why said" "$F" 1 "nsys ended before writing its report"
gpu_idle
fi

if has importer; then
step "nsys cannot generate its report (its importer lacks libdw): fleet finishes the .qdstrm"
printf '#!/bin/sh\nunset LD_LIBRARY_PATH\nexec %s "$@"\n' "$NSYS" > "$D/nsys-without-libdw"; chmod +x "$D/nsys-without-libdw"
printf 'all:\n  hosts:\n    h200:\n      ansible_connection: local\n      nsys_path: %s\n' "$D/nsys-without-libdw" > "$D/inventory.yaml"
fleet_log 7-qdstrm-finished.txt -i "$D/inventory.yaml" profile --hosts h200 --gpu 0 --store "$STORE" -X --trace=cuda,nvtx -- "$PY" "$APP" 3
expect "profile: .qdstrm left by nsys finished by fleet" "$D/7-qdstrm-finished.txt" 0 "finished from .qdstrm"
fi

. scripts/gpu-node/profile-more.sh

step "node state afterwards"
fleet_log 8-repair.txt repair localhost
expect "repair: nothing left changed" "$D/8-repair.txt" 0 "nothing to put back"
ls -la /var/lock/fleet-gpu-* 2>&1 | head -3
find "$STORE" -type f -printf '%s %P\n' | sort -k2
for f in $(find "$STORE" -name '*_cuda_gpu_kern_sum.csv' | sort); do echo "== ${f#$STORE/}"; head -3 "$f" | cut -c1-200; done
for f in $(find "$STORE" -name '*_ncu_raw.csv' | sort | head -1); do echo "== ${f#$STORE/}"; head -3 "$f" | cut -c1-300; done
gpu_idle
wait
} 2>&1 | tee "$D/transcript.txt"
