//! Command-line flags.

use std::net::IpAddr;

use clap::Parser;

use crate::engine::EngineConfig;
use crate::latency::LatencyModel;
use crate::metrics::MetricNames;

/// A vLLM-compatible model-server simulator: OpenAI completions and chat
/// endpoints, vLLM's Prometheus metrics, continuous batching, LoRA slots and a
/// prefix cache, with a configurable latency model.
#[derive(Clone, Debug, Parser)]
#[command(name = "vllm-sim", version)]
pub struct Cli {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,

    /// Port to listen on (0 picks a free one; the listening line shows it).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,

    /// Whose metric names `/metrics` reports (the engine a scraper must be told about through
    /// the endpoint label `llm-d.ai/engine-type`).
    #[arg(long, value_enum, default_value_t = MetricNames::Vllm)]
    pub engine: MetricNames,

    /// Name of the base model served (the `model` requests must name).
    #[arg(long, default_value = "meta-llama/Llama-3.1-8B-Instruct")]
    pub model: String,

    /// Name reported in the `x-sim-instance` response header [default: sim-<port>].
    #[arg(long)]
    pub instance_name: Option<String>,

    /// Most requests running at once; the rest wait in a FIFO queue.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_num_seqs: u32,

    /// Comma-separated LoRA adapter names requests may use as `model`.
    #[arg(long, value_delimiter = ',')]
    pub lora_modules: Vec<String>,

    /// Most distinct LoRA adapters running at once.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_loras: u32,

    /// Extra time to first token when a request's adapter is not loaded, in ms.
    #[arg(long, default_value_t = 20.0, value_parser = non_negative)]
    pub lora_load_ms: f64,

    /// Fixed part of the time to first token, in ms.
    #[arg(long, default_value_t = 5.0, value_parser = non_negative)]
    pub ttft_base_ms: f64,

    /// Prefill time per prompt token not served from the prefix cache, in ms.
    #[arg(long, default_value_t = 0.02, value_parser = non_negative)]
    pub prefill_ms_per_token: f64,

    /// Time per output token (inter-token latency) with an empty batch, in ms.
    #[arg(long, default_value_t = 4.0, value_parser = non_negative)]
    pub itl_ms: f64,

    /// Relative slowdown of prefill and decode per other running request.
    #[arg(long, default_value_t = 0.05, value_parser = non_negative)]
    pub batch_slowdown: f64,

    /// Run prefill and decode on one device: prefills queue one after another, and each
    /// decode step also waits for the prefill work admitted since the request's last token
    /// (off: prefills overlap and slow nobody else down).
    #[arg(long)]
    pub prefill_stalls_decode: bool,

    /// Multiplier on every latency (2.0 = a server twice as slow).
    #[arg(long, default_value_t = 1.0, value_parser = non_negative)]
    pub time_scale: f64,

    /// Tokens per KV-cache block (and per prefix-cache block).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub block_size: u64,

    /// KV-cache blocks on the simulated GPU (also the prefix-cache capacity).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    pub num_gpu_blocks: u64,

    /// Output tokens of a request that gives no `max_tokens`.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub default_max_tokens: u64,
}

impl Cli {
    /// The engine configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            max_num_seqs: self.max_num_seqs as usize,
            max_loras: self.max_loras as usize,
            block_size: self.block_size,
            num_gpu_blocks: self.num_gpu_blocks,
            latency: LatencyModel {
                ttft_base_ms: self.ttft_base_ms,
                prefill_ms_per_token: self.prefill_ms_per_token,
                itl_ms: self.itl_ms,
                batch_slowdown: self.batch_slowdown,
                lora_load_ms: self.lora_load_ms,
                time_scale: self.time_scale,
            },
            prefill_stalls_decode: self.prefill_stalls_decode,
        }
    }
}

/// Parses a finite, non-negative number.
fn non_negative(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(value) if value.is_finite() && value >= 0.0 => Ok(value),
        _ => Err(format!("`{text}` is not a finite non-negative number")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_documented_values() {
        let cli = Cli::parse_from(["vllm-sim"]);
        assert_eq!(cli.port, 8000);
        assert_eq!(cli.model, "meta-llama/Llama-3.1-8B-Instruct");
        assert!(cli.lora_modules.is_empty());
        let config = cli.engine_config();
        assert_eq!((config.max_num_seqs, config.max_loras), (8, 2));
        assert_eq!((config.block_size, config.num_gpu_blocks), (16, 2048));
        assert_eq!(config.latency.itl_ms, 4.0);
        assert!(!config.prefill_stalls_decode);
    }

    #[test]
    fn lora_modules_are_comma_separated() {
        let cli = Cli::parse_from(["vllm-sim", "--lora-modules", "a,b,c"]);
        assert_eq!(cli.lora_modules, ["a", "b", "c"]);
    }

    #[test]
    fn bad_values_are_rejected() {
        for args in [
            ["--max-num-seqs", "0"],
            ["--itl-ms", "-1"],
            ["--time-scale", "NaN"],
            ["--host", "not-an-ip"],
        ] {
            assert!(
                Cli::try_parse_from(["vllm-sim", args[0], args[1]]).is_err(),
                "{args:?}"
            );
        }
    }
}
