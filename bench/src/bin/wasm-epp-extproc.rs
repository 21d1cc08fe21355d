//! `wasm-epp-extproc`: the ext_proc baseline server (see `wasm_epp_bench::extproc`).
//!
//! On SIGTERM or SIGINT it prints `EXTPROC_PICK count=N p50_us=… p90_us=… p99_us=…` (the
//! server-side decision times) to stderr and exits 0.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use clap::Parser;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_stream::StreamExt;
use wasm_epp_bench::extproc::picking::PickState;
use wasm_epp_bench::extproc::poll::{self, ControllerUrl};
use wasm_epp_bench::extproc::service::PickerService;

/// Exit status for bad flags.
const EXIT_USAGE: u8 = 2;

/// Envoy ext_proc server making wasm-epp's pick (a baseline for benchmarks).
#[derive(Debug, Parser)]
#[command(name = "wasm-epp-extproc", version)]
struct Cli {
    /// Address of the gRPC listener (`127.0.0.1:0` picks a free port).
    #[arg(long, default_value = "127.0.0.1:9004")]
    listen: SocketAddr,
    /// Base URL of the controller's snapshot API.
    #[arg(long, default_value = "http://127.0.0.1:9002")]
    controller: ControllerUrl,
    /// Tokio worker threads.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=256))]
    threads: u16,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let message = e.to_string();
            let first = message.lines().next().unwrap_or_default();
            eprintln!("wasm-epp-extproc: {}", first.trim_start_matches("error: "));
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(usize::from(cli.threads))
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("wasm-epp-extproc: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wasm-epp-extproc: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let listener = TcpListener::bind(cli.listen)
        .await
        .map_err(|e| format!("cannot listen on {}: {e}", cli.listen))?;
    let local = listener.local_addr().map_or(cli.listen, |a| a);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let state = Arc::new(PickState::new(seed));
    tokio::spawn(poll::run(cli.controller.clone(), state.clone()));
    eprintln!(
        "wasm-epp-extproc listening on {local}; controller {}",
        cli.controller.poll_url(None, poll::LONG_POLL)
    );
    // gRPC over HTTP/2 sends small frames: no Nagle delay.
    let incoming = TcpListenerStream::new(listener).map(|conn| {
        if let Ok(stream) = &conn {
            let _ = stream.set_nodelay(true);
        }
        conn
    });
    tonic::transport::Server::builder()
        .add_service(PickerService::new(state.clone()).into_server())
        .serve_with_incoming_shutdown(incoming, stop_signal())
        .await
        .map_err(|e| format!("server failed: {e}"))?;
    eprintln!("EXTPROC_PICK {}", state.durations_summary());
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn stop_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
