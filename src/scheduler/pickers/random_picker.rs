//! `random-picker`: uniformly random among the candidates, scores ignored.

use crate::scheduler::rng::Rng;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "random-picker";

/// Up to `n` distinct random indices below `candidates` (at least one when there are any).
pub fn pick(candidates: usize, n: usize, rng: &mut Rng) -> Vec<usize> {
    let mut order: Vec<usize> = (0..candidates).collect();
    rng.shuffle(&mut order);
    order.truncate(n.max(1));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn uniform_and_distinct() {
        let mut rng = Rng::new(5);
        let mut seen = [0; 4];
        for _ in 0..400 {
            let picked = pick(4, 2, &mut rng);
            assert_eq!(picked.len(), 2);
            assert_ne!(picked[0], picked[1]);
            seen[picked[0]] += 1;
        }
        assert!(seen.iter().all(|&c| c > 60), "{seen:?}");
    }
}
