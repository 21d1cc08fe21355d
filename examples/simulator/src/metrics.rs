//! `GET /metrics`: the engine state in Prometheus text format, under vLLM's
//! metric names (or SGLang's, with `--engine sglang`), and the test override that pins some of
//! the values.

use std::fmt::{Display, Write};

use serde::{Deserialize, Serialize};

use crate::engine::{EngineConfig, Histogram, Snapshot, ITL_BUCKETS_S};
use crate::errors::ApiError;

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Values `/metrics` reports instead of the real ones, set with
/// `PUT /sim/metrics-override`; absent fields are reported as they are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsOverride {
    /// Pinned `vllm:num_requests_waiting`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub waiting: Option<u64>,
    /// Pinned `vllm:num_requests_running`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub running: Option<u64>,
    /// Pinned `vllm:kv_cache_usage_perc`, a fraction 0..1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_usage: Option<f64>,
}

impl MetricsOverride {
    /// The override if its values are in range.
    pub fn validated(self) -> Result<Self, ApiError> {
        match self.kv_cache_usage {
            Some(kv) if !(0.0..=1.0).contains(&kv) => Err(ApiError::bad_request(format!(
                "kv_cache_usage must be a fraction between 0 and 1, got {kv}"
            ))),
            _ => Ok(self),
        }
    }
}

/// Whose metric names the exposition uses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricNames {
    /// vLLM's (`vllm:num_requests_waiting`, …).
    #[default]
    Vllm,
    /// SGLang's (`sglang:num_queue_reqs`, …); SGLang reports no LoRA state.
    Sglang,
}

/// The names of the families one engine reports.
struct Names {
    running: &'static str,
    waiting: &'static str,
    kv_usage: &'static str,
    lora_info: Option<&'static str>,
    cache_config: &'static str,
    /// The `cache_config` labels for the block size and the number of blocks.
    block_labels: (&'static str, &'static str),
    prefix_queries: Option<&'static str>,
    prefix_hits: Option<&'static str>,
    request_success: &'static str,
    prompt_tokens: &'static str,
    generation_tokens: &'static str,
    /// The inter-token-latency histogram.
    inter_token_latency: &'static str,
    /// The histogram of output tokens per finished request, where the engine has one.
    request_generation_tokens: Option<&'static str>,
}

impl MetricNames {
    fn names(self) -> Names {
        match self {
            MetricNames::Vllm => Names {
                running: "vllm:num_requests_running",
                waiting: "vllm:num_requests_waiting",
                kv_usage: "vllm:kv_cache_usage_perc",
                lora_info: Some("vllm:lora_requests_info"),
                cache_config: "vllm:cache_config_info",
                block_labels: ("block_size", "num_gpu_blocks"),
                prefix_queries: Some("vllm:prefix_cache_queries_total"),
                prefix_hits: Some("vllm:prefix_cache_hits_total"),
                request_success: "vllm:request_success_total",
                prompt_tokens: "vllm:prompt_tokens_total",
                generation_tokens: "vllm:generation_tokens_total",
                inter_token_latency: "vllm:inter_token_latency_seconds",
                request_generation_tokens: Some("vllm:request_generation_tokens"),
            },
            MetricNames::Sglang => Names {
                running: "sglang:num_running_reqs",
                waiting: "sglang:num_queue_reqs",
                kv_usage: "sglang:token_usage",
                lora_info: None,
                cache_config: "sglang:cache_config_info",
                block_labels: ("page_size", "num_pages"),
                prefix_queries: None,
                prefix_hits: None,
                request_success: "sglang:num_requests_total",
                prompt_tokens: "sglang:prompt_tokens_total",
                generation_tokens: "sglang:generation_tokens_total",
                inter_token_latency: "sglang:inter_token_latency_seconds",
                request_generation_tokens: None,
            },
        }
    }
}

/// What one exposition reports.
#[derive(Debug)]
pub struct Exposition<'a> {
    /// Whose metric names to use.
    pub names: MetricNames,
    /// The base model, the `model_name` label.
    pub model: &'a str,
    /// Block size, GPU blocks and LoRA slots.
    pub config: &'a EngineConfig,
    /// Whether LoRA adapters are configured (`vllm:lora_requests_info` is
    /// only reported then).
    pub lora_enabled: bool,
    /// The engine state.
    pub snapshot: &'a Snapshot,
    /// The pinned values.
    pub pinned: &'a MetricsOverride,
    /// Current Unix time in seconds, the value of `vllm:lora_requests_info`.
    pub now: f64,
}

impl Exposition<'_> {
    /// The Prometheus text.
    pub fn render(&self) -> String {
        let model = format!("model_name=\"{}\"", escape(self.model));
        let names = self.names.names();
        let snapshot = self.snapshot;
        let totals = &snapshot.totals;
        let mut out = String::new();
        let mut gauge = |name: &str, help: &str, labels: &str, value: &dyn Display| {
            family(&mut out, name, "gauge", help, labels, value);
        };
        gauge(
            names.running,
            "Number of requests in model execution batches.",
            &model,
            &self.pinned.running.unwrap_or(snapshot.running as u64),
        );
        gauge(
            names.waiting,
            "Number of requests waiting to be processed.",
            &model,
            &self.pinned.waiting.unwrap_or(snapshot.waiting as u64),
        );
        gauge(
            names.kv_usage,
            "KV-cache usage. 1 means 100 percent usage.",
            &model,
            &self
                .pinned
                .kv_cache_usage
                .unwrap_or(snapshot.kv_cache_usage),
        );
        if let (true, Some(lora_info)) = (self.lora_enabled, names.lora_info) {
            let labels = format!(
                "max_lora=\"{}\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\",{model}",
                self.config.max_loras,
                escape(&snapshot.running_adapters.join(",")),
                escape(&snapshot.waiting_adapters.join(",")),
            );
            gauge(
                lora_info,
                "Running stats on lora requests.",
                &labels,
                &self.now,
            );
        }
        let (block_label, blocks_label) = names.block_labels;
        let labels = format!(
            "{block_label}=\"{}\",{blocks_label}=\"{}\",{model}",
            self.config.block_size, self.config.num_gpu_blocks
        );
        gauge(
            names.cache_config,
            "Information of the LLMEngine CacheConfig.",
            &labels,
            &1,
        );
        let mut counter = |name: Option<&str>, help: &str, value: u64| {
            if let Some(name) = name {
                family(&mut out, name, "counter", help, &model, &value);
            }
        };
        counter(
            names.prefix_queries,
            "Prefix cache queries, in terms of number of queried tokens.",
            totals.prompt_tokens_total,
        );
        counter(
            names.prefix_hits,
            "Prefix cache hits, in terms of number of cached tokens.",
            totals.cached_prompt_tokens_total,
        );
        counter(
            Some(names.request_success),
            "Count of successfully processed requests.",
            totals.request_success_total,
        );
        counter(
            Some(names.prompt_tokens),
            "Number of prefill tokens processed.",
            totals.prompt_tokens_total,
        );
        counter(
            Some(names.generation_tokens),
            "Number of generation tokens processed.",
            totals.completion_tokens_total,
        );
        histogram(
            &mut out,
            names.inter_token_latency,
            "Histogram of inter-token latency in seconds.",
            &model,
            &totals.inter_token_latency,
        );
        if let Some(name) = names.request_generation_tokens {
            // Only the `+Inf` bucket: what a picker reads is the mean, `_sum` over `_count`.
            let count = totals.request_success_total;
            let _ = writeln!(
                out,
                "# HELP {name} Number of generation tokens per finished request.\n\
                 # TYPE {name} histogram\n\
                 {name}_bucket{{{model},le=\"+Inf\"}} {count}\n\
                 {name}_sum{{{model}}} {}\n\
                 {name}_count{{{model}}} {count}",
                totals.request_generation_tokens_sum
            );
        }
        out
    }
}

/// Appends one histogram family: its cumulative buckets, sum and count.
fn histogram(out: &mut String, name: &str, help: &str, labels: &str, values: &Histogram) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
    for (bound, count) in ITL_BUCKETS_S.iter().zip(values.buckets) {
        let le = if bound.is_finite() {
            bound.to_string()
        } else {
            "+Inf".to_string()
        };
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {count}");
    }
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", values.sum);
    let _ = writeln!(out, "{name}_count{{{labels}}} {}", values.count);
}

/// Appends one single-sample metric family.
fn family(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, value: &dyn Display) {
    // Writing to a String cannot fail.
    let _ = write!(
        out,
        "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n"
    );
}

/// Escapes a Prometheus label value.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Totals;
    use crate::latency::LatencyModel;

    fn config() -> EngineConfig {
        EngineConfig {
            max_num_seqs: 8,
            max_loras: 2,
            block_size: 16,
            num_gpu_blocks: 2048,
            latency: LatencyModel {
                ttft_base_ms: 5.0,
                prefill_ms_per_token: 0.02,
                itl_ms: 4.0,
                batch_slowdown: 0.05,
                lora_load_ms: 20.0,
                time_scale: 1.0,
            },
            prefill_stalls_decode: false,
        }
    }

    fn snapshot() -> Snapshot {
        Snapshot {
            waiting: 3,
            running: 2,
            kv_cache_usage: 0.25,
            running_adapters: vec!["a".into(), "b".into()],
            waiting_adapters: vec!["c".into()],
            totals: Totals {
                requests_total: 9,
                prompt_tokens_total: 100,
                cached_prompt_tokens_total: 32,
                completion_tokens_total: 40,
                request_success_total: 4,
                request_generation_tokens_sum: 30,
                lora_loads_total: 1,
                inter_token_latency: Histogram {
                    buckets: [0, 0, 1, 2, 2, 2, 2, 2, 2, 2],
                    sum: 0.08,
                    count: 2,
                },
            },
        }
    }

    fn render(lora_enabled: bool, pinned: MetricsOverride) -> String {
        Exposition {
            names: MetricNames::Vllm,
            model: "m",
            config: &config(),
            lora_enabled,
            snapshot: &snapshot(),
            pinned: &pinned,
            now: 1700000000.5,
        }
        .render()
    }

    #[test]
    fn reports_vllm_names_and_labels() {
        let text = render(true, MetricsOverride::default());
        for line in [
            "# TYPE vllm:num_requests_waiting gauge",
            "vllm:num_requests_waiting{model_name=\"m\"} 3",
            "vllm:num_requests_running{model_name=\"m\"} 2",
            "vllm:kv_cache_usage_perc{model_name=\"m\"} 0.25",
            "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"a,b\",waiting_lora_adapters=\"c\",model_name=\"m\"} 1700000000.5",
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\",model_name=\"m\"} 1",
            "# TYPE vllm:prefix_cache_queries_total counter",
            "vllm:prefix_cache_queries_total{model_name=\"m\"} 100",
            "vllm:prefix_cache_hits_total{model_name=\"m\"} 32",
            "vllm:request_success_total{model_name=\"m\"} 4",
            "vllm:prompt_tokens_total{model_name=\"m\"} 100",
            "vllm:generation_tokens_total{model_name=\"m\"} 40",
            "# TYPE vllm:inter_token_latency_seconds histogram",
            "vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.025\"} 0",
            "vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"0.05\"} 1",
            "vllm:inter_token_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 2",
            "vllm:inter_token_latency_seconds_sum{model_name=\"m\"} 0.08",
            "vllm:inter_token_latency_seconds_count{model_name=\"m\"} 2",
            "# TYPE vllm:request_generation_tokens histogram",
            "vllm:request_generation_tokens_bucket{model_name=\"m\",le=\"+Inf\"} 4",
            "vllm:request_generation_tokens_sum{model_name=\"m\"} 30",
            "vllm:request_generation_tokens_count{model_name=\"m\"} 4",
        ] {
            assert!(text.lines().any(|l| l == line), "missing `{line}` in:\n{text}");
        }
        assert_eq!(
            text.matches("# HELP ").count(),
            text.matches("# TYPE ").count()
        );
    }

    #[test]
    fn lora_info_only_with_adapters() {
        assert!(!render(false, MetricsOverride::default()).contains("vllm:lora_requests_info"));
    }

    #[test]
    fn the_override_replaces_the_pinned_values_only() {
        let pinned = MetricsOverride {
            waiting: Some(50),
            running: None,
            kv_cache_usage: Some(0.9),
        };
        let text = render(false, pinned);
        assert!(text.contains("vllm:num_requests_waiting{model_name=\"m\"} 50\n"));
        assert!(text.contains("vllm:num_requests_running{model_name=\"m\"} 2\n"));
        assert!(text.contains("vllm:kv_cache_usage_perc{model_name=\"m\"} 0.9\n"));
    }

    #[test]
    fn override_values_are_checked() {
        let bad: MetricsOverride = serde_json::from_str(r#"{"kv_cache_usage": 1.5}"#).unwrap();
        assert!(bad.validated().is_err());
        assert!(serde_json::from_str::<MetricsOverride>(r#"{"queue": 1}"#).is_err());
    }

    #[test]
    fn sglang_names() {
        let text = Exposition {
            names: MetricNames::Sglang,
            model: "m",
            config: &config(),
            lora_enabled: true,
            snapshot: &snapshot(),
            pinned: &MetricsOverride::default(),
            now: 1700000000.5,
        }
        .render();
        for line in [
            "sglang:num_queue_reqs{model_name=\"m\"} 3",
            "sglang:num_running_reqs{model_name=\"m\"} 2",
            "sglang:token_usage{model_name=\"m\"} 0.25",
            "sglang:cache_config_info{page_size=\"16\",num_pages=\"2048\",model_name=\"m\"} 1",
            "sglang:prompt_tokens_total{model_name=\"m\"} 100",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
        assert!(!text.contains("vllm:"), "{text}");
        assert!(!text.contains("generation_tokens_bucket"), "{text}");
        assert!(
            !text.contains("lora"),
            "SGLang reports no LoRA state: {text}"
        );
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(escape("a\"b\\c"), "a\\\"b\\\\c");
    }
}
