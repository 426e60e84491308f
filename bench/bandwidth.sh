#!/usr/bin/env bash
# A benchmark run over a link of a given rate: in a network namespace of its own (unshare -n), whose
# loopback, the only link there, is held to RATE by a token bucket (tc tbf). The sshd the benchmark
# starts on loopback and the client reaching it are both inside, so every byte of a transfer, and of
# its acknowledgements, crosses the limited link. Nothing outside the namespace changes, and the
# namespace goes with the command.
#
#   sudo RATE=1gbit bench/bandwidth.sh .venv/bin/python bench/transfer.py --size-mib 259 --runs 5 --label 1gbit
#
# RATE is tc's (1gbit, 100mbit); BURST the bucket's depth (default 256kb: about 2 ms at 1 Gbit/s).
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${RATE:-1gbit}
burst=${BURST:-256kb}
[ $# -gt 0 ] || { echo "usage: RATE=1gbit bench/bandwidth.sh COMMAND [ARG...]" >&2; exit 2; }
exec unshare --net -- bash -c '
  set -euo pipefail
  rate=$1 burst=$2
  shift 2
  ip link set lo up
  tc qdisc add dev lo root tbf rate "$rate" burst "$burst" latency 50ms
  echo "[bandwidth] loopback held to $rate (burst $burst) in a network namespace of its own" >&2
  exec "$@"' bandwidth "$rate" "$burst" "$@"
