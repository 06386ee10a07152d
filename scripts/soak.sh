#!/usr/bin/env bash
# The soak: every ready protocol on a 3-server tcp cluster with replicated logs, a random server
# killed (kill -9) or stopped (SIGSTOP) every 2 s and brought back 500 ms later, for ten minutes
# each, every history checked (strict serializability where the protocol promises it, every
# acknowledged append in the final read). Exits non-zero if a run does not verify.
#
#   scripts/soak.sh [SECONDS_PER_PROTOCOL] [DURABILITY] [PROTOCOLS]
#
# Defaults: 600 s, replicated, all. `scripts/soak.sh 600 wal` soaks the write-ahead logs instead.
# The report of each run (JSON with every fault in `fault_events`, plot) is in results/.
set -euo pipefail
secs=${1:-600}
durability=${2:-replicated}
protocols=${3:-all}
repo=$(cd "$(dirname "$0")/.." && pwd)
(cd "$repo" && cargo build --release --quiet)
dtx=$repo/target/release/dtx
echo "== soak: $protocols, $durability, ${secs}s each" >&2
# `--protocol all` runs every ready protocol in turn; bench exits non-zero if any run fails --verify.
"$dtx" bench --runtime tcp --nodes 3 --durability "$durability" --replicas 3 \
  --faults crash,pause --fault-every 2s --fault-duration 500ms --duration "$secs" \
  --workload append --inflight 8 --verify --protocol "$protocols"
echo "soak: every run verified" >&2
