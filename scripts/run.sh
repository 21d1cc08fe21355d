#!/usr/bin/env bash
# `make run`: the controller and Envoy (envoy/envoy.yaml) in the foreground for your config.
#   EPP_CONFIG     EndpointPickerConfig YAML (its dataLayer.discovery names the endpoints file)
#   EPP_ENDPOINTS  an upstream-format endpoints file (instead of discovery in EPP_CONFIG)
#   EPP_MANIFESTS  InferenceObjective / InferenceModelRewrite manifests (passed as --manifests)
#   EPP_ENVOY      the Envoy config (default envoy/envoy.yaml; envoy/envoy-fallbacks.yaml for
#                  comma-separated fallbacks through override_host)
#   EPP_REPLICAS   how many Envoy replicas (default 1, at most 32): replica i listens on
#                  127.0.0.1:(10000+i) with admin on 127.0.0.1:(9901+i), all polling the one
#                  controller and sharing their prefix records through it
#
# The data plane outlives the control plane: when the controller exits, Envoy keeps routing on
# the last snapshot it has and the controller is started again after 1, 2, 4 … up to 30 s
# (reset once it has run a minute), each restart logged. Only Ctrl-C or SIGTERM stops both.
# If the first controller exits with status 2 (its status for bad flags, config, endpoints or
# manifests files), nothing was ever right: everything stops with that status. A later one
# that does is restarted like any other, so Envoy keeps serving while you fix the file. If
# any Envoy replica exits, everything is stopped.
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

replicas="${EPP_REPLICAS:-1}"
if ! [[ "$replicas" =~ ^[0-9]+$ ]] || (( replicas < 1 || replicas > 32 )); then
  echo "make run: EPP_REPLICAS must be a whole number from 1 to 32 (got \"$replicas\")" >&2
  exit 2
fi
envoy_config="${EPP_ENVOY:-envoy/envoy.yaml}"
for port in "port_value: 10000 " "port_value: 9901 "; do
  if (( replicas > 1 )) && ! grep -q "$port" "$envoy_config"; then
    echo "make run: $envoy_config has no \"$port\" to give each replica its own port" >&2
    exit 2
  fi
done

# Restart backoff (seconds), its ceiling, and how long a controller must run to reset it.
BACKOFF_FIRST=1
BACKOFF_MAX=30
BACKOFF_RESET_AFTER=60
# The controller's exit status for a bad configuration.
EXIT_USAGE=2

envoy_pids=()
configs=""
stop() {
  trap - INT TERM EXIT
  # Every background job: Envoy, the controller and a backoff sleep.
  # shellcheck disable=SC2046
  kill $(jobs -p) 2>/dev/null || true
  wait 2>/dev/null || true
  [[ -n "$configs" ]] && rm -rf "$configs"
  exit "${1:-0}"
}
trap 'stop 130' INT
trap 'stop 143' TERM
trap 'stop $?' EXIT

start_controller() {
  "${WASM_EPP_BIN_DIR:-target/release}/wasm-epp-controller" "${args[@]}" &
  controller_pid=$!
  controller_started=$SECONDS
  echo "wasm-epp: controller started (pid $controller_pid)" >&2
}

start_controller
if (( replicas > 1 )); then
  configs="$(mktemp -d)"
fi
for (( i = 0; i < replicas; i++ )); do
  config="$envoy_config"
  if (( replicas > 1 )); then
    # Replica i: the shipped config with its own listener and admin ports.
    config="$configs/envoy-$i.yaml"
    sed -e "s/port_value: 10000 /port_value: $((10000 + i)) /" \
        -e "s/port_value: 9901 /port_value: $((9901 + i)) /" "$envoy_config" > "$config"
  fi
  "${ENVOY_BIN:-.venv/envoy}" -c "$config" --disable-hot-restart -l warning --component-log-level wasm:info &
  envoy_pids+=($!)
  echo "wasm-epp: Envoy replica $i on http://127.0.0.1:$((10000 + i)) (admin 127.0.0.1:$((9901 + i)), pid $!)" >&2
done
echo "wasm-epp: controller snapshot API on 127.0.0.1:9002, metrics on 127.0.0.1:9090" >&2

backoff=$BACKOFF_FIRST
restarts=0
while true; do
  status=0
  wait -n "${envoy_pids[@]}" "$controller_pid" || status=$?
  for (( i = 0; i < replicas; i++ )); do
    if ! kill -0 "${envoy_pids[$i]}" 2>/dev/null; then
      echo "wasm-epp: Envoy replica $i exited (status $status); stopping everything" >&2
      stop "$((status == 0 ? 1 : status))"
    fi
  done
  if (( restarts == 0 && status == EXIT_USAGE )); then
    echo "wasm-epp: the controller exited at start (status $status); fix the configuration above" >&2
    stop "$status"
  fi
  if (( SECONDS - controller_started >= BACKOFF_RESET_AFTER )); then
    backoff=$BACKOFF_FIRST
  fi
  echo "wasm-epp: controller exited (status $status); Envoy keeps routing on its last snapshot; restarting the controller in ${backoff} s" >&2
  sleep "$backoff" &
  wait $! || true
  backoff=$((backoff * 2 > BACKOFF_MAX ? BACKOFF_MAX : backoff * 2))
  restarts=$((restarts + 1))
  start_controller
done
