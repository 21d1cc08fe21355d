//! Benchmark helpers for wasm-epp, driven by the Python harness in `bench/` (`make bench`).

pub mod extproc;
