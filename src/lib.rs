//! wasm-epp: an inference-aware endpoint picker that runs inside Envoy as a Proxy-Wasm filter.
//!
//! The crate is a plain Rust library — request parsing ([`request`]), the snapshot format
//! ([`snapshot`]) and the scheduler ([`scheduler`]) — plus, when built for wasm32 with the
//! `proxy` feature, a thin Proxy-Wasm shell that wires them into Envoy.

pub mod admission;
pub mod decision_header;
pub mod director;
pub mod errors;
pub mod exchange;
pub mod flow_control;
pub mod header_map;
pub mod lease;
pub mod phases;
pub mod plugin_config;
pub mod replica_records;
pub mod request;
pub mod request_metrics;
pub mod rewrite;
pub mod scheduler;
pub mod shared_data;
pub mod snapshot;
pub mod subset;

#[cfg(all(target_arch = "wasm32", feature = "proxy"))]
mod shim;
