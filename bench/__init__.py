"""The wasm-epp benchmark harness (`make bench`); see bench/run.py."""
