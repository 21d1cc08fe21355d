//! `wasm-epp-controller`: wires the library's parts together; see the crate README.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::sync::{broadcast, oneshot};
use tracing::{info, warn};
use wasm_epp_controller::cli::{Cli, Settings, StartupError};
use wasm_epp_controller::discovery::Discovery;
use wasm_epp_controller::records::RecordLog;
use wasm_epp_controller::store::Store;
use wasm_epp_controller::{admin, config, log, peers, scrape, serve};

/// Exit status for bad flags, config, endpoints or manifests files.
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    log::init();
    let settings = match Cli::try_parse() {
        Ok(cli) => Settings::resolve(cli),
        // --help and --version print to stdout and exit 0.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => Err(StartupError::from_clap(&e)),
    };
    let settings = match settings {
        Ok(settings) => settings,
        Err(e) => {
            eprintln!("wasm-epp-controller: {e}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("wasm-epp-controller: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("wasm-epp-controller: {e}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Runtime(e)) => {
            eprintln!("wasm-epp-controller: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Why the controller stopped: a bad configuration (status 2) or anything else (status 1).
enum Failure {
    Usage(String),
    Runtime(String),
}

async fn run(settings: Settings) -> Result<(), Failure> {
    let discovery = settings
        .source
        .clone()
        .connect()
        .await
        .map_err(Failure::Usage)?;
    let snapshot_listener = bind(settings.listen).await.map_err(Failure::Runtime)?;
    let admin_listener = bind(settings.metrics_listen)
        .await
        .map_err(Failure::Runtime)?;
    for warning in &settings.warnings {
        warn!("config: {warning}");
    }
    info!(
        "wasm-epp-controller listening: snapshot API on {}, admin on {}; discovery: {}, {} endpoints; {}; scraping every {:?} (timeout {:?})",
        local_addr(&snapshot_listener),
        local_addr(&admin_listener),
        settings.source.describe(),
        settings.endpoints.len(),
        config::profile_summary(&settings.profile),
        settings.scrape.interval,
        settings.scrape.timeout,
    );

    let (manifests, manifests_watch) = match settings.manifests {
        Some(startup) => {
            info!("manifests: {}", startup.describe());
            (
                startup.loaded.manifests,
                Some((startup.source, startup.files)),
            )
        }
        None => Default::default(),
    };
    if let Discovery::Kubernetes(connected) = &discovery {
        info!("kubernetes: API server {}", connected.server());
    }
    if let Some(module) = &settings.wasm {
        info!(
            "serving the filter module at {} ({} bytes, sha256 {})",
            serve::WASM_PATH,
            module.bytes.len(),
            module.sha256
        );
    }
    let store = Arc::new(
        Store::with_manifests(settings.profile.clone(), settings.endpoints, manifests)
            .unready_after(settings.scrape.failures_before_unready),
    );
    store.set_config(settings.profile, settings.engines);
    let instance = store.current().snapshot.instance.clone();
    let relay = settings
        .peers
        .any()
        .then(|| broadcast::channel(peers::RELAY_QUEUE).0);
    let records = Arc::new(RecordLog::new(&instance, relay.clone()));
    // Scraping, and with it readiness, starts once discovery holds a complete endpoint list.
    let (synced, discovery_synced) = oneshot::channel();
    let scrape = {
        let store = store.clone();
        async move {
            if discovery_synced.await.is_ok() {
                scrape::run(store, settings.scrape).await;
            }
        }
    };
    let mut tasks = vec![
        tokio::spawn(discovery.run(store.clone(), synced)),
        tokio::spawn(scrape),
        tokio::spawn(serve::run(
            snapshot_listener,
            store.clone(),
            records,
            settings.long_poll_max,
            settings.wasm,
        )),
        tokio::spawn(admin::run(admin_listener, store.clone())),
    ];
    if let Some(relay) = relay {
        tasks.push(tokio::spawn(peers::run(settings.peers, instance, relay)));
    }
    if let Some((path, discovery)) = settings.config_file {
        tasks.push(tokio::spawn(config::reload::watch(
            path,
            discovery,
            store.clone(),
        )));
    }
    if let Some((source, files)) = manifests_watch {
        tasks.push(tokio::spawn(source.watch(store, files)));
    }
    let signal = shutdown_signal().await;
    info!("received {signal}, shutting down");
    for task in tasks {
        task.abort();
    }
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))
}

fn local_addr(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map_or_else(|e| format!("(unknown: {e})"), |addr| addr.to_string())
}

/// Resolves on SIGINT or SIGTERM with the signal's name.
async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => tokio::select! {
            _ = tokio::signal::ctrl_c() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        },
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}
