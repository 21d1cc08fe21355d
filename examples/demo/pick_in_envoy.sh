#!/usr/bin/env bash
# `make bench-pick`, second half: the time one decision takes inside Envoy (the filter's
# `wasm_epp_decision_ns` histogram) with 8, 100 and 1,000 endpoints in the snapshot. One
# endpoint is a real simulator; the others are addresses with nothing listening, so requests
# picked onto them fail after the decision, which is all this measures.
set -euo pipefail
cd "$(dirname "$0")/../.."

NAME=pick-bench
source examples/demo/lib.sh
REQUESTS=${PICK_REQUESTS:-2000}
require_free_ports 10000 9901 9002 9090 18201

"$BIN/vllm-sim" --port 18201 --instance-name sim --ttft-base-ms 0 --itl-ms 0 >"$WORK/sim.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18201/health
echo "pick latency inside Envoy (wasm_epp_decision_ns histogram, cumulative), default profile, 1 KB prompts:"
for n in 8 100 1000; do
  {
    echo "endpoints:"
    echo "- { name: sim, address: 127.0.0.1, port: 18201 }"
    for i in $(seq 2 "$n"); do echo "- { name: idle-$i, address: 127.0.0.1, port: $((30000 + i)) }"; done
  } >"$WORK/endpoints.yaml"
  "$BIN/wasm-epp-controller" --endpoints-file "$WORK/endpoints.yaml" --refresh-metrics-interval 1s \
    >"$WORK/controller-$n.log" 2>&1 & cpid=$!; pids+=("$cpid")
  wait_http http://127.0.0.1:9090/readyz
  "$ENVOY" -c envoy/envoy.yaml --concurrency 1 --disable-hot-restart -l error >"$WORK/envoy-$n.log" 2>&1 & epid=$!; pids+=("$epid")
  wait_http http://127.0.0.1:9901/ready
  sleep 1 # the poller's first snapshot
  "$BIN/wasm-epp-loadgen" --url http://127.0.0.1:10000/v1/completions --requests "$REQUESTS" \
    --concurrency 2 --max-tokens 1 --prompt-bytes 1024 --shared-prefix-groups 16 --prefix-bytes 768 \
    --timeout 5 >"$WORK/load-$n.txt"
  [[ -n "${PICK_VERBOSE:-}" ]] && cat "$WORK/load-$n.txt"
  sleep 6 # Envoy computes histogram quantiles at its 5 s stats flush
  python3 - "$n" <<'PY'
import json, sys, urllib.request
stats = json.load(urllib.request.urlopen("http://127.0.0.1:9901/stats?format=json&filter=wasm_epp_decision_ns"))
for entry in stats["stats"]:
    hist = entry.get("histograms")
    if not hist:
        continue
    qs = hist["supported_quantiles"]
    for h in hist["computed_quantiles"]:
        values = {q: v["cumulative"] for q, v in zip(qs, h["values"])}
        us = lambda q: (values.get(q) or 0) / 1000
        print(f"PICK_IN_ENVOY endpoints={sys.argv[1]:<5} p50_us={us(50):.1f} p90_us={us(90):.1f} p99_us={us(99):.1f}")
PY
  kill "$epid" "$cpid"; wait "$epid" "$cpid" 2>/dev/null || true
done
