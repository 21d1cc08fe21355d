//! `weighted-random-picker`: a random pick where a higher total is proportionally more likely
//! (A-Res reservoir sampling: key = U^(1/score), highest keys win); when every score is ≤ 0
//! the pick is uniform.

use crate::scheduler::rng::Rng;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "weighted-random-picker";

/// Up to `n` distinct indices (at least one when there are candidates).
pub fn pick(totals: &[f64], n: usize, rng: &mut Rng) -> Vec<usize> {
    if totals.iter().all(|&t| t.is_nan() || t <= 0.0) {
        return super::random_picker::pick(totals.len(), n, rng);
    }
    let mut keyed: Vec<(f64, usize)> = totals
        .iter()
        .enumerate()
        .map(|(i, &score)| {
            // U in (0, 1]; a non-positive score never beats a positive one.
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            let u = u.max(f64::MIN_POSITIVE);
            let key = if score > 0.0 {
                u.powf(1.0 / score)
            } else {
                -1.0
            };
            (key, i)
        })
        .collect();
    keyed.sort_by(|a, b| b.0.total_cmp(&a.0));
    keyed.into_iter().take(n.max(1)).map(|(_, i)| i).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn picks_in_proportion_to_score() {
        let mut rng = Rng::new(21);
        let mut seen = [0u32; 3];
        for _ in 0..4000 {
            seen[pick(&[3.0, 1.0, 0.0], 1, &mut rng)[0]] += 1;
        }
        assert_eq!(seen[2], 0, "{seen:?}");
        let share = f64::from(seen[0]) / 4000.0;
        assert!((0.70..0.80).contains(&share), "{seen:?}");
    }

    #[test]
    fn distinct_fallbacks_and_uniform_when_all_zero() {
        let mut rng = Rng::new(2);
        let picked = pick(&[1.0, 2.0, 3.0], 3, &mut rng);
        let mut sorted = picked.clone();
        sorted.sort();
        assert_eq!(sorted, vec![0, 1, 2]);
        let mut seen = [0u32; 2];
        for _ in 0..400 {
            seen[pick(&[0.0, 0.0], 1, &mut rng)[0]] += 1;
        }
        assert!(seen.iter().all(|&c| c > 120), "{seen:?}");
    }
}
