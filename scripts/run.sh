#!/usr/bin/env bash
# `make run`: the controller and Envoy (envoy/envoy.yaml) in the foreground for your config.
#   EPP_CONFIG     EndpointPickerConfig YAML (its dataLayer.discovery names the endpoints file)
#   EPP_ENDPOINTS  an upstream-format endpoints file (instead of discovery in EPP_CONFIG)
#   EPP_MANIFESTS  InferenceObjective / InferenceModelRewrite manifests (passed as --manifests)
#   EPP_ENVOY      the Envoy config (default envoy/envoy.yaml; envoy/envoy-fallbacks.yaml for
#                  comma-separated fallbacks through override_host)
# Ctrl-C or SIGTERM stops both; if either exits, the other is stopped too.
set -euo pipefail
cd "$(dirname "$0")/.."

args=()
[[ -n "${EPP_CONFIG:-}" ]] && args+=(--config-file "$EPP_CONFIG")
[[ -n "${EPP_ENDPOINTS:-}" ]] && args+=(--endpoints-file "$EPP_ENDPOINTS")
[[ -n "${EPP_MANIFESTS:-}" ]] && args+=(--manifests "$EPP_MANIFESTS")
if [[ ${#args[@]} -eq 0 ]]; then
  echo "make run: set EPP_CONFIG=path (an EndpointPickerConfig with file discovery) or EPP_ENDPOINTS=path" >&2
  exit 2
fi

pids=()
stop() { trap - INT TERM EXIT; kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap stop INT TERM EXIT

target/release/wasm-epp-controller "${args[@]}" &
pids+=($!)
.venv/envoy -c "${EPP_ENVOY:-envoy/envoy.yaml}" --disable-hot-restart -l warning --component-log-level wasm:info &
pids+=($!)
echo "wasm-epp: Envoy on http://127.0.0.1:10000 (admin 127.0.0.1:9901), controller snapshot API on 127.0.0.1:9002, metrics on 127.0.0.1:9090" >&2
wait -n "${pids[@]}"
