//! Integration tests: the real `wasm-epp-controller` binary against fake model servers on
//! 127.0.0.1.

mod admin;
mod common;
mod discovery;
mod manifests;
mod snapshot;
mod startup;
