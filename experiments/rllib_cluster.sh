#!/usr/bin/env bash
# RLlib PPO (agents.rllib_module) with its env runners on two Ray nodes on one host: a
# head node and a worker node, each with its own ports and temp dir, each offering one
# "memcores_runner" slot, so each of the two env runners lands on a different node. The
# learner runs in the driver, on the head node. On real machines, run the two `ray start`
# lines on two hosts with their own addresses instead of 127.0.0.1.
#
#   experiments/rllib_cluster.sh [CORE] [FRAMES]        # default: gru 50176
#
# Writes results/engines/engine=rllib,core=CORE,seed=0,cluster=2-node/ (record.json holds
# "placement": every Ray node and the node of the learner and of each env runner).
# Only the two Ray nodes started here are stopped at the end (never `ray stop`, which would
# stop every Ray on the host).
set -euo pipefail

CORE=${1:-gru}
FRAMES=${2:-50176}
PYTHON=${PYTHON:-python}
RAY="$(dirname "$(command -v "$PYTHON")")/ray"
PORT=${RAY_PORT:-6391}
BASE=$(mktemp -d /tmp/mcray.XXXX)  # short: Ray's socket paths must stay under 108 bytes
export RAY_AUTH_MODE=disabled      # a loopback cluster of one user

pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$BASE"
}
trap cleanup EXIT

common=(--node-ip-address=127.0.0.1 --num-cpus=2 --resources='{"memcores_runner": 1}' --block
        --include-log-monitor=false)
"$RAY" start --head --port="$PORT" --temp-dir="$BASE/head" --include-dashboard=false \
    --ray-client-server-port=$((PORT + 1)) --dashboard-agent-listen-port=$((PORT + 2)) \
    "${common[@]}" >"$BASE/head.log" 2>&1 &
pids+=($!)
sleep 15
"$RAY" start --address="127.0.0.1:$PORT" --temp-dir="$BASE/worker" \
    --dashboard-agent-listen-port=$((PORT + 3)) \
    "${common[@]}" >"$BASE/worker.log" 2>&1 &
pids+=($!)
sleep 15

"$PYTHON" -m memcores.experiments.engines run --engine rllib --core "$CORE" --seed 0 \
    --frames "$FRAMES" --address "127.0.0.1:$PORT"
