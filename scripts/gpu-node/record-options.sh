#!/usr/bin/env bash
# Run on a real GPU node (as root), no fleet in between: how nsys 2025.3 reads `nsys profile`'s
# command line, recorded raw for the nsys stand-in (tests/standins/nsys, REFUSALS):
#  - an option given twice, long and short spelling (-t and --trace), and the same spelling twice
#  - an ambiguous prefix of a long option (--cuda), and a unique one (--dur=1 for --duration)
#  - an option nsys does not know
#  - `nsys profile --help`, the list of options a prefix is matched against
# Each case is a folder of $OUT/record-options/ (cmd.txt, output.txt, status.txt, files.txt),
# packed as $OUT/record-options.tgz.
set -u
cd "$(dirname "$0")/../.."
. scripts/gpu-node/common.sh
TOP=${OUT:-/tmp}; D=$TOP/record-options; mkdir -p "$D"
trap 'pack "$TOP" record-options' EXIT
W=$CHECK_TMP/reco; mkdir -p "$W"
record() {
  local c=$D/$1; shift; mkdir -p "$c"
  q "$@" > "$c/cmd.txt"
  "$@" > "$c/output.txt" 2>&1; echo $? > "$c/status.txt"
  (cd "$W" && find . -maxdepth 1 -type f -newer "$c/cmd.txt" -printf '%s %P\n' | sort -k2) > "$c/files.txt"
  echo "== $(basename "$c"): exit $(cat "$c/status.txt")"; cut -c1-300 "$c/output.txt" | tail -15; cat "$c/files.txt"
}
{
echo "nsys: $NSYS ($("$NSYS" --version))"
record nsys-option-twice "$NSYS" profile -t osrt --trace osrt -o "$W/twice" /bin/true
record nsys-option-twice-same "$NSYS" profile --trace osrt --trace osrt -o "$W/same" /bin/true
record nsys-option-twice-sample "$NSYS" profile -s none --sample=none -t osrt -o "$W/sample" /bin/true
record nsys-option-ambiguous "$NSYS" profile --cuda -t osrt -o "$W/ambiguous" /bin/true
record nsys-option-prefix "$NSYS" profile --dur=1 -t osrt -o "$W/prefix" /bin/sleep 3
record nsys-option-prefix-output "$NSYS" profile --out "$W/out" -t osrt /bin/true
record nsys-option-unknown "$NSYS" profile --no-such-option -t osrt -o "$W/unknown" /bin/true
record nsys-profile-help "$NSYS" profile --help
} 2>&1 | tee "$D/transcript.txt"
