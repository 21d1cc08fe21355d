//! `vllm-sim`: a vLLM-compatible model-server simulator. See the README.

mod api;
mod app;
mod cli;
mod completions;
mod control;
mod engine;
mod errors;
mod generation;
mod latency;
mod metrics;
mod openai;
mod prefix_cache;
mod respond;
mod server;
mod sse;
mod tokens;

use std::net::SocketAddr;
use std::process::ExitCode;

use clap::Parser;
use tokio::net::TcpListener;

use crate::app::App;
use crate::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("vllm-sim: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let requested = SocketAddr::new(cli.host, cli.port);
    let listener = TcpListener::bind(requested)
        .await
        .map_err(|e| format!("cannot listen on {requested}: {e}"))?;
    let addr = listener
        .local_addr()
        .map_err(|e| format!("cannot listen on {requested}: {e}"))?;
    let app = App::new(&cli, addr)?;
    eprintln!("vllm-sim {} listening on {addr}", app.instance_name);
    server::serve(app, listener)
        .await
        .map_err(|e| format!("server failed: {e}"))
}
