//! The core metrics extractor: maps a model server's Prometheus samples onto snapshot
//! [`Metrics`], reading the metric names of the endpoint's [`Engine`].

use wasm_epp::snapshot::Metrics;

use crate::engines::{Engine, Field, Selector};
use crate::moving_mean::HistogramTotals;
use crate::prometheus::Sample;

/// What one successful scrape yields: the snapshot's metrics, and the cumulative histogram
/// totals the store turns into [`Metrics::decode_ms_per_token`] and
/// [`Metrics::output_tokens_per_request`].
#[derive(Debug, Clone, PartialEq)]
pub struct Scraped {
    /// The metrics as extracted (the measured means are the store's to set).
    pub metrics: Metrics,
    /// The inter-token-latency histogram's totals, when the server reports one.
    pub decode: Option<HistogramTotals>,
    /// The generation-tokens-per-request histogram's totals, when the server reports one.
    pub output_tokens: Option<HistogramTotals>,
}

impl From<Metrics> for Scraped {
    fn from(metrics: Metrics) -> Scraped {
        Scraped {
            metrics,
            decode: None,
            output_tokens: None,
        }
    }
}

/// Extracts `engine`'s metrics. Several series of the queue or running gauge (e.g. one per
/// `model_name`) are summed, and the largest KV-cache usage is taken. An exposition with none
/// of the queue, running or KV-usage gauges is an error; LoRA and cache geometry are optional.
/// `updated_unix_ms` is left for the caller to set.
pub fn metrics(engine: &Engine, samples: &[Sample<'_>]) -> Result<Metrics, String> {
    let waiting = first_present(samples, &engine.waiting, sum);
    let running = first_present(samples, &engine.running, sum);
    let kv = first_present(samples, &engine.kv_usage, max);
    if waiting.is_none() && running.is_none() && kv.is_none() {
        let looked_for: Vec<String> = engine
            .waiting
            .iter()
            .chain(&engine.running)
            .chain(&engine.kv_usage)
            .map(|s| s.name.clone())
            .collect();
        return Err(format!(
            "no {} metrics in the response (looked for {})",
            engine.name,
            looked_for.join(", ")
        ));
    }
    let mut metrics = Metrics {
        waiting_queue_size: count(waiting),
        running_requests_size: count(running),
        kv_cache_usage: fraction(kv),
        ..Metrics::default()
    };
    if let Some(lora) = &engine.lora {
        if let Some(info) = newest(samples, &lora.selector) {
            metrics.active_models = adapters(info.label(&lora.running_label));
            metrics.waiting_models = adapters(info.label(&lora.waiting_label));
            metrics.max_active_models = info.label(&lora.max_label).and_then(number).unwrap_or(0);
        }
    }
    metrics.block_size = engine.block_size.as_ref().and_then(|f| field(samples, f));
    metrics.num_gpu_blocks = engine.num_blocks.as_ref().and_then(|f| field(samples, f));
    Ok(metrics)
}

/// The cumulative `_sum` and `_count` of the first of `histograms` present (several series are
/// summed), or `None` when the server reports none: an [`Engine`]'s `inter_token_latency` or
/// `request_output_tokens`.
pub fn histogram_totals(
    histograms: &[Selector],
    samples: &[Sample<'_>],
) -> Option<HistogramTotals> {
    histograms.iter().find_map(|histogram| {
        Some(HistogramTotals {
            sum: sum(samples, &histogram.suffixed("_sum"))?,
            count: sum(samples, &histogram.suffixed("_count"))?,
        })
    })
}

fn series<'s, 'a>(
    samples: &'s [Sample<'a>],
    selector: &'s Selector,
) -> impl Iterator<Item = f64> + 's {
    samples
        .iter()
        .filter(move |s| selector.matches(s))
        .map(|s| s.value)
        .filter(|v| !v.is_nan())
}

/// `aggregate` over the first selector of `selectors` with any series present.
fn first_present(
    samples: &[Sample<'_>],
    selectors: &[Selector],
    aggregate: fn(&[Sample<'_>], &Selector) -> Option<f64>,
) -> Option<f64> {
    selectors.iter().find_map(|s| aggregate(samples, s))
}

/// Sum of every selected series; `None` when there is none.
fn sum(samples: &[Sample<'_>], selector: &Selector) -> Option<f64> {
    series(samples, selector).fold(None, |total, v| Some(total.unwrap_or(0.0) + v))
}

/// Largest selected series; `None` when there is none.
fn max(samples: &[Sample<'_>], selector: &Selector) -> Option<f64> {
    series(samples, selector).fold(None, |best, v| Some(best.map_or(v, |b: f64| b.max(v))))
}

/// An integer field: a series' value (rounded) or a label of the first matching series.
fn field<T: std::str::FromStr + TryFrom<u64>>(samples: &[Sample<'_>], field: &Field) -> Option<T> {
    match field {
        Field::Value(selector) => max(samples, selector)
            .filter(|v| v.is_finite() && *v >= 0.0)
            .and_then(|v| T::try_from(v.round() as u64).ok()),
        Field::Label(selector, label) => samples
            .iter()
            .find(|s| selector.matches(s))
            .and_then(|s| s.label(label))
            .and_then(number),
    }
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

/// The selected series with the largest value (the LoRA info's value is a timestamp).
fn newest<'s, 'a>(samples: &'s [Sample<'a>], selector: &Selector) -> Option<&'s Sample<'a>> {
    samples
        .iter()
        .filter(|s| selector.matches(s) && !s.value.is_nan())
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
    use crate::engines::Engines;
    use crate::prometheus::parse;

    fn extract_as(engine: &str, text: &str) -> Result<Metrics, String> {
        let engines = Engines::default();
        metrics(
            engines.get(engine).unwrap(),
            &parse(text).map_err(|e| e.to_string())?,
        )
    }

    fn extract(text: &str) -> Result<Metrics, String> {
        extract_as("vllm", text)
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
    fn histogram_totals_read_the_first_histogram_present() {
        let engines = Engines::default();
        let vllm = engines.get("vllm").unwrap();
        let totals =
            |text: &str| histogram_totals(&vllm.inter_token_latency, &parse(text).unwrap());
        let current = "vllm:inter_token_latency_seconds_sum{model_name=\"a\"} 1.5\n\
                       vllm:inter_token_latency_seconds_count{model_name=\"a\"} 50\n\
                       vllm:inter_token_latency_seconds_sum{model_name=\"b\"} 0.5\n\
                       vllm:inter_token_latency_seconds_count{model_name=\"b\"} 10\n\
                       vllm:time_per_output_token_seconds_sum 99\n\
                       vllm:time_per_output_token_seconds_count 1\n";
        assert_eq!(
            totals(current),
            Some(HistogramTotals {
                sum: 2.0,
                count: 60.0
            })
        );
        let older = "vllm:time_per_output_token_seconds_sum 3\n\
                     vllm:time_per_output_token_seconds_count 100\n";
        assert_eq!(
            totals(older),
            Some(HistogramTotals {
                sum: 3.0,
                count: 100.0
            })
        );
        assert_eq!(totals("vllm:num_requests_waiting 1\n"), None);
        let triton = engines.get("triton").unwrap();
        assert_eq!(
            histogram_totals(&triton.inter_token_latency, &parse(current).unwrap()),
            None
        );
        let lengths = "vllm:request_generation_tokens_sum{model_name=\"a\"} 640\n\
                       vllm:request_generation_tokens_count{model_name=\"a\"} 10\n";
        assert_eq!(
            histogram_totals(&vllm.request_output_tokens, &parse(lengths).unwrap()),
            Some(HistogramTotals {
                sum: 640.0,
                count: 10.0
            })
        );
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
        assert!(err.contains("vllm:num_requests_waiting"), "{err}");
        let err = extract_as("sglang", "vllm:num_requests_waiting 1\n").unwrap_err();
        assert!(
            err.contains("no sglang metrics") && err.contains("sglang:num_queue_reqs"),
            "{err}"
        );
    }

    // One exposition per engine, written from the metric names upstream maps.

    #[test]
    fn reads_sglang() {
        let m = extract_as(
            "sglang",
            "sglang:num_queue_reqs{model_name=\"m\"} 4\n\
             sglang:num_running_reqs{model_name=\"m\"} 9\n\
             sglang:token_usage{model_name=\"m\"} 0.42\n\
             sglang:cache_config_info{page_size=\"64\",num_pages=\"1200\"} 1\n",
        )
        .unwrap();
        assert_eq!((m.waiting_queue_size, m.running_requests_size), (4, 9));
        assert_eq!(m.kv_cache_usage, 0.42);
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(64), Some(1200)));
    }

    #[test]
    fn reads_trtllm_serve() {
        let m = extract_as(
            "trtllm-serve",
            "trtllm_num_requests_waiting 2\n\
             trtllm_num_requests_running 6\n\
             trtllm_kv_cache_utilization 0.3\n\
             trtllm_kv_cache_tokens_per_block 32\n\
             trtllm_kv_cache_max_blocks 5000\n",
        )
        .unwrap();
        assert_eq!((m.waiting_queue_size, m.running_requests_size), (2, 6));
        assert_eq!(m.kv_cache_usage, 0.3);
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(32), Some(5000)));
    }

    #[test]
    fn reads_triton_tensorrt_llm_by_label() {
        let m = extract_as(
            "triton-tensorrt-llm",
            "nv_trt_llm_request_metrics{model=\"ensemble\",request_type=\"waiting\"} 3\n\
             nv_trt_llm_request_metrics{model=\"ensemble\",request_type=\"scheduled\"} 7\n\
             nv_trt_llm_request_metrics{model=\"ensemble\",request_type=\"context\"} 99\n\
             nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"fraction\"} 0.61\n\
             nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"tokens_per\"} 64\n\
             nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"max\"} 800\n\
             nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type=\"used\"} 488\n",
        )
        .unwrap();
        assert_eq!((m.waiting_queue_size, m.running_requests_size), (3, 7));
        assert_eq!(m.kv_cache_usage, 0.61);
        assert_eq!((m.block_size, m.num_gpu_blocks), (Some(64), Some(800)));
    }

    #[test]
    fn reads_triton() {
        let m = extract_as(
            "triton",
            "nv_inference_pending_request_count{model=\"a\"} 1\n\
             nv_inference_pending_request_count{model=\"b\"} 2\n\
             nv_inference_exec_count{model=\"a\"} 5\n",
        )
        .unwrap();
        assert_eq!((m.waiting_queue_size, m.running_requests_size), (3, 5));
        assert_eq!(m.kv_cache_usage, 0.0, "triton reports no KV cache");
        assert_eq!(m.block_size, None);
    }
}
