//! The approximate prefix-cache producer (upstream `approx-prefix-cache-producer`): without a
//! tokenizer, the prompt is cut into 4-byte pseudo-tokens, grouped into blocks and hashed in a
//! chain seeded with the target model and `cache_salt`; an index learnt from our own routing
//! decisions tells how many leading blocks each endpoint likely has cached.

mod hashing;
pub mod index;

pub use hashing::{block_hashes, PromptBlocks};
pub use index::PrefixIndex;

use super::profile::PrefixCacheParams;
use super::Request;
use crate::phases::{Phase, PhaseTimer};
use crate::snapshot::Endpoint;

/// The producer's `type` in an EndpointPickerConfig `plugins` entry (the snapshot's profile
/// carries its parameters with `prefix-cache-scorer`'s).
pub const TYPE: &str = "approx-prefix-cache-producer";

/// Smallest block, in tokens, the producer hashes (bounds the index's memory).
pub const MIN_BLOCK_SIZE_TOKENS: u64 = 64;

/// What the producer computed for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixMatch {
    /// The request's blocks: how many, and the chained hashes of the indexed ones.
    pub blocks: PromptBlocks,
    /// Leading blocks each candidate likely holds (same order as the candidates).
    pub matched_blocks: Vec<usize>,
    /// Tokens per block.
    pub block_size_tokens: u64,
}

/// Computes the request's block hashes and each candidate's match against the index; `keys`
/// holds the candidates' [`Endpoint::index_key`]s.
pub fn produce(
    params: &PrefixCacheParams,
    endpoints: &[&Endpoint],
    keys: &[u64],
    request: &Request<'_>,
    index: &PrefixIndex,
    timer: &mut PhaseTimer,
) -> PrefixMatch {
    let first = endpoints.first().map(|e| &e.metrics);
    let tuned_block = first
        .and_then(|m| m.block_size)
        .filter(|_| params.auto_tune)
        .map(u64::from);
    let block_size_tokens = tuned_block
        .unwrap_or(params.block_size_tokens)
        .max(MIN_BLOCK_SIZE_TOKENS);
    let max_blocks = (params.max_prefix_tokens_to_match / block_size_tokens) as usize;
    let blocks = block_hashes(
        request.model,
        request.cache_salt,
        request.prompt,
        block_size_tokens,
        max_blocks,
    );
    timer.mark(Phase::Hash);
    let mut matched_blocks = index.matched_entries(keys, &blocks.hashes);
    for matched in &mut matched_blocks {
        *matched = blocks.blocks_covered(*matched);
    }
    timer.mark(Phase::Lookup);
    PrefixMatch {
        blocks,
        matched_blocks,
        block_size_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn block_size_is_auto_tuned_with_a_floor_of_64() {
        let mut owned = [endpoint(1, 0, 0.0)];
        let request = Request {
            model: "m",
            prompt: &[7; 1024],
            ..Request::default()
        };
        let index = PrefixIndex::new(16);
        let p = produce(
            &PrefixCacheParams::default(),
            &[&owned[0]],
            &[1],
            &request,
            &index,
            &mut PhaseTimer::off(),
        );
        assert_eq!(p.block_size_tokens, 64);
        assert_eq!(p.blocks.total, 4); // 1024 bytes = 256 tokens = 4 blocks of 64
        owned[0].metrics.block_size = Some(128);
        owned[0].metrics.num_gpu_blocks = Some(10);
        let endpoints = [&owned[0]];
        let p = produce(
            &PrefixCacheParams::default(),
            &endpoints,
            &[1],
            &request,
            &index,
            &mut PhaseTimer::off(),
        );
        assert_eq!((p.block_size_tokens, p.blocks.total), (128, 2));
        let fixed = PrefixCacheParams {
            auto_tune: false,
            ..PrefixCacheParams::default()
        };
        let p = produce(
            &fixed,
            &endpoints,
            &[1],
            &request,
            &index,
            &mut PhaseTimer::off(),
        );
        assert_eq!(p.block_size_tokens, 64);
    }

    #[test]
    fn token_cap_limits_blocks() {
        let params = PrefixCacheParams {
            max_prefix_tokens_to_match: 128,
            ..PrefixCacheParams::default()
        };
        let request = Request {
            model: "m",
            prompt: &[7; 4096],
            ..Request::default()
        };
        let p = produce(
            &params,
            &[&endpoint(1, 0, 0.0)],
            &[1],
            &request,
            &PrefixIndex::new(16),
            &mut PhaseTimer::off(),
        );
        assert_eq!(p.blocks.total, 2);
    }
}
