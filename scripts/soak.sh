#!/usr/bin/env bash
# The soak: every ready protocol on a 3-server tcp cluster with replicated logs, a random server
# killed (kill -9), stopped (SIGSTOP) or cut off from the others (a firewall rule) every 2 s and
# brought back 500 ms later, for ten minutes each, every history checked (strict serializability
# where the protocol promises it, every acknowledged append in the final read). Exits non-zero if
# a run does not verify. Partitions need root (a network namespace of the run's own).
#
#   scripts/soak.sh [SECONDS_PER_PROTOCOL] [DURABILITY] [PROTOCOLS] [FAULTS]
#
# Defaults: 600 s, replicated, all, crash,pause,partition. `scripts/soak.sh 600 wal` soaks the
# write-ahead logs instead; `scripts/soak.sh 600 replicated all crash,pause` runs without root.
# The report of each run (JSON with every fault in `fault_events`, plot) is in results/.
set -euo pipefail
secs=${1:-600}
durability=${2:-replicated}
protocols=${3:-all}
faults=${4:-crash,pause,partition}
repo=$(cd "$(dirname "$0")/.." && pwd)
(cd "$repo" && cargo build --release --quiet)
dtx=$repo/target/release/dtx
echo "== soak: $protocols, $durability, $faults, ${secs}s each" >&2
# `--protocol all` runs every ready protocol in turn; bench exits non-zero if any run fails --verify.
"$dtx" bench --runtime tcp --nodes 3 --durability "$durability" --replicas 3 \
  --faults "$faults" --fault-every 2s --fault-duration 500ms --election-timeout 100ms --duration "$secs" \
  --workload append --inflight 8 --verify --protocol "$protocols"
echo "soak: every run verified" >&2
