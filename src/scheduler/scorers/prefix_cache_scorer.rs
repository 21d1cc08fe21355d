//! `prefix-cache-scorer`: `w·min(1, matched·blockSize/scale)² + (1−w)·matched/total`, where
//! `w` is `matchLengthWeight` and `scale` is `matchLengthScaleTokens`; no blocks → 0.

use crate::scheduler::profile::PrefixCacheParams;
use crate::scheduler::ScoringInput;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "prefix-cache-scorer";

/// One score per candidate.
pub fn score(params: &PrefixCacheParams, input: &ScoringInput<'_>) -> Vec<f64> {
    let Some(prefix) = input.prefix else {
        return vec![0.0; input.endpoints.len()];
    };
    if prefix.blocks.total == 0 {
        return vec![0.0; input.endpoints.len()];
    }
    // Per-candidate work is two multiplications: the divisions are hoisted.
    let per_block_ratio = 1.0 / prefix.blocks.total as f64;
    let w = params.match_length_weight;
    let per_block_length =
        prefix.block_size_tokens as f64 / params.match_length_scale_tokens.max(1) as f64;
    (0..input.endpoints.len())
        .map(|i| {
            let matched = prefix.matched_blocks.get(i).copied().unwrap_or(0) as f64;
            let length = (matched * per_block_length).min(1.0);
            w * length * length + (1.0 - w) * matched * per_block_ratio
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::prefix::{PrefixMatch, PromptBlocks};
    use crate::scheduler::test_support::{endpoint, input};
    use crate::scheduler::Request;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn ratio_and_length_terms() {
        let endpoints = [
            endpoint(1, 0, 0.0),
            endpoint(2, 0, 0.0),
            endpoint(3, 0, 0.0),
        ];
        let refs: Vec<_> = endpoints.iter().collect();
        let request = Request::default();
        let prefix = PrefixMatch {
            blocks: PromptBlocks {
                total: 4,
                hashes: vec![1, 2, 3, 4],
            },
            matched_blocks: vec![4, 2, 0],
            block_size_tokens: 64,
        };
        let scoring = ScoringInput {
            prefix: Some(&prefix),
            in_flight: &[],
            ..input(&refs, &request)
        };
        assert_eq!(
            score(&PrefixCacheParams::default(), &scoring),
            vec![1.0, 0.5, 0.0]
        );
        let params = PrefixCacheParams {
            match_length_weight: 0.5,
            match_length_scale_tokens: 256,
            ..PrefixCacheParams::default()
        };
        // endpoint 2: length = 128/256 = 0.5 → 0.5·0.25 + 0.5·0.5 = 0.375
        assert_eq!(score(&params, &scoring), vec![1.0, 0.375, 0.0]);
        let none = ScoringInput {
            prefix: None,
            in_flight: &[],
            ..input(&refs, &request)
        };
        assert_eq!(score(&params, &none), vec![0.0; 3]);
    }
}
