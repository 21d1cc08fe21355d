//! The core metrics extractor: maps a model server's Prometheus samples onto snapshot
//! [`Metrics`]. Only the vLLM metric names are known so far (the upstream default engine).

use wasm_epp::snapshot::Metrics;

use crate::prometheus::Sample;

const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// The name vLLM used for KV-cache usage before `kv_cache_usage_perc`.
const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";
const LORA_INFO: &str = "vllm:lora_requests_info";
const CACHE_CONFIG: &str = "vllm:cache_config_info";

/// Extracts vLLM metrics. Several series of one gauge (e.g. one per `model_name`) are summed
/// for the queue and running counts, and the largest is taken for KV-cache usage. An exposition
/// with none of the queue, running or KV-usage gauges is an error; LoRA and cache-config
/// information are optional. `updated_unix_ms` is left for the caller to set.
pub fn vllm_metrics(samples: &[Sample<'_>]) -> Result<Metrics, String> {
    let waiting = sum(samples, WAITING);
    let running = sum(samples, RUNNING);
    let kv = max(samples, KV_USAGE).or_else(|| max(samples, KV_USAGE_OLD));
    if waiting.is_none() && running.is_none() && kv.is_none() {
        return Err(format!(
            "no vLLM metrics in the response (looked for {WAITING}, {RUNNING}, {KV_USAGE})"
        ));
    }
    let mut metrics = Metrics {
        waiting_queue_size: count(waiting),
        running_requests_size: count(running),
        kv_cache_usage: fraction(kv),
        ..Metrics::default()
    };
    if let Some(lora) = newest_lora_info(samples) {
        metrics.active_models = adapters(lora.label("running_lora_adapters"));
        metrics.waiting_models = adapters(lora.label("waiting_lora_adapters"));
        metrics.max_active_models = lora.label("max_lora").and_then(number).unwrap_or(0);
    }
    if let Some(cache) = samples.iter().find(|s| s.name == CACHE_CONFIG) {
        metrics.block_size = cache.label("block_size").and_then(number);
        metrics.num_gpu_blocks = cache.label("num_gpu_blocks").and_then(number);
    }
    Ok(metrics)
}

fn series<'s, 'a>(samples: &'s [Sample<'a>], name: &'s str) -> impl Iterator<Item = f64> + 's {
    samples
        .iter()
        .filter(move |s| s.name == name)
        .map(|s| s.value)
        .filter(|v| !v.is_nan())
}

/// Sum of every series of `name`; `None` when the family is absent.
fn sum(samples: &[Sample<'_>], name: &str) -> Option<f64> {
    series(samples, name).fold(None, |total, v| Some(total.unwrap_or(0.0) + v))
}

/// Largest series of `name`; `None` when the family is absent.
fn max(samples: &[Sample<'_>], name: &str) -> Option<f64> {
    series(samples, name).fold(None, |best, v| Some(best.map_or(v, |b: f64| b.max(v))))
}

/// A gauge value as a request count: rounded, negative or non-finite values → 0.
fn count(value: Option<f64>) -> u64 {
    match value {
        // `as` saturates at u64::MAX for huge values.
        Some(v) if v.is_finite() && v > 0.0 => v.round() as u64,
        _ => 0,
    }
}

/// A KV-cache usage fraction clamped to 0..1 (non-finite → 0, so snapshots stay valid JSON).
fn fraction(value: Option<f64>) -> f64 {
    match value {
        Some(v) if v.is_finite() => v.clamp(0.0, 1.0),
        _ => 0.0,
    }
}

/// The `vllm:lora_requests_info` series with the largest value (the value is a timestamp).
fn newest_lora_info<'s, 'a>(samples: &'s [Sample<'a>]) -> Option<&'s Sample<'a>> {
    samples
        .iter()
        .filter(|s| s.name == LORA_INFO && !s.value.is_nan())
        .max_by(|a, b| a.value.total_cmp(&b.value))
}

/// Splits a comma-separated adapter list, dropping blanks.
fn adapters(list: Option<&str>) -> Vec<String> {
    list.unwrap_or("")
        .split(',')
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

/// Parses an integer label such as `max_lora="4"` (vLLM writes `None` before it knows).
fn number<T: std::str::FromStr>(text: &str) -> Option<T> {
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prometheus::parse;

    fn extract(text: &str) -> Result<Metrics, String> {
        vllm_metrics(&parse(text).map_err(|e| e.to_string())?)
    }

    #[test]
    fn reads_the_core_gauges_and_sums_series() {
        let m = extract(
            "vllm:num_requests_waiting{model_name=\"a\"} 3\n\
             vllm:num_requests_waiting{model_name=\"b\"} 4\n\
             vllm:num_requests_running{model_name=\"a\"} 2\n\
             vllm:num_requests_running{model_name=\"b\"} 5\n\
             vllm:kv_cache_usage_perc{model_name=\"a\"} 0.25\n\
             vllm:kv_cache_usage_perc{model_name=\"b\"} 0.75\n\
             vllm:gpu_cache_usage_perc{model_name=\"a\"} 0.99\n",
        )
        .unwrap();
        assert_eq!(m.waiting_queue_size, 7);
        assert_eq!(m.running_requests_size, 7);
        assert_eq!(m.kv_cache_usage, 0.75);
        assert!(m.active_models.is_empty());
        assert_eq!(m.max_active_models, 0);
        assert_eq!(m.block_size, None);
        assert_eq!(m.updated_unix_ms, None);
    }

    #[test]
    fn falls_back_to_gpu_cache_usage() {
        let m = extract("vllm:gpu_cache_usage_perc 0.4\nvllm:num_requests_waiting 1\n").unwrap();
        assert_eq!(m.kv_cache_usage, 0.4);
        assert_eq!(m.waiting_queue_size, 1);
        assert_eq!(m.running_requests_size, 0);
    }

    #[test]
    fn picks_the_lora_series_with_the_largest_value() {
        let m = extract(
            "vllm:num_requests_waiting 0\n\
             vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"old\",waiting_lora_adapters=\"\"} 1.7e9\n\
             vllm:lora_requests_info{max_lora=\"4\",running_lora_adapters=\"a, b\",waiting_lora_adapters=\"c\"} 1.8e9\n\
             vllm:lora_requests_info{max_lora=\"8\",running_lora_adapters=\"older\",waiting_lora_adapters=\"\"} 1.6e9\n",
        )
        .unwrap();
        assert_eq!(m.active_models, ["a", "b"]);
        assert_eq!(m.waiting_models, ["c"]);
        assert_eq!(m.max_active_models, 4);
    }

    #[test]
    fn reads_cache_config_labels() {
        let m = extract(
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"27000\",gpu_memory_utilization=\"0.9\"} 1\n\
             vllm:num_requests_running 1\n",
        )
        .unwrap();
        assert_eq!(m.block_size, Some(16));
        assert_eq!(m.num_gpu_blocks, Some(27_000));

        let m = extract(
            "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"None\"} 1\n\
             vllm:num_requests_running 1\n",
        )
        .unwrap();
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(16), None));
    }

    #[test]
    fn sanitises_odd_values() {
        let m = extract(
            "vllm:num_requests_waiting -3\n\
             vllm:num_requests_running 2.6\n\
             vllm:kv_cache_usage_perc +Inf\n",
        )
        .unwrap();
        assert_eq!(m.waiting_queue_size, 0);
        assert_eq!(m.running_requests_size, 3);
        assert_eq!(m.kv_cache_usage, 0.0);

        let m = extract("vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.5\n").unwrap();
        assert_eq!(m.kv_cache_usage, 0.5, "a NaN series counts as absent");
    }

    #[test]
    fn an_exposition_without_vllm_metrics_is_an_error() {
        let err = extract("process_cpu_seconds_total 12\n").unwrap_err();
        assert!(err.contains(WAITING), "{err}");
    }
}
