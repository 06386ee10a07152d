#!/usr/bin/env bash
# Measure dtx against COCO's public C++ testbed (Lu et al., VLDB 2021) on this machine, back to
# back, on issue 3's setup: TPC-C New-Order/Payment 50/50, one warehouse, one process, Silo OCC,
# default remote ratios. Prints each run and dtx's ratio to COCO's mean.
#
#   scripts/compare-coco.sh /path/to/coco [ROUNDS]
#
# It also writes the rounds as JSON (default results/coco.json, or $COCO_JSON), which
# `dtx experiment report --coco results/coco.json` shows as a table of the report.
#
# /path/to/coco is a clone of https://github.com/luyi0619/coco; it is copied, never changed, and
# built in $COCO_BUILD (default /tmp/dtx-coco-build). COCO needs cmake, glog, gflags, jemalloc
# and boost (Debian: apt-get install cmake libgoogle-glog-dev libgflags-dev libjemalloc-dev
# libboost-dev libgtest-dev). Each COCO run takes 25 s (its fixed length; it reports the mean of
# seconds 11-20), each dtx run 3 s per protocol. Both use the machine's two cores: COCO's one
# worker plus its manager thread, which spins on the other core, and dtx's two workers.
set -euo pipefail

coco_src=${1:?usage: scripts/compare-coco.sh /path/to/coco [ROUNDS]}
rounds=${2:-2}
build=${COCO_BUILD:-/tmp/dtx-coco-build}
repo=$(cd "$(dirname "$0")/.." && pwd)

[[ -f $coco_src/bench_tpcc.cpp ]] || { echo "error: $coco_src is not a COCO checkout (no bench_tpcc.cpp)" >&2; exit 2; }
for lib in glog gflags jemalloc; do
  if ! ldconfig -p | grep -q "lib$lib"; then
    echo "error: lib$lib is missing; install: apt-get install cmake libgoogle-glog-dev libgflags-dev libjemalloc-dev libboost-dev libgtest-dev" >&2
    exit 2
  fi
done
command -v cmake >/dev/null || { echo "error: cmake is missing (apt-get install cmake)" >&2; exit 2; }

if [[ ! -x $build/bench_tpcc ]]; then
  echo "building COCO in $build" >&2
  mkdir -p "$build"
  rm -rf "$build/src" && cp -r "$coco_src" "$build/src"
  # COCO's CMakeLists fetches googletest at configure time; offline, use Debian's sources.
  if [[ -d /usr/src/googletest ]]; then
    sed -i 's|^add_subdirectory(cmake)|add_subdirectory(/usr/src/googletest ${CMAKE_BINARY_DIR}/googletest-build EXCLUDE_FROM_ALL)|' \
      "$build/src/CMakeLists.txt"
  fi
  (cd "$build" && cmake -S src -B . -DCMAKE_BUILD_TYPE=Release >/dev/null && make -j2 bench_tpcc >/dev/null)
fi

echo "building dtx (release)" >&2
(cd "$repo" && cargo build --release --quiet)
dtx=$repo/target/release/dtx

coco_run() {
  local log port=$((20000 + RANDOM % 20000))
  log=$(mktemp)
  # --cpu_affinity=false: COCO pins threads to cores 0, 1, 2... and fails a check on two cores.
  "$build/bench_tpcc" --logtostderr=1 --id=0 --servers="127.0.0.1:$port" --protocol=Silo --query=mixed \
    --neworder_dist=10 --payment_dist=15 --threads=1 --partition_num=1 --io=1 --cpu_affinity=false >"$log" 2>&1
  sed -n 's/.*total commit: \([0-9.]*\).*/\1/p' "$log" | tail -1
  rm -f "$log"
}

# One line per dtx run: protocol=committed/s for each protocol.
summarize='
import json, sys
runs = json.load(sys.stdin)["runs"]
print(" ".join("%s=%.0f" % (r["protocol"], r["throughput_tps"]) for r in runs))
'

# The protocols in the order round $1 runs them: rotated each round, so that no protocol always
# runs first (every run starts from a trimmed heap, but the machine's speed drifts within a round).
protocols=(2pl-nowait 2pl-waitdie occ)
dtx_order() {
  local n=${#protocols[@]} out=() k
  for ((k = 0; k < n; k++)); do out+=("${protocols[$(((k + $1 - 1) % n))]}"); done
  (IFS=,; echo "${out[*]}")
}

dtx_run() {
  "$dtx" bench --workload tpcc --nodes 1 --warehouses 1 --mix neworder-payment \
    --protocol "$(dtx_order "$1")" --duration 3 --json-stdout 2>/dev/null |
    python3 -c "$summarize"
}

coco=()
rounds_json=()
declare -A dtx_sum dtx_n
for ((i = 1; i <= rounds; i++)); do
  c=$(coco_run)
  [[ -n $c ]] || { echo "error: COCO printed no 'total commit' line" >&2; exit 1; }
  coco+=("$c")
  echo "round $i: coco(silo, 1 worker)=$c"
  d=$(dtx_run "$i")
  echo "round $i: $d"
  # {"coco": N, "dtx": {"occ": N, ...}}
  pairs=$(for kv in $d; do printf '"%s": %s, ' "${kv%%=*}" "${kv#*=}"; done)
  rounds_json+=("{\"coco\": $c, \"dtx\": {${pairs%, }}}")
  for kv in $d; do
    dtx_sum[${kv%%=*}]=$(( ${dtx_sum[${kv%%=*}]:-0} + ${kv#*=} ))
    dtx_n[${kv%%=*}]=$(( ${dtx_n[${kv%%=*}]:-0} + 1 ))
  done
done

coco_mean=$(printf '%s\n' "${coco[@]}" | awk '{s += $1} END {printf "%.0f", s / NR}')
echo
printf '%-22s %12s %8s\n' system committed/s vs-coco
printf '%-22s %12s %8s\n' "coco silo (1 worker)" "$coco_mean" "1.00x"
for p in "${protocols[@]}"; do
  mean=$(( dtx_sum[$p] / dtx_n[$p] ))
  printf '%-22s %12s %8s\n' "dtx $p" "$mean" "$(awk -v a="$mean" -v b="$coco_mean" 'BEGIN {printf "%.2fx", a / b}')"
done

json=${COCO_JSON:-$repo/results/coco.json}
mkdir -p "$(dirname "$json")"
{
  printf '{"date": "%s", "rounds": [' "$(date -u '+%Y-%m-%d %H:%M UTC')"
  (IFS=,; printf '%s' "${rounds_json[*]}")
  printf ']}\n'
} >"$json"
echo "rounds written to $json (dtx experiment report --coco $json)"
