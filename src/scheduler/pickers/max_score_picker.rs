//! `max-score-picker`: the highest totals first, ties broken at random; `maxNumOfEndpoints` > 1
//! returns the next best as ordered fallbacks.

use crate::scheduler::rng::Rng;

/// Up to `n` indices (at least one when there are candidates), best first.
pub fn pick(totals: &[f64], n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..totals.len()).collect();
    rng.shuffle(&mut order);
    // Stable sort after a shuffle: equal totals stay in random order.
    order.sort_by(|&a, &b| totals[b].total_cmp(&totals[a]));
    order.truncate(n.max(1));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn best_first_with_fallbacks() {
        let mut rng = Rng::new(3);
        assert_eq!(pick(&[0.1, 0.9, 0.5], 1, &mut rng), vec![1]);
        assert_eq!(pick(&[0.1, 0.9, 0.5], 2, &mut rng), vec![1, 2]);
        assert_eq!(pick(&[0.1, 0.9, 0.5], 9, &mut rng), vec![1, 2, 0]);
        assert_eq!(pick(&[0.1, 0.9], 0, &mut rng), vec![1]);
        assert!(pick(&[], 1, &mut rng).is_empty());
    }

    #[test]
    fn ties_are_broken_at_random() {
        let mut rng = Rng::new(11);
        let mut seen = [0; 3];
        for _ in 0..300 {
            let first = pick(&[1.0, 1.0, 0.2], 1, &mut rng)[0];
            seen[first] += 1;
        }
        assert_eq!(seen[2], 0);
        assert!(seen[0] > 100 && seen[1] > 100, "{seen:?}");
    }
}
