//! The state shared by every request handler.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use hyper::header::HeaderValue;

use crate::cli::Cli;
use crate::engine::Engine;
use crate::errors::ApiError;
use crate::metrics::{MetricNames, MetricsOverride};

/// One simulated server.
#[derive(Debug)]
pub struct App {
    /// Name of the base model.
    pub model: String,
    /// Names of the LoRA adapters served next to the base model.
    pub adapters: Vec<String>,
    /// The instance name.
    pub instance_name: String,
    /// The instance name as the `x-sim-instance` header value.
    pub instance_header: HeaderValue,
    /// Output tokens of a request that gives no `max_tokens`.
    pub default_max_tokens: u64,
    /// The scheduler.
    pub engine: Arc<Engine>,
    /// Whose metric names `/metrics` uses.
    pub metric_names: MetricNames,
    metrics_override: Mutex<MetricsOverride>,
}

impl App {
    /// The server described by `cli`, listening on `addr`.
    pub fn new(cli: &Cli, addr: SocketAddr) -> Result<Arc<Self>, String> {
        let name = cli
            .instance_name
            .clone()
            .unwrap_or_else(|| format!("sim-{}", addr.port()));
        let instance_header = HeaderValue::from_str(&name)
            .ok()
            .filter(|h| h.to_str().is_ok())
            .ok_or_else(|| format!("instance name `{name}` is not a valid header value"))?;
        Ok(Arc::new(Self {
            model: cli.model.clone(),
            metric_names: cli.engine,
            adapters: cli
                .lora_modules
                .iter()
                .filter(|a| !a.is_empty())
                .cloned()
                .collect(),
            instance_name: name,
            instance_header,
            default_max_tokens: cli.default_max_tokens,
            engine: Engine::new(cli.engine_config()),
            metrics_override: Mutex::new(MetricsOverride::default()),
        }))
    }

    /// The LoRA adapter a request for `model` runs on (`None`: the base
    /// model), or a 404 when this server does not serve `model`.
    pub fn resolve_model(&self, model: &str) -> Result<Option<String>, ApiError> {
        if model == self.model {
            Ok(None)
        } else if self.adapters.iter().any(|a| a == model) {
            Ok(Some(model.to_owned()))
        } else {
            Err(ApiError::not_found(format!(
                "The model `{model}` does not exist."
            )))
        }
    }

    /// The pinned metric values (`PUT /sim/metrics-override`).
    pub fn metrics_override(&self) -> MutexGuard<'_, MetricsOverride> {
        self.metrics_override
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use hyper::StatusCode;

    use super::*;

    fn app(args: &[&str]) -> Arc<App> {
        let cli = Cli::parse_from(std::iter::once("vllm-sim").chain(args.iter().copied()));
        App::new(&cli, "127.0.0.1:8123".parse().unwrap()).unwrap()
    }

    #[test]
    fn instance_name_defaults_to_the_port() {
        assert_eq!(app(&[]).instance_name, "sim-8123");
        assert_eq!(app(&["--instance-name", "pod-a"]).instance_header, "pod-a");
        let bad = Cli::parse_from(["vllm-sim", "--instance-name", "a\nb"]);
        assert!(App::new(&bad, "127.0.0.1:1".parse().unwrap()).is_err());
    }

    #[test]
    fn resolves_the_base_model_and_adapters_only() {
        let app = app(&["--model", "base", "--lora-modules", "a,b"]);
        assert_eq!(app.resolve_model("base").unwrap(), None);
        assert_eq!(app.resolve_model("b").unwrap().as_deref(), Some("b"));
        assert_eq!(
            app.resolve_model("c").unwrap_err().into_response().status(),
            StatusCode::NOT_FOUND
        );
    }
}
