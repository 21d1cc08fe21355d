//! The prefix index: for every endpoint, a bounded LRU of the block hashes routed to it, plus a
//! reverse map from hash to endpoints so a match walks the request's blocks once.

use std::collections::{BTreeMap, HashMap};

use crate::snapshot::Endpoint;

/// Block hashes learnt per endpoint, bounded per endpoint by least-recently-used eviction.
#[derive(Debug, Default)]
pub struct PrefixIndex {
    holders: HashMap<u64, Vec<String>>,
    servers: HashMap<String, Lru>,
}

#[derive(Debug, Default)]
struct Lru {
    tick: u64,
    by_hash: HashMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
}

impl PrefixIndex {
    /// Leading blocks of `hashes` each endpoint holds. The walk stops at the first block no
    /// endpoint holds, as upstream does.
    pub fn matched_blocks(&self, endpoints: &[Endpoint], hashes: &[u64]) -> Vec<usize> {
        let keys: Vec<String> = endpoints.iter().map(Endpoint::host_port).collect();
        let mut matched = vec![0; endpoints.len()];
        for hash in hashes {
            let Some(holders) = self.holders.get(hash) else {
                break;
            };
            for (count, key) in matched.iter_mut().zip(&keys) {
                if holders.contains(key) {
                    *count += 1;
                }
            }
        }
        matched
    }

    /// Records that `endpoint` now serves `hashes`, evicting its oldest blocks beyond
    /// `capacity`.
    pub fn record(&mut self, endpoint: &Endpoint, hashes: &[u64], capacity: usize) {
        let key = endpoint.host_port();
        let lru = self.servers.entry(key.clone()).or_default();
        for &hash in hashes {
            lru.tick += 1;
            if let Some(old) = lru.by_hash.insert(hash, lru.tick) {
                lru.by_tick.remove(&old);
            } else {
                self.holders.entry(hash).or_default().push(key.clone());
            }
            lru.by_tick.insert(lru.tick, hash);
        }
        while lru.by_hash.len() > capacity.max(1) {
            let Some((_, evicted)) = lru.by_tick.pop_first() else {
                break;
            };
            lru.by_hash.remove(&evicted);
            if let Some(holders) = self.holders.get_mut(&evicted) {
                holders.retain(|h| h != &key);
                if holders.is_empty() {
                    self.holders.remove(&evicted);
                }
            }
        }
    }

    /// Number of (endpoint, block) entries held.
    pub fn len(&self) -> usize {
        self.servers.values().map(|l| l.by_hash.len()).sum()
    }

    /// True when nothing has been learnt yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn matches_leading_blocks_and_stops_at_first_unknown() {
        let eps = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let mut index = PrefixIndex::default();
        index.record(&eps[0], &[1, 2, 3], 100);
        index.record(&eps[1], &[1, 9, 3], 100);
        // Every block before the first unknown one counts for each endpoint holding it.
        assert_eq!(index.matched_blocks(&eps, &[1, 2, 3, 4]), vec![3, 2]);
        // Block 5 is held by nobody: the walk stops, block 3 does not count.
        assert_eq!(index.matched_blocks(&eps, &[1, 5, 3]), vec![1, 1]);
        assert_eq!(index.matched_blocks(&eps, &[7]), vec![0, 0]);
    }

    #[test]
    fn lru_evicts_oldest_per_endpoint() {
        let eps = [endpoint(1, 0, 0.0)];
        let mut index = PrefixIndex::default();
        index.record(&eps[0], &[1, 2, 3], 3);
        index.record(&eps[0], &[1], 3); // refresh 1
        index.record(&eps[0], &[4], 3); // evicts 2
        assert_eq!(index.len(), 3);
        assert_eq!(index.matched_blocks(&eps, &[1]), vec![1]);
        assert_eq!(index.matched_blocks(&eps, &[2]), vec![0]);
        assert!(!index.holders.contains_key(&2));
    }
}
