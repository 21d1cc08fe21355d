#!/usr/bin/env bash
# `make overhead`: the latency the wasm-epp filter adds per request. One simulator that answers at
# once (no modelled latency), one Envoy with the filter (envoy/envoy.yaml + controller) and one
# plain Envoy proxying to the same server; closed loop, one request at a time, alternating rounds.
set -euo pipefail
cd "$(dirname "$0")/../.."

NAME=overhead
source examples/demo/lib.sh
ROUNDS=${OVERHEAD_ROUNDS:-3}
PER_ROUND=${OVERHEAD_REQUESTS:-1000}
SIM_PORT=18101
require_free_ports 10000 9901 9002 9090 10002 9903 "$SIM_PORT"

"$BIN/vllm-sim" --port "$SIM_PORT" --instance-name sim --ttft-base-ms 0 --prefill-ms-per-token 0 --itl-ms 0 \
  >"$WORK/sim.log" 2>&1 & pids+=($!)
wait_http "http://127.0.0.1:$SIM_PORT/health"
echo "endpoints: [{ name: sim, address: 127.0.0.1, port: $SIM_PORT }]" >"$WORK/endpoints.yaml"
"$BIN/wasm-epp-controller" --endpoints-file "$WORK/endpoints.yaml" >"$WORK/controller.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:9090/readyz
"$ENVOY" -c envoy/envoy.yaml --concurrency 1 --disable-hot-restart -l warning >"$WORK/envoy.log" 2>&1 & pids+=($!)
plain_envoy_config 9903 10002 "$SIM_PORT" >"$WORK/plain.yaml"
"$ENVOY" -c "$WORK/plain.yaml" --concurrency 1 --disable-hot-restart -l warning >"$WORK/plain.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:9901/ready
wait_http http://127.0.0.1:9903/ready
wait_http http://127.0.0.1:10000/v1/models

load() { "$BIN/wasm-epp-loadgen" --url "http://127.0.0.1:$1/v1/completions" --requests "$PER_ROUND" \
  --concurrency 1 --max-tokens 1 --prompt-bytes 1024 --label "$2" --json "$WORK/$2-$3.json" >/dev/null; }
for round in $(seq 1 "$ROUNDS"); do
  load 10002 plain "$round"
  load 10000 wasm-epp "$round"
done
python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def med(mode, q):
    return statistics.median(json.load(open(f"{work}/{mode}-{r}.json"))["latency_ms"][q] for r in range(1, rounds + 1))
print(f"1 KB completion, 1 request at a time, median of {rounds} rounds (client-measured, ms):")
print(f"  {'':<10}{'plain Envoy':>13}{'+ wasm-epp':>13}{'added':>10}")
for q in ("p50", "p90", "p99"):
    a, b = med("plain", q), med("wasm-epp", q)
    print(f"  {q:<10}{a:>13.3f}{b:>13.3f}{b - a:>+10.3f}")
PY
