//! `wasm-epp-loadgen`: a bounded load generator for OpenAI-compatible LLM
//! endpoints. See the README for flags and output.

mod cli;
mod client;
mod openai;
mod prompts;
mod report;
mod run;
mod stats;
mod trace;

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;

use crate::cli::Cli;
use crate::client::Target;
use crate::openai::Api;
use crate::prompts::Workload;
use crate::report::{Report, Setup};
use crate::run::Load;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match tokio::runtime::Runtime::new() {
        Ok(runtime) => match runtime.block_on(load(cli)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(message) => {
                eprintln!("wasm-epp-loadgen: {message}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("wasm-epp-loadgen: cannot start the runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The target URLs as the report names them (comma-separated).
fn targets(cli: &Cli) -> String {
    let urls: Vec<String> = cli.url.iter().map(ToString::to_string).collect();
    urls.join(",")
}

/// Runs the load, prints the report and writes the JSON and trace files.
async fn load(cli: Cli) -> Result<(), String> {
    let models = if cli.lora.is_empty() {
        vec![cli.model.clone()]
    } else {
        cli.lora.clone()
    };
    let workload = Workload::new(
        cli.seed,
        cli.prompt_bytes as usize,
        cli.shared_prefix_groups as usize,
        cli.prefix_bytes as usize,
        models,
    )
    .with_lengths(cli.length_dist, cli.max_tokens)
    .starting_at(cli.first_index);
    let apis: Vec<_> = cli.url.iter().map(|u| Api::of_path(u.path())).collect();
    if apis.windows(2).any(|pair| pair[0] != pair[1]) {
        return Err(format!(
            "every --url must speak the same API (chat or completions): {}",
            targets(&cli)
        ));
    }
    let target = Target::new(
        cli.url.clone(),
        cli.stream,
        cli.max_tokens,
        cli.instance_header.clone(),
        cli.timeout(),
        cli.concurrency as usize,
        cli.headers.clone(),
    );
    let setup = Setup {
        label: cli.label.clone(),
        url: targets(&cli),
        api: target.api().name(),
        stream: cli.stream,
        concurrency: cli.concurrency,
        rate: cli.rate,
    };
    let load = Load {
        requests: cli.requests,
        concurrency: cli.concurrency,
        rate: cli.rate,
    };
    let result = run::run(Arc::new(target), Arc::new(workload), load).await;
    if let Some(error) = report::unreachable(&result.outcomes) {
        return Err(format!("cannot reach {}: {error}", targets(&cli)));
    }
    let report = Report::new(setup, &result);
    print!("{report}");
    if let Some(path) = &cli.json {
        let json = serde_json::to_string_pretty(&report)
            .map_err(|e| format!("cannot encode the JSON report: {e}"))?;
        tokio::fs::write(path, json + "\n")
            .await
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    if let Some(path) = &cli.trace {
        tokio::fs::write(path, trace::lines(&result))
            .await
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(())
}
