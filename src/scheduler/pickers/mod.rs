//! Picker plugins, one file each, named like their upstream config `type`, which each holds as
//! `TYPE`.

pub mod max_score_picker;
pub mod random_picker;
pub mod weighted_random_picker;

use super::profile::PickerSpec;
use super::rng::Rng;

/// Picks endpoint indices, primary first, from the weighted totals.
pub fn pick(spec: &PickerSpec, totals: &[f64], rng: &mut Rng) -> Vec<usize> {
    match spec {
        PickerSpec::MaxScore {
            max_num_of_endpoints,
        } => max_score_picker::pick(totals, *max_num_of_endpoints, rng),
        PickerSpec::WeightedRandom {
            max_num_of_endpoints,
        } => weighted_random_picker::pick(totals, *max_num_of_endpoints, rng),
        PickerSpec::Random {
            max_num_of_endpoints,
        } => random_picker::pick(totals.len(), *max_num_of_endpoints, rng),
    }
}
