#!/usr/bin/env bash
# `make kind-demo`: wasm-epp on Envoy Gateway in a local kind cluster.
#
# Creates the kind cluster wasm-epp-demo (or reuses it), installs Envoy Gateway v1.9.0 with the
# Gateway API CRDs (Helm, EnvoyPatchPolicy enabled), the InferencePool, InferenceObjective and
# InferenceModelRewrite CRDs of examples/crds/ (the ones the tests run against), three simulated vLLM servers, the wasm-epp controller image (built here, loaded into kind) and
# the manifests of examples/envoy-gateway/ with the filter's sha256 filled in. Then it sends a
# few requests through the Gateway and prints which pod served each one.
#
# Needs docker, kind, kubectl and helm, network access for the images, and the filter
# built on this host (`make build` does it; `make kind-demo` runs that first). Run it again at
# any time: every step converges. `make kind-down` deletes the cluster.
set -euo pipefail
cd "$(dirname "$0")/../.."

CLUSTER=wasm-epp-demo
CONTEXT=kind-$CLUSTER
EG_VERSION=v1.9.0
CRDS=examples/crds
WASM=target/wasm32-wasip1/wasm/wasm_epp.wasm
MANIFESTS=examples/envoy-gateway
LOCAL_PORT=${KIND_DEMO_PORT:-8888}
REQUESTS=${KIND_DEMO_REQUESTS:-20}
WAIT=300s

say() { printf '\n== %s\n' "$*"; }
die() { printf 'kind-demo: %s\n' "$*" >&2; exit 1; }
k() { kubectl --context "$CONTEXT" "$@"; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "$1 not found: $2"
}
need docker "install Docker (https://docs.docker.com/engine/install/)"
need kind "install kind (https://kind.sigs.k8s.io/docs/user/quick-start/#installation)"
need kubectl "install kubectl (https://kubernetes.io/docs/tasks/tools/)"
need helm "install Helm 3 (https://helm.sh/docs/intro/install/)"
need curl "install curl"
docker info >/dev/null 2>&1 || die "docker is installed but its daemon does not answer (is it running, may this user use it?)"
[[ -f $WASM ]] || die "$WASM is missing: run 'make build' (or 'make kind-demo', which builds first)"

sha256_of() {
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$1" | cut -d' ' -f1; else shasum -a 256 "$1" | cut -d' ' -f1; fi
}

# Waits (bounded) until a command succeeds; $1 is what is awaited, $2 the number of 2 s tries.
wait_for() {
  local what=$1 tries=$2 i
  shift 2
  for ((i = 0; i < tries; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 2
  done
  die "timed out waiting for $what"
}

say "kind cluster $CLUSTER"
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  echo "reusing the existing cluster"
else
  kind create cluster --name "$CLUSTER" --wait 120s
fi

say "Envoy Gateway $EG_VERSION and the Gateway API CRDs (Helm)"
helm upgrade --install eg oci://docker.io/envoyproxy/gateway-helm --version "$EG_VERSION" \
  --kube-context "$CONTEXT" -n envoy-gateway-system --create-namespace \
  --set config.envoyGateway.extensionApis.enableEnvoyPatchPolicy=true \
  --wait --timeout 5m
k -n envoy-gateway-system wait deployment/envoy-gateway --for=condition=Available --timeout="$WAIT"

say "InferencePool, InferenceObjective and InferenceModelRewrite CRDs"
k apply --server-side -f "$CRDS"
k wait --for=condition=Established --timeout=60s crd/inferencepools.inference.networking.k8s.io \
  crd/inferenceobjectives.llm-d.ai crd/inferencemodelrewrites.llm-d.ai

say "controller image"
docker build -f examples/controller-image/Dockerfile -t wasm-epp-controller:dev .
# Tag by image id: a rebuilt image gets a new tag, so the Deployments roll; an unchanged one
# does not.
IMAGE=wasm-epp-controller:$(docker image inspect -f '{{.Id}}' wasm-epp-controller:dev | cut -d: -f2 | cut -c1-12)
docker tag wasm-epp-controller:dev "$IMAGE"
kind load docker-image "$IMAGE" --name "$CLUSTER"
WASM_SHA256=$(sha256_of "$WASM")
echo "image $IMAGE, filter sha256 $WASM_SHA256"

# Applies manifests with the image tag and the filter's sha256 filled in. Each file is followed
# by a document separator, so that the last document of one file and the first of the next
# (which starts without "---") stay two objects.
apply() {
  local file
  for file in "$@"; do
    sed -e "s/WASM_SHA256/$WASM_SHA256/g" -e "s|wasm-epp-controller:dev|$IMAGE|g" "$file"
    printf '\n---\n'
  done | k apply -f -
}

say "namespace, simulated model servers, pool"
apply "$MANIFESTS/namespace.yaml"
apply examples/kind/vllm-sim.yaml "$MANIFESTS/inference-pool.yaml"
k -n llm rollout status deployment/vllm-sim --timeout="$WAIT"

say "wasm-epp controller"
apply "$MANIFESTS/controller.yaml"
k -n llm rollout status deployment/wasm-epp-controller --timeout="$WAIT"

say "Gateway, route, traffic policies, the filter and its patch"
apply "$MANIFESTS/gateway.yaml" "$MANIFESTS/route.yaml" "$MANIFESTS/wasm-epp-policies.yaml" \
  "$MANIFESTS/inference-objectives.yaml"
k -n llm wait gateway/inference-gateway --for=condition=Programmed --timeout="$WAIT"

policy_condition() { # kind name condition -> prints its status of the first ancestor
  k -n llm get "$1" "$2" -o "jsonpath={.status.ancestors[0].conditions[?(@.type==\"$3\")].status}"
}
policy_is() { [[ $(policy_condition "$1" "$2" "$3") == True ]]; }
wait_for "EnvoyExtensionPolicy wasm-epp to be Accepted" 60 policy_is envoyextensionpolicy wasm-epp Accepted
wait_for "EnvoyPatchPolicy wasm-epp-stop-iteration to be Programmed" 60 \
  policy_is envoypatchpolicy wasm-epp-stop-iteration Programmed

ENVOY_SELECTOR=gateway.envoyproxy.io/owning-gateway-name=inference-gateway,gateway.envoyproxy.io/owning-gateway-namespace=llm
envoy_service() {
  k -n envoy-gateway-system get service -l "$ENVOY_SELECTOR" -o 'jsonpath={.items[0].metadata.name}'
}
wait_for "the Gateway's Envoy Service" 60 envoy_service
SERVICE=$(envoy_service)
ENVOY_DEPLOYMENT=$(k -n envoy-gateway-system get deployment -l "$ENVOY_SELECTOR" -o 'jsonpath={.items[0].metadata.name}')
k -n envoy-gateway-system rollout status "deployment/$ENVOY_DEPLOYMENT" --timeout="$WAIT"

say "port-forward localhost:$LOCAL_PORT -> $SERVICE:80"
SCRATCH=$(mktemp -d)
# kubectl itself in the background (not the k wrapper), so that $! is the process to stop.
kubectl --context "$CONTEXT" -n envoy-gateway-system port-forward "service/$SERVICE" "$LOCAL_PORT:80" \
  >"$SCRATCH/port-forward.log" 2>&1 &
FORWARD_PID=$!
trap 'kill "$FORWARD_PID" 2>/dev/null || true; rm -rf "$SCRATCH"' EXIT
URL=http://127.0.0.1:$LOCAL_PORT
models_ok() { curl -sf -m 5 "$URL/v1/models"; }
wait_for "the Gateway to answer on $URL" 30 models_ok

say "$REQUESTS requests: base model and LoRA adapter food-review-1, 5 at a time"
send() { # n model -> writes $SCRATCH/n.headers and n.code
  curl -s -m 60 -o /dev/null -D "$SCRATCH/$1.headers" -w '%{http_code} %{time_total}' \
    "$URL/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$2\", \"prompt\": \"Write as if you were a critic: San Francisco\", \"max_tokens\": 30}" \
    >"$SCRATCH/$1.code" || echo "000 0" >"$SCRATCH/$1.code"
}
header() { # file name
  tr -d '\r' <"$1" | awk -v name="$2" 'tolower($1) == tolower(name) ":" { print $2 }'
}
# A bare `wait` would also wait for the port-forward: wait for the senders only.
senders=()
for ((n = 1; n <= REQUESTS; n++)); do
  if ((n % 4 == 0)); then model=food-review-1; else model=meta-llama/Llama-3.1-8B-Instruct; fi
  echo "$model" >"$SCRATCH/$n.model"
  send "$n" "$model" &
  senders+=($!)
  if ((${#senders[@]} == 5 || n == REQUESTS)); then
    wait "${senders[@]}"
    senders=()
  fi
done
printf '%4s  %-34s %-4s %7s  %-28s %s\n' '#' model code seconds x-inference-pod \
  'x-gateway-destination-endpoint (only if a response echoes it)'
for ((n = 1; n <= REQUESTS; n++)); do
  read -r code seconds <"$SCRATCH/$n.code" || true # curl -w writes no final newline
  pod=$(header "$SCRATCH/$n.headers" x-inference-pod)
  destination=$(header "$SCRATCH/$n.headers" x-gateway-destination-endpoint)
  printf '%4s  %-34s %-4s %7s  %-28s %s\n' "$n" "$(cat "$SCRATCH/$n.model")" "$code" "$seconds" \
    "${pod:--}" "$destination"
done
echo
echo "requests per pod:"
for ((n = 1; n <= REQUESTS; n++)); do header "$SCRATCH/$n.headers" x-inference-pod; done | sort | uniq -c

cat <<EOF

The picks come from the wasm-epp filter inside the Gateway's Envoy: it sets
x-gateway-destination-endpoint on the upstream request (the model servers see it, the client
does not). What the controller sees:
  kubectl --context $CONTEXT -n llm port-forward service/wasm-epp-controller 9090 &
  curl -s localhost:9090/debug/endpoints
To reach the Gateway again:
  kubectl --context $CONTEXT -n envoy-gateway-system port-forward service/$SERVICE $LOCAL_PORT:80
Clean up: make kind-down   (deletes the kind cluster $CLUSTER)
EOF
