# Shared by the demo and benchmark scripts (sourced, not run). The caller sets NAME (for
# messages); this sets WORK (a scratch folder) and pids (processes to stop on exit).
# shellcheck shell=bash

BIN=target/release
ENVOY=.venv/envoy
WORK=$(mktemp -d -t "wasm-epp-$NAME.XXXXXX")
pids=()

cleanup() {
  trap - EXIT INT TERM
  kill "${pids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Prints the message and the tail of every log in WORK, then exits 1.
fail() {
  echo "$NAME: $*" >&2
  for log in "$WORK"/*.log; do [[ -s "$log" ]] && { echo "--- $log" >&2; tail -n 5 "$log" >&2; }; done
  exit 1
}

# Fails unless every given port on 127.0.0.1 is free.
require_free_ports() {
  for port in "$@"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      fail "port $port on 127.0.0.1 is in use; stop what runs there (or an earlier make run) first"
    fi
  done
}

# Waits (bounded, about 10 s) until an HTTP GET of $1 answers 200; $2 names it in the error.
wait_http() {
  local url=$1 what=${2:-$1}
  for _ in $(seq 1 200); do
    python3 -c 'import sys, urllib.request as u; sys.exit(0 if u.urlopen(sys.argv[1], timeout=1).status == 200 else 1)' \
      "$url" 2>/dev/null && return 0
    sleep 0.05
  done
  fail "$what did not come up ($url)"
}

# Writes to stdout an Envoy config with no picker (the template envoy/plain.yaml.template, run
# from the repository root): admin on $1, a listener on $2 proxying to a round-robin cluster of
# the model servers on 127.0.0.1 ports $3….
plain_envoy_config() {
  local admin=$1 listen=$2 text endpoints=""
  shift 2
  for port in "$@"; do
    endpoints+="        - endpoint: { address: { socket_address: { address: 127.0.0.1, port_value: $port } } }"$'\n'
  done
  text=$(<envoy/plain.yaml.template)
  # The placeholders are literal text, hence the single quotes.
  # shellcheck disable=SC2016
  text=${text//'${ADMIN_PORT}'/$admin}
  text=${text//'${PORT}'/$listen}
  text=${text//'${LB_POLICY}'/ROUND_ROBIN}
  text=${text//'${ENDPOINTS}'/${endpoints%$'\n'}}
  printf '%s\n' "$text"
}
