#!/usr/bin/env bash
# Measure the simulator's CPU costs (rt::CpuCost) on this machine and print them as the
# `--sim-cost-ns OP,MSG,PACKET,TXN` flag (for `dtx bench --runtime sim`, or
# `dtx experiment run NAME --set sim-cost-ns=OP,MSG,PACKET,TXN`).
#
#   scripts/calibrate-sim.sh [SECONDS]
#
# How (docs/experiments.md, "Calibrating the simulator"):
# - one worker, one node, nothing distributed, 1 and then 10 operations per transaction: the CPU
#   per committed transaction grows by 9 operations; a transaction charges about 2.4 record-level
#   steps per operation (read, lock, validate, install), so OP = slope / 2.4 and TXN = the rest;
# - two `dtx server` processes over tcp, one worker each, every transaction distributed, one in
#   flight (so no batching: a packet per message): the CPU beyond a local transaction's, per
#   message, is one message's and one packet's cost; it is split as the defaults split it (a
#   packet costs ten messages: a system call at each end against an encoding and a dispatch).
set -euo pipefail
secs=${1:-3}
repo=$(cd "$(dirname "$0")/.." && pwd)
(cd "$repo" && cargo build --release --quiet)
dtx=$repo/target/release/dtx
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() { # name, then bench flags
  local name=$1; shift
  "$dtx" bench --protocol occ --duration "$secs" --json "$out/$name.json" --out "$out" "$@" >/dev/null 2>&1
}
echo "measuring (four runs of ${secs}s)..." >&2
run ops1 --runtime local --nodes 1 --workers 1 --distributed 0 --ops 1
run ops10 --runtime local --nodes 1 --workers 1 --distributed 0 --ops 10
run local4 --runtime tcp --nodes 2 --workers 1 --distributed 0 --ops 4 --inflight 1
run dist4 --runtime tcp --nodes 2 --workers 1 --distributed 1 --ops 4 --inflight 1

python3 - "$out" <<'PY'
import json, sys
d = sys.argv[1]
run = lambda n: json.load(open(f"{d}/{n}.json"))["runs"][0]
cpu = lambda n: run(n)["cpu_us_per_txn"] * 1000.0  # ns per committed transaction
steps_per_op = 2.4
op = (cpu("ops10") - cpu("ops1")) / 9 / steps_per_op
txn = max(cpu("ops1") - steps_per_op * op, 0)
msgs = run("dist4")["msgs_per_txn"]
per_msg = max(cpu("dist4") - cpu("local4"), 0) / max(msgs, 1e-9)
msg, packet = per_msg / 11, per_msg * 10 / 11
print(f"per transaction: {cpu('ops1'):.0f} ns with 1 op, {cpu('ops10'):.0f} ns with 10; "
      f"distributed over tcp: {msgs:.1f} messages, {per_msg:.0f} ns each beyond a local transaction")
print(f"--sim-cost-ns {op:.0f},{msg:.0f},{packet:.0f},{txn:.0f}   (OP,MSG,PACKET,TXN; the default is 100,800,8000,600)")
PY
