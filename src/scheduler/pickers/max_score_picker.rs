//! `max-score-picker`: the highest totals first, ties broken at random; `maxNumOfEndpoints` > 1
//! returns the next best as ordered fallbacks.

use crate::scheduler::rng::Rng;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "max-score-picker";

/// Up to `n` indices (at least one when there are candidates), best first.
pub fn pick(totals: &[f64], n: usize, rng: &mut Rng) -> Vec<usize> {
    if n <= 1 {
        return best(totals, rng).into_iter().collect();
    }
    // A random tie-break per candidate, then only the best `n` are ordered.
    let mut order: Vec<(usize, u64)> = (0..totals.len()).map(|i| (i, rng.next_u64())).collect();
    let better = |a: &(usize, u64), b: &(usize, u64)| {
        totals[b.0].total_cmp(&totals[a.0]).then(a.1.cmp(&b.1))
    };
    if n < order.len() {
        order.select_nth_unstable_by(n - 1, better);
        order.truncate(n);
    }
    order.sort_unstable_by(better);
    order.into_iter().map(|(i, _)| i).collect()
}

/// The index of the highest total, uniformly at random among ties: one pass, a random draw
/// only on a tie (reservoir sampling), no allocation.
fn best(totals: &[f64], rng: &mut Rng) -> Option<usize> {
    let mut chosen = None;
    let mut ties = 0;
    for (i, &total) in totals.iter().enumerate() {
        let order = chosen.map(|c: usize| total.total_cmp(&totals[c]));
        match order {
            None | Some(std::cmp::Ordering::Greater) => {
                chosen = Some(i);
                ties = 1;
            }
            Some(std::cmp::Ordering::Equal) => {
                ties += 1;
                if rng.below(ties) == 0 {
                    chosen = Some(i);
                }
            }
            Some(std::cmp::Ordering::Less) => {}
        }
    }
    chosen
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
        // Fallback lists break ties at random too.
        let mut firsts = [0; 3];
        for _ in 0..300 {
            let picked = pick(&[0.5, 1.0, 1.0], 2, &mut rng);
            assert_eq!(picked.len(), 2);
            assert!(picked.contains(&1) && picked.contains(&2), "{picked:?}");
            firsts[picked[0]] += 1;
        }
        assert!(firsts[1] > 100 && firsts[2] > 100, "{firsts:?}");
    }
}
