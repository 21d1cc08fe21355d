//! Integration tests: the real `wasm-epp-controller` binary against fake model servers on
//! 127.0.0.1 and, for Kubernetes discovery, a real API server (and a fake one for injected
//! faults).

mod admin;
mod apiserver;
mod common;
mod discovery;
mod examples;
mod fake_apiserver;
mod k8s_fixtures;
mod kubernetes;
mod manifests;
mod real_apiserver;
mod snapshot;
mod startup;
