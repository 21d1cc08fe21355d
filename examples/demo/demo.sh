#!/usr/bin/env bash
# `make demo`: three simulated vLLM servers of different speed, the controller and Envoy with the
# wasm-epp filter (envoy/envoy.yaml as shipped). The same burst of shared-prefix streaming
# requests goes once through plain Envoy round-robin and once through wasm-epp; the script prints
# where requests went and the latency of both, then stops everything it started.
set -euo pipefail
cd "$(dirname "$0")/../.."

NAME=demo
source examples/demo/lib.sh
SIM_PORTS=(18001 18002 18003)
SIM_NAMES=(fast medium slow)
SIM_SCALES=(1 2 4)
# Workload knobs (the defaults are what the README describes).
REQUESTS=${DEMO_REQUESTS:-240}
CONCURRENCY=${DEMO_CONCURRENCY:-16}
PREFIX_GROUPS=${DEMO_GROUPS:-24}
LOAD=(--requests "$REQUESTS" --concurrency "$CONCURRENCY" --stream --max-tokens 32
      --shared-prefix-groups "$PREFIX_GROUPS" --prefix-bytes 4096 --prompt-bytes 256 --seed 7)

require_free_ports 10000 9901 9002 9090 10001 9902 "${SIM_PORTS[@]}"

sim_pids=()
start_sims() {
  sim_pids=()
  for i in 0 1 2; do
    "$BIN/vllm-sim" --port "${SIM_PORTS[$i]}" --instance-name "${SIM_NAMES[$i]}" \
      --time-scale "${SIM_SCALES[$i]}" --max-num-seqs 4 >>"$WORK/sim-${SIM_NAMES[$i]}.log" 2>&1 &
    sim_pids+=($!)
    pids+=($!)
  done
  for port in "${SIM_PORTS[@]}"; do wait_http "http://127.0.0.1:$port/health" "simulator :$port"; done
}

echo "== wasm-epp demo: 3 simulated vLLM servers — fast (1x), medium (2x slower), slow (4x slower), 4 sequences each"
start_sims

{
  echo "endpoints:"
  for i in 0 1 2; do
    echo "- { name: ${SIM_NAMES[$i]}, namespace: demo, address: 127.0.0.1, port: ${SIM_PORTS[$i]} }"
  done
} >"$WORK/endpoints.yaml"

# Round-robin baseline: the same Envoy, no picker, a static round-robin cluster of the servers.
plain_envoy_config 9902 10001 "${SIM_PORTS[@]}" >"$WORK/round-robin.yaml"

"$ENVOY" -c "$WORK/round-robin.yaml" --concurrency 2 --disable-hot-restart -l warning >"$WORK/envoy-rr.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:9902/ready" "round-robin Envoy"

echo "== burst 1: $REQUESTS streaming requests ($PREFIX_GROUPS groups, each sharing a 4 KB system prompt), $CONCURRENCY at a time, Envoy round-robin"
"$BIN/wasm-epp-loadgen" --url http://127.0.0.1:10001/v1/completions "${LOAD[@]}" \
  --label round-robin --json "$WORK/rr.json" >"$WORK/rr.txt" || fail "load generator failed (round-robin)"

# Cold caches for the second run: restart the servers.
kill "${sim_pids[@]}" 2>/dev/null || true
wait "${sim_pids[@]}" 2>/dev/null || true
start_sims

echo "== starting wasm-epp-controller (scrapes every 50 ms) and Envoy with the wasm-epp filter (envoy/envoy.yaml)"
"$BIN/wasm-epp-controller" --endpoints-file "$WORK/endpoints.yaml" >"$WORK/controller.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:9090/readyz" "controller"
"$ENVOY" -c envoy/envoy.yaml --concurrency 2 --disable-hot-restart -l warning >"$WORK/envoy.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:9901/ready" "Envoy"
for _ in $(seq 1 100); do
  code=$(python3 -c 'import urllib.request as u
try: print(u.urlopen(u.Request("http://127.0.0.1:10000/v1/models"), timeout=2).status)
except Exception as e: print(getattr(e, "code", 0))')
  [[ "$code" == 200 ]] && break
  sleep 0.05
done
[[ "$code" == 200 ]] || fail "Envoy never received a snapshot from the controller"

echo "== burst 2: the same $REQUESTS requests through wasm-epp (default profile: queue 2, kv-cache 2, prefix-cache 3)"
"$BIN/wasm-epp-loadgen" --url http://127.0.0.1:10000/v1/completions "${LOAD[@]}" \
  --label wasm-epp --json "$WORK/epp.json" >"$WORK/epp.txt" || fail "load generator failed (wasm-epp)"

python3 - "$WORK/rr.json" "$WORK/epp.json" <<'PY'
import json, sys
rr, epp = (json.load(open(p)) for p in sys.argv[1:3])

def line(name, a, b, better):
    if a is None or b is None:
        return
    gain = (a / b if better == "lower" else b / a) if a > 0 and b > 0 else float("nan")
    print(f"  {name:<22}{a:>13.1f}{b:>13.1f}{gain:>10.2f}x")

print()
print(f"  {'':<22}{'round-robin':>13}{'wasm-epp':>13}{'wasm-epp':>11}")
print(f"  {'requests ok':<22}{rr['ok']:>9}/{rr['requests']:<3}{epp['ok']:>9}/{epp['requests']:<3}{'better by':>11}")
for key, label in (("ttft_ms", "TTFT"), ("latency_ms", "end-to-end")):
    for q in ("p50", "p90", "p99"):
        line(f"{label} {q} (ms)", (rr[key] or {}).get(q), (epp[key] or {}).get(q), "lower")
line("output tokens/s", rr["output_tokens_per_s"], epp["output_tokens_per_s"], "higher")
print()
print("  where the requests went        round-robin   wasm-epp")
for name in ("fast", "medium", "slow"):
    count = lambda r: next((i["count"] for i in r["instances"] if i["name"] == name), 0)
    print(f"    {name:<28}{count(rr):>11}{count(epp):>11}")
print()
print("  wasm-epp sends more of the work to the server with the shortest queue and free KV cache,")
print("  and keeps each shared system prompt where it is already cached; round-robin spreads")
print("  requests evenly whatever the load.")
PY
echo "== done; stopping the simulators, the controller and both Envoys"
