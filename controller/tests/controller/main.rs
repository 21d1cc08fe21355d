//! Integration tests: the real `wasm-epp-controller` binary against fake model servers on
//! 127.0.0.1 (and, for Kubernetes discovery, a fake API server).

mod admin;
mod common;
mod discovery;
mod fake_apiserver;
mod kubernetes;
mod manifests;
mod snapshot;
mod startup;
