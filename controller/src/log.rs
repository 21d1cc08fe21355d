//! Logging: `tracing` events on stderr, one line each (time, level, message, fields).
//!
//! The controller logs little (startup, discovery changes, endpoints that start or stop failing).
//! `RUST_LOG` picks what is shown (`RUST_LOG=debug`, `RUST_LOG=wasm_epp_controller=debug,kube=info`);
//! by default the controller's own events from `info` up and its libraries' from `warn` up.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// What is logged when `RUST_LOG` is unset or invalid.
const DEFAULT_FILTER: &str = "warn,wasm_epp_controller=info";

/// Installs the stderr subscriber; call once, first thing in `main`.
pub fn init() {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
