#!/usr/bin/env bash
# `make kind-down`: deletes the kind cluster of `make kind-demo` (and everything in it).
set -euo pipefail

CLUSTER=wasm-epp-demo

command -v kind >/dev/null 2>&1 || { echo "kind-down: kind not found (nothing to delete?)" >&2; exit 1; }
if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  kind delete cluster --name "$CLUSTER"
else
  echo "kind-down: no kind cluster named $CLUSTER"
fi
