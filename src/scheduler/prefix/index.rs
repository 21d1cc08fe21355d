//! The prefix index: which endpoint likely holds which prompt block, learnt from routing
//! decisions.
//!
//! Each Envoy worker keeps its own index in its Wasm memory, so a decision reads and updates it
//! with no host call. What a worker records itself also goes to its *outbox*, which the worker
//! publishes to the other workers (see [`crate::exchange`]); what arrives from them is
//! [`learn`](PrefixIndex::learn)t without going to the outbox again. So every worker learns from
//! every worker's decisions, a tick later.
//!
//! The index is a fixed table of buckets (a block hash picks its bucket), each holding at most
//! [`ENTRIES_PER_BUCKET`] block hashes with up to [`HOLDERS_PER_ENTRY`] endpoints each, stamped
//! with when they were last routed there. A full bucket evicts its least recently used block
//! and a full entry its least recently routed endpoint, so memory is fixed by the bucket count
//! and nothing is allocated per block.

/// Block hashes kept per bucket.
pub const ENTRIES_PER_BUCKET: usize = 8;
/// Endpoints remembered per block hash.
pub const HOLDERS_PER_ENTRY: usize = 4;
/// A block already recorded for the endpoint this recently is not recorded (nor published)
/// again: a hot shared prefix costs one lookup per block.
const REFRESH_AFTER_MS: u64 = 1_000;
/// Most words the outbox holds between two publications; beyond it new records stay local.
pub const OUTBOX_MAX_WORDS: usize = 1 << 16;

/// A bucket of up to [`ENTRIES_PER_BUCKET`] remembered blocks, laid out field by field so a
/// lookup reads one cache line of hashes (and an eviction one of times) rather than every
/// entry: slot `i` holds block `hashes[i]` (0: free; a real hash of 0 is simply not
/// remembered), routed last at `last_used[i]` ms to the `lens[i]` holders of `holders[i]`,
/// (endpoint key, last routed ms) pairs.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Bucket {
    hashes: [u64; ENTRIES_PER_BUCKET],
    last_used: [u64; ENTRIES_PER_BUCKET],
    lens: [u8; ENTRIES_PER_BUCKET],
    holders: [[(u64, u64); HOLDERS_PER_ENTRY]; ENTRIES_PER_BUCKET],
}

impl Bucket {
    fn slot(&self, hash: u64) -> Option<usize> {
        (hash != 0)
            .then(|| self.hashes.iter().position(|&h| h == hash))
            .flatten()
    }

    fn holders(&self, slot: usize) -> &[(u64, u64)] {
        &self.holders[slot][..usize::from(self.lens[slot])]
    }
}

/// A worker's prefix index; see the module docs.
#[derive(Debug, Clone)]
pub struct PrefixIndex {
    buckets: Vec<Bucket>,
    /// Records to publish, as groups `[endpoint key, ms, n, hash × n]`.
    outbox: Vec<u64>,
}

impl PrefixIndex {
    /// An empty index of `buckets` buckets (at least one), allocated once.
    pub fn new(buckets: u32) -> PrefixIndex {
        PrefixIndex {
            buckets: vec![Bucket::default(); buckets.max(1) as usize],
            outbox: Vec::new(),
        }
    }

    fn bucket(&self, hash: u64) -> usize {
        (hash % self.buckets.len() as u64) as usize
    }

    /// The holders of `hash`, if it is remembered.
    fn holders_of(&self, hash: u64) -> Option<&[(u64, u64)]> {
        let bucket = &self.buckets[self.bucket(hash)];
        bucket.slot(hash).map(|slot| bucket.holders(slot))
    }

    /// For each endpoint (by [`Endpoint::index_key`](crate::snapshot::Endpoint::index_key)),
    /// how many of the leading `hashes` it holds: walking them in order and stopping at the
    /// first one nobody holds (as upstream does), an endpoint holding the `i`-th counts as
    /// holding all `i + 1` (the hashes are chained: it was sent that whole prefix, and only
    /// an eviction can have dropped an earlier one). One entry per holder seen (at most
    /// [`HOLDERS_PER_ENTRY`] per hash), then one binary search per endpoint: no work per hash
    /// and endpoint pair.
    pub fn matched_entries(&self, keys: &[u64], hashes: &[u64]) -> Vec<usize> {
        let mut per_holder: Vec<(u64, usize)> = Vec::new();
        for (i, &hash) in hashes.iter().enumerate() {
            let Some(holders) = self.holders_of(hash) else {
                break;
            };
            for &(key, _) in holders {
                match per_holder.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, held)) => *held = i + 1,
                    None => per_holder.push((key, i + 1)),
                }
            }
        }
        if per_holder.is_empty() {
            return vec![0; keys.len()];
        }
        per_holder.sort_unstable();
        keys.iter()
            .map(|key| {
                per_holder
                    .binary_search_by_key(key, |&(k, _)| k)
                    .map_or(0, |i| per_holder[i].1)
            })
            .collect()
    }

    /// Records this worker's decision: `endpoint_key` was sent the blocks `hashes` at
    /// `now_unix_ms`. Blocks not recorded for it within the refresh window also go to the
    /// outbox.
    pub fn record(&mut self, endpoint_key: u64, hashes: &[u64], now_unix_ms: u64) {
        let start = self.outbox.len();
        let room = OUTBOX_MAX_WORDS.saturating_sub(start + 3);
        let mut published = 0;
        for &hash in hashes {
            if self.upsert(hash, endpoint_key, now_unix_ms) && published < room {
                if published == 0 {
                    self.outbox
                        .extend_from_slice(&[endpoint_key, now_unix_ms, 0]);
                }
                self.outbox.push(hash);
                published += 1;
            }
        }
        if published > 0 {
            self.outbox[start + 2] = published as u64;
        }
    }

    /// Learns another worker's decision (not published again).
    pub fn learn(&mut self, endpoint_key: u64, hashes: &[u64], at_unix_ms: u64) {
        for &hash in hashes {
            self.upsert(hash, endpoint_key, at_unix_ms);
        }
    }

    /// Learns every record group of `words` (an outbox's form), ignoring a malformed tail.
    pub fn learn_groups(&mut self, words: &[u64]) {
        let mut rest = words;
        while let [key, at, n, tail @ ..] = rest {
            let Some(hashes) = usize::try_from(*n).ok().and_then(|n| tail.get(..n)) else {
                return;
            };
            self.learn(*key, hashes, *at);
            rest = &tail[hashes.len()..];
        }
    }

    /// The records to publish, as groups `[endpoint key, ms, n, hash × n]`.
    pub fn outbox(&self) -> &[u64] {
        &self.outbox
    }

    /// Empties the outbox once published (its memory is kept for the next records).
    pub fn clear_outbox(&mut self) {
        self.outbox.clear();
    }

    /// Hands over the records to publish, leaving the outbox empty.
    #[cfg(test)]
    pub(crate) fn take_outbox(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.outbox)
    }

    /// Whether `key` is remembered as a holder of `hash`.
    #[cfg(test)]
    pub(crate) fn has_holder(&self, hash: u64, key: u64) -> bool {
        self.holders_of(hash)
            .is_some_and(|holders| holders.iter().any(|h| h.0 == key))
    }

    /// Sets `key` as a holder of `hash` at `now`; false when it already was within the refresh
    /// window (nothing changed worth publishing).
    fn upsert(&mut self, hash: u64, key: u64, now: u64) -> bool {
        if hash == 0 {
            return false;
        }
        let index = self.bucket(hash);
        let bucket = &mut self.buckets[index];
        let slot = match bucket.slot(hash) {
            Some(slot) => slot,
            None => {
                // A free slot, else the least recently used block.
                let slot = bucket
                    .hashes
                    .iter()
                    .position(|&h| h == 0)
                    .or_else(|| (0..ENTRIES_PER_BUCKET).min_by_key(|&i| bucket.last_used[i]))
                    .unwrap_or(0);
                bucket.hashes[slot] = hash;
                bucket.lens[slot] = 0;
                bucket.last_used[slot] = now;
                slot
            }
        };
        bucket.last_used[slot] = bucket.last_used[slot].max(now);
        let len = usize::from(bucket.lens[slot]);
        let holders = &mut bucket.holders[slot];
        if let Some(holder) = holders[..len].iter_mut().find(|h| h.0 == key) {
            if now.saturating_sub(holder.1) < REFRESH_AFTER_MS {
                return false;
            }
            holder.1 = holder.1.max(now);
            return true;
        }
        if len < HOLDERS_PER_ENTRY {
            holders[len] = (key, now);
            bucket.lens[slot] += 1;
        } else if let Some(oldest) = (0..len).min_by_key(|&i| holders[i].1) {
            holders[oldest] = (key, now);
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::{endpoint, keys_of};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn matches_blocks_and_stops_at_first_unknown() {
        let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let eps = [&owned[0], &owned[1]];
        let mut index = PrefixIndex::new(64);
        index.record(eps[0].index_key(), &[1, 2, 3], 10);
        index.record(eps[1].index_key(), &[1, 2], 10);
        // Every block before the first unknown one counts for each endpoint holding it.
        assert_eq!(
            index.matched_entries(&keys_of(&eps), &[1, 2, 3, 4]),
            vec![3, 2]
        );
        // Chained hashes: holding the third means holding the whole prefix, whatever an
        // eviction dropped before it.
        index.record(eps[1].index_key(), &[9, 3], 10);
        assert_eq!(
            index.matched_entries(&keys_of(&eps), &[1, 2, 3, 4]),
            vec![3, 3]
        );
        // Block 5 is held by nobody: the walk stops, block 3 does not count.
        assert_eq!(
            index.matched_entries(&keys_of(&eps), &[1, 5, 3]),
            vec![1, 1]
        );
        assert_eq!(index.matched_entries(&keys_of(&eps), &[7]), vec![0, 0]);
    }

    #[test]
    fn a_full_bucket_evicts_its_least_recently_used_block() {
        let owned = [endpoint(1, 0, 0.0)];
        let eps = [&owned[0]];
        let key = eps[0].index_key();
        let mut index = PrefixIndex::new(1); // every hash in one bucket
        let hashes: Vec<u64> = (100..100 + ENTRIES_PER_BUCKET as u64).collect();
        for (t, &h) in hashes.iter().enumerate() {
            index.record(key, &[h], t as u64 * REFRESH_AFTER_MS);
        }
        index.record(key, &[hashes[0]], 50 * REFRESH_AFTER_MS); // refresh the oldest
        index.record(key, &[999], 60 * REFRESH_AFTER_MS); // evicts hashes[1], now the least recent
        assert_eq!(index.matched_entries(&keys_of(&eps), &[hashes[0]]), vec![1]);
        assert_eq!(index.matched_entries(&keys_of(&eps), &[hashes[1]]), vec![0]);
        assert_eq!(index.matched_entries(&keys_of(&eps), &[999]), vec![1]);
        let remembered = (98..1000)
            .filter(|&h| index.holders_of(h).is_some())
            .count();
        assert_eq!(remembered, ENTRIES_PER_BUCKET);
    }

    #[test]
    fn a_fresh_record_is_not_published_again() {
        let mut index = PrefixIndex::new(4);
        index.record(1, &[7, 8], 1_000);
        assert_eq!(index.take_outbox(), vec![1, 1_000, 2, 7, 8]);
        index.record(1, &[7, 8, 9], 1_500);
        assert_eq!(
            index.take_outbox(),
            vec![1, 1_500, 1, 9],
            "only the new block"
        );
        index.record(1, &[7], 2_000);
        assert_eq!(
            index.take_outbox(),
            vec![1, 2_000, 1, 7],
            "refreshed after the window"
        );
        index.record(1, &[7], 2_100);
        assert!(index.take_outbox().is_empty());
    }

    #[test]
    fn holders_per_block_are_bounded() {
        let owned: Vec<_> = (1..=6).map(|i| endpoint(i, 0, 0.0)).collect();
        let eps: Vec<_> = owned.iter().collect();
        let mut index = PrefixIndex::new(8);
        for (t, e) in eps.iter().enumerate() {
            index.record(e.index_key(), &[42], t as u64);
        }
        // The two least recently routed endpoints were forgotten.
        assert_eq!(
            index.matched_entries(&keys_of(&eps), &[42]),
            vec![0, 0, 1, 1, 1, 1]
        );
    }

    #[test]
    fn another_workers_records_are_learnt_but_not_published_again() {
        let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let eps = [&owned[0], &owned[1]];
        let mut a = PrefixIndex::new(64);
        let mut b = PrefixIndex::new(64);
        a.record(eps[0].index_key(), &[1, 2], 10);
        a.record(eps[1].index_key(), &[1], 10);
        b.learn_groups(&a.take_outbox());
        assert_eq!(b.matched_entries(&keys_of(&eps), &[1, 2]), vec![2, 1]);
        assert!(b.take_outbox().is_empty());
        // A malformed tail is ignored, the groups before it kept.
        b.learn_groups(&[eps[1].index_key(), 20, 1, 2, 99, 5, 9]);
        assert_eq!(b.matched_entries(&keys_of(&eps), &[1, 2]), vec![2, 2]);
    }

    #[test]
    fn the_outbox_is_bounded() {
        let mut index = PrefixIndex::new(1 << 12);
        let hashes: Vec<u64> = (1..=OUTBOX_MAX_WORDS as u64).collect();
        index.record(1, &hashes, 0);
        index.record(2, &hashes, 0);
        let outbox = index.take_outbox();
        assert!(outbox.len() <= OUTBOX_MAX_WORDS, "{}", outbox.len());
        assert_eq!(outbox[..3], [1, 0, (OUTBOX_MAX_WORDS - 3) as u64]);
    }
}
