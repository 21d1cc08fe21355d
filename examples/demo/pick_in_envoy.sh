#!/usr/bin/env bash
# `make bench-pick`, second half: the time one decision takes inside Envoy (the filter's
# `wasm_epp_decision_ns` histogram) with 8, 100 and 1,000 endpoints in the snapshot. One
# endpoint is a real simulator; the others are addresses with nothing listening, so requests
# picked onto them fail after the decision, which is all this measures.
set -euo pipefail
cd "$(dirname "$0")/../.."

BIN=target/release
ENVOY=.venv/envoy
WORK=$(mktemp -d -t wasm-epp-pick.XXXXXX)
REQUESTS=${PICK_REQUESTS:-2000}
pids=()
cleanup() { trap - EXIT; kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

for port in 10000 9901 9002 9090 18201; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "pick bench: port $port on 127.0.0.1 is in use" >&2; exit 1
  fi
done
wait_http() {
  for _ in $(seq 1 200); do
    python3 -c 'import sys, urllib.request as u; sys.exit(0 if u.urlopen(sys.argv[1], timeout=1).status == 200 else 1)' "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  echo "pick bench: $1 did not come up" >&2; exit 1
}

"$BIN/vllm-sim" --port 18201 --instance-name sim --ttft-base-ms 0 --itl-ms 0 >"$WORK/sim.log" 2>&1 & pids+=($!)
wait_http http://127.0.0.1:18201/health
echo "pick latency inside Envoy (wasm-epp_decision_ns histogram, cumulative), default profile, 1 KB prompts:"
for n in 8 100 1000; do
  {
    echo "endpoints:"
    echo "- { name: sim, address: 127.0.0.1, port: 18201 }"
    for i in $(seq 2 "$n"); do echo "- { name: idle-$i, address: 127.0.0.1, port: $((30000 + i)) }"; done
  } >"$WORK/endpoints.yaml"
  "$BIN/wasm-epp-controller" --endpoints-file "$WORK/endpoints.yaml" --refresh-metrics-interval 1s \
    >"$WORK/controller-$n.log" 2>&1 & cpid=$!
  wait_http http://127.0.0.1:9090/readyz
  "$ENVOY" -c envoy/envoy.yaml --concurrency 1 --disable-hot-restart -l error >"$WORK/envoy-$n.log" 2>&1 & epid=$!
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
