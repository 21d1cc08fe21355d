#!/usr/bin/env bash
# `make test-vllm`: the end-to-end tests of tests/vllm.rs against two real vLLM servers.
#
# Installs vLLM and the tiny model (scripts/vllm-tools.sh, once per machine), starts two servers
# (one pinned per core), runs the tests (they start the controller and Envoy themselves) and
# stops the servers whatever happens. Skips, exit 0, with one line when vLLM cannot be installed
# on this machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
RUN=$ROOT/.run/vllm

rc=0
bash scripts/vllm-tools.sh || rc=$?
if ((rc == 3)); then
  echo "test-vllm: SKIPPED: vLLM cannot be installed on this machine (see the line above)"
  exit 0
fi
((rc == 0)) || {
  echo "test-vllm: scripts/vllm-tools.sh failed ($rc)" >&2
  exit 1
}

trap 'bash scripts/vllm-tools.sh stop "$RUN"' EXIT
bash scripts/vllm-tools.sh start "$RUN"
WASM_EPP_VLLM=$(paste -sd, "$RUN/addresses") \
  cargo test --locked -p wasm-epp --test vllm -- --ignored --test-threads 1 --nocapture
