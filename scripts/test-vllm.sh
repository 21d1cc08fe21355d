#!/usr/bin/env bash
# `make test-vllm`: the end-to-end tests of tests/vllm.rs against two real vLLM servers.
#
# Installs vLLM and the tiny model (scripts/vllm-tools.sh, once per machine), starts two servers
# on 127.0.0.1, each pinned to its own core (unpinned, two CPU servers on 2 cores collapse to a
# fraction of their speed), with a 64-block KV cache so its usage moves, prefix caching and two
# LoRA slots; runs the tests (they start the controller and Envoy themselves); stops the servers
# whatever happens. Skips, exit 0, with one line when vLLM cannot be installed on this machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
START_TIMEOUT_S=${VLLM_START_TIMEOUT_S:-240}
LOGS=$ROOT/.run/vllm
die() {
  printf 'test-vllm: %s\n' "$*" >&2
  exit 1
}

rc=0
bash scripts/vllm-tools.sh || rc=$?
if ((rc == 3)); then
  echo "test-vllm: SKIPPED: vLLM cannot be installed on this machine (see the line above)"
  exit 0
fi
((rc == 0)) || die "scripts/vllm-tools.sh failed ($rc)"

VLLM=$ROOT/.tools/vllm
mkdir -p "$LOGS"
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 200); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  done
}
trap stop EXIT

cores=$(nproc)
addresses=()
started=$SECONDS
# One after the other: two servers starting at once raced for their internal ports here, and
# one lost its worker at the first request.
for i in 0 1; do
  port=$(free_port)
  core=$((i % cores))
  HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1 \
    VLLM_CPU_OMP_THREADS_BIND=$core \
    setsid taskset -c "$core" "$VLLM/venv/bin/vllm" serve "$VLLM/model" --host 127.0.0.1 --port "$port" \
    --served-model-name tiny --max-model-len 4096 --max-num-seqs 8 --enable-prefix-caching \
    --enforce-eager --distributed-executor-backend uni --num-gpu-blocks-override 64 \
    --enable-lora --max-loras 2 --max-lora-rank 8 \
    --lora-modules "lora1=$VLLM/lora1" "lora2=$VLLM/lora2" >"$LOGS/vllm-$i.log" 2>&1 </dev/null &
  pids+=($!)
  addresses+=("127.0.0.1:$port")
  until curl -fsS --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; do
    if ! kill -0 "${pids[$i]}" 2>/dev/null; then
      tail -30 "$LOGS/vllm-$i.log" >&2
      die "vLLM server $i exited during start-up (log: $LOGS/vllm-$i.log)"
    fi
    if ((SECONDS - started > START_TIMEOUT_S)); then
      tail -30 "$LOGS/vllm-$i.log" >&2
      die "vLLM server $i not healthy within ${START_TIMEOUT_S}s"
    fi
    sleep 1
  done
  # vLLM 0.32 (CPU) lost its worker here when a server's very first request had a prompt of 4
  # tokens or fewer; later short prompts are fine. A longer first request avoids it.
  curl -fsS --max-time 60 "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
    -d '{"model": "tiny", "prompt": "a first request to warm the server up", "max_tokens": 4}' >/dev/null \
    || die "vLLM server $i failed its first request (log: $LOGS/vllm-$i.log)"
done
echo "test-vllm: 2 vLLM servers ready in $((SECONDS - started))s: ${addresses[*]}"

WASM_EPP_VLLM=$(
  IFS=,
  echo "${addresses[*]}"
) cargo test --locked -p wasm-epp --test vllm -- --ignored --test-threads 1 --nocapture
