//! Command-line flags, and their resolution (with the config and endpoints files) into the
//! [`Settings`] the controller runs with.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use hyper::http::uri::PathAndQuery;
use wasm_epp::scheduler::profile::Profile;
use wasm_epp::snapshot::Endpoint;

use crate::config::{self, PickerConfig};
use crate::discovery::file::FileSource;
use crate::discovery::kubernetes::KubeSource;
use crate::discovery::Source;
use crate::duration::parse_duration;
use crate::engines::Engines;
use crate::manifests::{self, ManifestSource, PoolSelector};
use crate::peers::PeerSettings;
use crate::scrape::ScrapeSettings;
use crate::serve::WasmModule;
use crate::store;

/// The scrape timeout is capped at this many refresh intervals.
pub const TIMEOUT_INTERVALS: u32 = 20;

/// wasm-epp controller: discovers model servers, scrapes their metrics and serves versioned
/// snapshots to the wasm-epp filter in Envoy.
#[derive(Debug, Clone, Parser)]
#[command(name = "wasm-epp-controller", version)]
pub struct Cli {
    /// EndpointPickerConfig YAML (plugins, scheduling profile, data layer). Without it the
    /// upstream default profile is used.
    #[arg(long, value_name = "PATH")]
    pub config_file: Option<PathBuf>,

    /// Endpoints file for file discovery, re-read when it changes. Shortcut for a config with
    /// `dataLayer.discovery` naming a `file-discovery` plugin (the two cannot be combined).
    #[arg(long, value_name = "PATH")]
    pub endpoints_file: Option<PathBuf>,

    /// InferenceObjective / InferenceModelRewrite manifests: a multi-document YAML file, or a
    /// directory of `*.yaml`/`*.yml` files. Re-read when they change.
    #[arg(long, value_name = "PATH")]
    pub manifests: Option<PathBuf>,

    /// The InferencePool this controller serves. Without file discovery, its endpoints come
    /// from Kubernetes (the pool and its Pods, watched). With file discovery, only manifests
    /// whose `spec.poolRef.name` is this pool (and whose namespace is --pool-namespace) are
    /// used; without it, every manifest is used whatever its poolRef.
    #[arg(long, value_name = "NAME")]
    pub pool_name: Option<String>,

    /// Namespace of the pool; also the namespace of manifests that name none.
    #[arg(long, value_name = "NAMESPACE", default_value = manifests::DEFAULT_POOL_NAMESPACE)]
    pub pool_namespace: String,

    /// Kubeconfig file for Kubernetes discovery. Without it: KUBECONFIG, ~/.kube/config, then
    /// the in-cluster service account.
    #[arg(long, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The wasm-epp filter module, served on the snapshot listener at /wasm-epp.wasm (with its
    /// SHA-256 at /wasm-epp.wasm.sha256). Read once at startup.
    #[arg(long, value_name = "PATH")]
    pub wasm_file: Option<PathBuf>,

    /// Address of the snapshot API.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9002")]
    pub listen: SocketAddr,

    /// Address of the health, metrics and debug endpoints.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9090")]
    pub metrics_listen: SocketAddr,

    /// How often every endpoint is scraped (e.g. 50ms, 1s, 2m).
    #[arg(long, value_name = "DURATION", default_value = "50ms", value_parser = parse_duration)]
    pub refresh_metrics_interval: Duration,

    /// Limit for one scrape; capped at 20 refresh intervals.
    #[arg(long, value_name = "DURATION", default_value = "1s", value_parser = parse_duration)]
    pub scrape_timeout: Duration,

    /// Consecutive failed scrapes after which an endpoint stops being a candidate (marked
    /// `ready: false` in the snapshot); one successful scrape brings it back. With the default
    /// interval, a dead server is out within about two intervals.
    #[arg(long, value_name = "N", default_value_t = store::DEFAULT_FAILED_SCRAPES_BEFORE_UNREADY)]
    pub failed_scrapes_before_unready: u32,

    /// Path of the model servers' Prometheus metrics.
    #[arg(long, value_name = "PATH", default_value = "/metrics")]
    pub metrics_path: String,

    /// Longest a snapshot long-poll is held.
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = parse_duration)]
    pub long_poll_max: Duration,

    /// Another controller replica's snapshot API (`host:port`), to which the prefix records
    /// this controller's Envoys upload are relayed (and from which it gets theirs); repeat for
    /// each peer. No leader: every controller relays to all the others.
    #[arg(long = "peer", value_name = "HOST:PORT", value_parser = host_port)]
    pub peers: Vec<String>,

    /// A DNS name whose addresses are the controller replicas (in Kubernetes, the
    /// controller's headless Service), with their snapshot-API port; resolved every 10 s.
    /// This controller's own address may be among them.
    #[arg(long, value_name = "NAME:PORT", value_parser = host_port)]
    pub peers_dns: Option<String>,
}

/// Checks a `host:port` flag value.
fn host_port(text: &str) -> Result<String, String> {
    match text.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(text.to_string())
        }
        _ => Err(format!(
            "{text:?} is not host:port (example: 10.0.0.7:9002)"
        )),
    }
}

/// Everything the controller runs with, validated.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The compiled scheduling profile.
    pub profile: Profile,
    /// The engines' metric names.
    pub engines: Engines,
    /// The config file to watch for changes, with the discovery it configured at start-up.
    pub config_file: Option<(PathBuf, Option<Source>)>,
    /// Where endpoints come from.
    pub source: Source,
    /// The endpoints the source listed at startup.
    pub endpoints: Vec<Endpoint>,
    /// Snapshot API address.
    pub listen: SocketAddr,
    /// Admin address.
    pub metrics_listen: SocketAddr,
    /// How endpoints are scraped.
    pub scrape: ScrapeSettings,
    /// Longest long-poll.
    pub long_poll_max: Duration,
    /// Config warnings to log at startup.
    pub warnings: Vec<String>,
    /// The `--manifests` objects loaded at startup, and their source to watch.
    pub manifests: Option<manifests::Startup>,
    /// The `--wasm-file` module to serve.
    pub wasm: Option<WasmModule>,
    /// The peer controllers prefix records are relayed to.
    pub peers: PeerSettings,
}

/// A startup error: a bad flag, config or endpoints file. Shown as one line,
/// `<file>: <message>` or just `<message>` for flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupError {
    /// The file the message is about, if any.
    pub file: Option<String>,
    /// What is wrong.
    pub message: String,
}

impl StartupError {
    fn flag(message: impl Into<String>) -> StartupError {
        StartupError {
            file: None,
            message: message.into(),
        }
    }

    fn in_file(file: impl Into<String>, message: impl fmt::Display) -> StartupError {
        StartupError {
            file: Some(file.into()),
            message: message.to_string(),
        }
    }

    /// A clap parse error (not `--help`/`--version`), reduced to its first line.
    pub fn from_clap(error: &clap::Error) -> StartupError {
        let rendered = error.to_string();
        let first = rendered.lines().next().unwrap_or("invalid arguments");
        StartupError::flag(first.trim_start_matches("error: "))
    }
}

impl fmt::Display for StartupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Always one line, whatever the underlying error contains.
        let message = self.message.replace('\n', " ");
        match &self.file {
            Some(file) => write!(f, "{file}: {message}"),
            None => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for StartupError {}

impl Settings {
    /// Checks the flags, compiles the config and loads the initial endpoint list.
    pub fn resolve(cli: Cli) -> Result<Settings, StartupError> {
        if cli.refresh_metrics_interval < Duration::from_millis(1) {
            return Err(StartupError::flag(
                "--refresh-metrics-interval: must be at least 1ms",
            ));
        }
        if cli.failed_scrapes_before_unready == 0 {
            return Err(StartupError::flag(
                "--failed-scrapes-before-unready: must be at least 1",
            ));
        }
        if cli.scrape_timeout.is_zero() {
            return Err(StartupError::flag("--scrape-timeout: must be more than 0"));
        }
        if !cli.metrics_path.starts_with('/') || cli.metrics_path.parse::<PathAndQuery>().is_err() {
            return Err(StartupError::flag(format!(
                "--metrics-path: {:?} is not an absolute URL path",
                cli.metrics_path
            )));
        }
        if cli
            .pool_name
            .as_deref()
            .is_some_and(|n| n.trim().is_empty())
        {
            return Err(StartupError::flag("--pool-name: must not be empty"));
        }
        if cli.pool_namespace.trim().is_empty() {
            return Err(StartupError::flag("--pool-namespace: must not be empty"));
        }
        let config = match &cli.config_file {
            Some(path) => config::load(path)
                .map_err(|e| StartupError::in_file(path.display().to_string(), e))?,
            None => PickerConfig::default(),
        };
        let config_file = cli
            .config_file
            .clone()
            .map(|path| (path, config.discovery.clone()));
        let source = match (cli.endpoints_file, config.discovery) {
            (Some(_), Some(_)) => {
                return Err(StartupError::in_file(
                    cli.config_file
                        .map(|p| p.display().to_string())
                        .unwrap_or_default(),
                    "dataLayer.discovery: cannot be combined with --endpoints-file; use one of them",
                ))
            }
            (Some(path), None) => Source::File(FileSource { path, watch: true }),
            (None, Some(source)) => source,
            (None, None) => match &cli.pool_name {
                Some(name) => Source::Kubernetes(KubeSource {
                    pool_name: name.clone(),
                    namespace: cli.pool_namespace.clone(),
                    kubeconfig: cli.kubeconfig.clone(),
                }),
                None => return Err(StartupError::flag(
                    "no endpoint discovery configured: pass --pool-name NAME (Kubernetes), --endpoints-file PATH, or a --config-file whose dataLayer.discovery names a file-discovery plugin",
                )),
            },
        };
        let kubernetes = matches!(source, Source::Kubernetes(_));
        if kubernetes && cli.manifests.is_some() {
            return Err(StartupError::flag(
                "--manifests: cannot be combined with Kubernetes discovery, which watches InferenceObjectives and InferenceModelRewrites in the cluster; apply them there, or use file discovery",
            ));
        }
        let endpoints = source
            .load()
            .map_err(|e| StartupError::in_file(source.origin(), e))?;
        let mut warnings = config.warnings;
        if !kubernetes && cli.kubeconfig.is_some() {
            warnings.push("--kubeconfig has no effect with file discovery".to_string());
        }
        let wasm = match &cli.wasm_file {
            Some(path) => Some(
                WasmModule::load(path)
                    .map_err(|e| StartupError::in_file(path.display().to_string(), e))?,
            ),
            None => None,
        };
        let manifests = match cli.manifests {
            Some(path) => {
                let source = ManifestSource {
                    path,
                    pool: PoolSelector {
                        name: cli.pool_name,
                        namespace: cli.pool_namespace,
                    },
                };
                let startup = source
                    .load()
                    .map_err(|e| StartupError::in_file(e.file, e.message))?;
                warnings.extend(startup.loaded.warnings.iter().cloned());
                Some(startup)
            }
            None => {
                if cli.pool_name.is_some() && !kubernetes {
                    warnings.push(
                        "--pool-name has no effect without --manifests (endpoints come from file discovery)"
                            .to_string(),
                    );
                }
                None
            }
        };
        let cap = cli.refresh_metrics_interval * TIMEOUT_INTERVALS;
        Ok(Settings {
            profile: config.profile,
            engines: config.engines,
            config_file,
            source,
            endpoints,
            listen: cli.listen,
            metrics_listen: cli.metrics_listen,
            scrape: ScrapeSettings {
                interval: cli.refresh_metrics_interval,
                timeout: cli.scrape_timeout.min(cap),
                path: cli.metrics_path,
                failures_before_unready: cli.failed_scrapes_before_unready,
            },
            long_poll_max: cli.long_poll_max,
            warnings,
            manifests,
            wasm,
            peers: PeerSettings {
                fixed: cli.peers,
                dns: cli.peers_dns,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Cli {
        Cli::try_parse_from(std::iter::once("wasm-epp-controller").chain(args.iter().copied()))
            .unwrap()
    }

    fn temp_file(name: &str, text: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("wasm-epp-cli-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn defaults_and_the_timeout_cap() {
        let endpoints = temp_file("defaults.yaml", "endpoints: []\n");
        let settings =
            Settings::resolve(cli(&["--endpoints-file", endpoints.to_str().unwrap()])).unwrap();
        assert_eq!(settings.listen.to_string(), "127.0.0.1:9002");
        assert_eq!(settings.metrics_listen.to_string(), "127.0.0.1:9090");
        assert_eq!(settings.scrape.interval, Duration::from_millis(50));
        assert_eq!(settings.scrape.timeout, Duration::from_secs(1));
        assert_eq!(settings.scrape.path, "/metrics");
        assert_eq!(settings.long_poll_max, Duration::from_secs(30));
        assert_eq!(settings.profile, Profile::default());
        assert_eq!(
            settings.source,
            Source::File(FileSource {
                path: endpoints.clone(),
                watch: true
            })
        );

        let settings = Settings::resolve(cli(&[
            "--endpoints-file",
            endpoints.to_str().unwrap(),
            "--refresh-metrics-interval",
            "10ms",
            "--scrape-timeout",
            "5s",
        ]))
        .unwrap();
        assert_eq!(settings.scrape.timeout, Duration::from_millis(200));
    }

    #[test]
    fn discovery_must_come_from_exactly_one_place() {
        let err = Settings::resolve(cli(&[])).unwrap_err();
        assert_eq!(err.file, None);
        assert!(err.message.contains("--endpoints-file"), "{err}");

        let endpoints = temp_file("both.yaml", "endpoints: []\n");
        let config = temp_file(
            "both-config.yaml",
            &format!(
                "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n- type: file-discovery\n  parameters: {{path: {}}}\ndataLayer:\n  discovery: {{pluginRef: file-discovery}}\n",
                endpoints.display()
            ),
        );
        let err = Settings::resolve(cli(&[
            "--config-file",
            config.to_str().unwrap(),
            "--endpoints-file",
            endpoints.to_str().unwrap(),
        ]))
        .unwrap_err();
        assert_eq!(err.file.as_deref(), config.to_str());
        assert!(err.message.starts_with("dataLayer.discovery:"), "{err}");

        let settings =
            Settings::resolve(cli(&["--config-file", config.to_str().unwrap()])).unwrap();
        assert_eq!(
            settings.source,
            Source::File(FileSource {
                path: endpoints,
                watch: false
            })
        );
    }

    #[test]
    fn file_errors_name_the_file() {
        let endpoints = temp_file(
            "bad-endpoints.yaml",
            "endpoints:\n- {name: a, address: x, port: 1}\n",
        );
        let err =
            Settings::resolve(cli(&["--endpoints-file", endpoints.to_str().unwrap()])).unwrap_err();
        assert_eq!(err.file.as_deref(), endpoints.to_str());
        assert!(err.message.starts_with("endpoints[0].address:"), "{err}");
        assert_eq!(
            err.to_string(),
            format!("{}: {}", endpoints.display(), err.message)
        );
    }

    #[test]
    fn peer_flags() {
        let endpoints = temp_file("peer-endpoints.yaml", "endpoints: []\n");
        let endpoints = endpoints.to_str().unwrap();
        let settings = Settings::resolve(cli(&["--endpoints-file", endpoints])).unwrap();
        assert!(!settings.peers.any());
        let settings = Settings::resolve(cli(&[
            "--endpoints-file",
            endpoints,
            "--peer",
            "10.0.0.7:9002",
            "--peer",
            "ctl-b:9002",
            "--peers-dns",
            "wasm-epp-controller-peers.ns.svc:9002",
        ]))
        .unwrap();
        assert_eq!(settings.peers.fixed, ["10.0.0.7:9002", "ctl-b:9002"]);
        assert_eq!(
            settings.peers.dns.as_deref(),
            Some("wasm-epp-controller-peers.ns.svc:9002")
        );
        for bad in ["10.0.0.7", ":9002", "host:0", "host:http"] {
            let error = Cli::try_parse_from(["wasm-epp-controller", "--peer", bad])
                .unwrap_err()
                .to_string();
            assert!(error.contains("is not host:port"), "{bad}: {error}");
        }
    }

    #[test]
    fn manifests_and_pool_flags() {
        let endpoints = temp_file("manifests-endpoints.yaml", "endpoints: []\n");
        let endpoints = endpoints.to_str().unwrap();
        let settings = Settings::resolve(cli(&["--endpoints-file", endpoints])).unwrap();
        assert_eq!(settings.manifests, None);

        let manifests = temp_file(
            "manifests.yaml",
            "apiVersion: inference.networking.x-k8s.io/v1alpha2\nkind: InferenceObjective\nmetadata: {name: batch}\nspec: {priority: -1, poolRef: {name: p}}\n---\napiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: other}\nspec: {poolRef: {name: q}}\n",
        );
        let path = manifests.to_str().unwrap();
        let settings =
            Settings::resolve(cli(&["--endpoints-file", endpoints, "--manifests", path])).unwrap();
        let startup = settings.manifests.unwrap();
        assert_eq!(startup.source.pool, PoolSelector::default());
        assert_eq!(startup.loaded.manifests.objectives.len(), 2);
        assert_eq!(startup.files.len(), 1);
        assert!(
            settings.warnings.iter().any(|w| w.contains("deprecated")),
            "{:?}",
            settings.warnings
        );

        let settings = Settings::resolve(cli(&[
            "--endpoints-file",
            endpoints,
            "--manifests",
            path,
            "--pool-name",
            "p",
        ]))
        .unwrap();
        let startup = settings.manifests.unwrap();
        assert_eq!(startup.source.pool.name.as_deref(), Some("p"));
        assert_eq!(startup.source.pool.namespace, "default");
        let names: Vec<_> = startup.loaded.manifests.objectives.keys().collect();
        assert_eq!(names, ["batch"]);
        assert_eq!(startup.loaded.ignored, 1);

        // Objects without a namespace are taken to be in the pool's namespace.
        let settings = Settings::resolve(cli(&[
            "--endpoints-file",
            endpoints,
            "--manifests",
            path,
            "--pool-name",
            "p",
            "--pool-namespace",
            "llm",
        ]))
        .unwrap();
        let startup = settings.manifests.unwrap();
        assert_eq!(startup.source.pool.namespace, "llm");
        let names: Vec<_> = startup.loaded.manifests.objectives.keys().collect();
        assert_eq!(names, ["batch"]);

        // --pool-name without --manifests only warns.
        let settings =
            Settings::resolve(cli(&["--endpoints-file", endpoints, "--pool-name", "p"])).unwrap();
        assert!(settings.warnings.iter().any(|w| w.contains("--pool-name")));

        let bad = temp_file(
            "bad-manifests.yaml",
            "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: high, poolRef: {name: p}}\n",
        );
        let err = Settings::resolve(cli(&[
            "--endpoints-file",
            endpoints,
            "--manifests",
            bad.to_str().unwrap(),
        ]))
        .unwrap_err();
        assert_eq!(err.file.as_deref(), bad.to_str());
        assert!(
            err.message
                .starts_with("document 1 (InferenceObjective \"x\"): spec.priority: invalid type"),
            "{err}"
        );
        for args in [
            vec!["--endpoints-file", endpoints, "--pool-name", ""],
            vec!["--endpoints-file", endpoints, "--pool-namespace", " "],
        ] {
            let err = Settings::resolve(cli(&args)).unwrap_err();
            assert_eq!(err.file, None, "{args:?}");
            assert!(err.message.starts_with("--pool-"), "{args:?}: {err}");
        }
    }

    #[test]
    fn bad_flags_are_rejected() {
        let endpoints = temp_file("flags.yaml", "endpoints: []\n");
        let path = endpoints.to_str().unwrap();
        for args in [
            vec!["--endpoints-file", path, "--metrics-path", "metrics"],
            vec!["--endpoints-file", path, "--refresh-metrics-interval", "0s"],
            vec!["--endpoints-file", path, "--scrape-timeout", "0ms"],
        ] {
            let err = Settings::resolve(cli(&args)).unwrap_err();
            assert_eq!(err.file, None, "{args:?}");
            assert!(err.message.starts_with("--"), "{args:?}: {err}");
        }
        let err = Cli::try_parse_from(["wasm-epp-controller", "--listen", "nowhere"]).unwrap_err();
        let line = StartupError::from_clap(&err).to_string();
        assert!(line.contains("--listen") && !line.contains('\n'), "{line}");
    }
}
