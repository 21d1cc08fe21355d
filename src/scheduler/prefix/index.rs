//! The prefix index: which endpoint likely holds which prompt block, learnt from our own
//! routing decisions and kept where every Envoy worker reads and updates it.
//!
//! The index is a fixed number of buckets (a block hash picks its bucket), each a small
//! binary record of at most [`ENTRIES_PER_BUCKET`] block hashes with up to
//! [`HOLDERS_PER_ENTRY`] endpoints each, stamped with when they were last routed there. A full
//! bucket evicts its least recently used block, so memory is bounded by the bucket count.
//! Buckets live in a [`BlockStore`]: proxy-wasm shared data in Envoy (updated with
//! compare-and-swap), [`MemoryStore`] natively.

use std::cell::RefCell;
use std::collections::HashMap;

use crate::snapshot::Endpoint;

/// Block hashes kept per bucket.
pub const ENTRIES_PER_BUCKET: usize = 8;
/// Endpoints remembered per block hash.
pub const HOLDERS_PER_ENTRY: usize = 4;
/// Attempts at a conditional bucket write before the update is dropped.
const WRITE_ATTEMPTS: usize = 8;
/// A block already recorded for the endpoint this recently is not written again: hot shared
/// prefixes cost one read per block instead of a read-modify-write.
const REFRESH_AFTER_MS: u64 = 1_000;

/// Storage for index buckets.
pub trait BlockStore {
    /// Number of buckets (> 0).
    fn buckets(&self) -> u32;
    /// A bucket's bytes (empty when never written) and a token for a conditional write.
    fn read(&self, bucket: u32) -> (Vec<u8>, Option<u32>);
    /// Writes a bucket unless it changed since `token` was read; `false` on a conflict.
    fn write(&self, bucket: u32, bytes: &[u8], token: Option<u32>) -> bool;
}

/// One remembered block.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    hash: u64,
    /// (endpoint key, last routed, ms since the Unix epoch)
    holders: Vec<(u64, u64)>,
}

impl Entry {
    fn last_used(&self) -> u64 {
        self.holders.iter().map(|h| h.1).max().unwrap_or(0)
    }
}

fn bucket_of(store: &dyn BlockStore, hash: u64) -> u32 {
    (hash % u64::from(store.buckets().max(1))) as u32
}

/// For each endpoint, how many of the request's blocks it holds, walking `hashes` in order and
/// stopping at the first block nobody holds (as upstream does). Counts per holder first (at
/// most [`HOLDERS_PER_ENTRY`] per block), then one binary search per endpoint: no work per
/// block and endpoint pair.
pub fn matched_blocks(
    store: &dyn BlockStore,
    endpoints: &[&Endpoint],
    hashes: &[u64],
) -> Vec<usize> {
    let mut per_holder: Vec<(u64, usize)> = Vec::new();
    for &hash in hashes {
        let (bytes, _) = store.read(bucket_of(store, hash));
        let Some(entry) = decode(&bytes).into_iter().find(|e| e.hash == hash) else {
            break;
        };
        for &(key, _) in &entry.holders {
            match per_holder.iter_mut().find(|(k, _)| *k == key) {
                Some((_, count)) => *count += 1,
                None => per_holder.push((key, 1)),
            }
        }
    }
    per_holder.sort_unstable();
    endpoints
        .iter()
        .map(|e| {
            per_holder
                .binary_search_by_key(&e.index_key(), |&(k, _)| k)
                .map_or(0, |i| per_holder[i].1)
        })
        .collect()
}

/// Records that `endpoint` was sent the blocks `hashes` at `now_unix_ms`.
pub fn record(store: &dyn BlockStore, endpoint: &Endpoint, hashes: &[u64], now_unix_ms: u64) {
    let key = endpoint.index_key();
    for &hash in hashes {
        let bucket = bucket_of(store, hash);
        for _ in 0..WRITE_ATTEMPTS {
            let (bytes, token) = store.read(bucket);
            let mut entries = decode(&bytes);
            if recently_recorded(&entries, hash, key, now_unix_ms) {
                break;
            }
            upsert(&mut entries, hash, key, now_unix_ms);
            if store.write(bucket, &encode(&entries), token) {
                break;
            }
        }
    }
}

fn recently_recorded(entries: &[Entry], hash: u64, key: u64, now: u64) -> bool {
    entries
        .iter()
        .filter(|e| e.hash == hash)
        .flat_map(|e| &e.holders)
        .any(|&(k, tick)| k == key && now.saturating_sub(tick) < REFRESH_AFTER_MS)
}

fn upsert(entries: &mut Vec<Entry>, hash: u64, key: u64, now: u64) {
    let index = match entries.iter().position(|e| e.hash == hash) {
        Some(i) => i,
        None => {
            if entries.len() >= ENTRIES_PER_BUCKET {
                if let Some(oldest) = (0..entries.len()).min_by_key(|&i| entries[i].last_used()) {
                    entries.swap_remove(oldest);
                }
            }
            entries.push(Entry {
                hash,
                holders: Vec::new(),
            });
            entries.len() - 1
        }
    };
    let holders = &mut entries[index].holders;
    if let Some(holder) = holders.iter_mut().find(|h| h.0 == key) {
        holder.1 = now;
        return;
    }
    if holders.len() >= HOLDERS_PER_ENTRY {
        if let Some(oldest) = (0..holders.len()).min_by_key(|&i| holders[i].1) {
            holders.swap_remove(oldest);
        }
    }
    holders.push((key, now));
}

/// Bucket layout: entry count (u8), then per entry: hash (u64), holder count (u8), then per
/// holder: key (u64), last used (u64); little-endian.
fn encode(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(1 + entries.len() * (9 + HOLDERS_PER_ENTRY * 16));
    out.push(entries.len() as u8);
    for entry in entries {
        out.extend_from_slice(&entry.hash.to_le_bytes());
        out.push(entry.holders.len() as u8);
        for (key, tick) in &entry.holders {
            out.extend_from_slice(&key.to_le_bytes());
            out.extend_from_slice(&tick.to_le_bytes());
        }
    }
    out
}

/// Decodes a bucket; anything malformed (or from another layout) decodes as far as it is
/// valid, so a bad bucket costs matches, never a trap.
fn decode(bytes: &[u8]) -> Vec<Entry> {
    let mut reader = Reader(bytes);
    let count = reader.u8().unwrap_or(0) as usize;
    let mut entries = Vec::with_capacity(count.min(ENTRIES_PER_BUCKET));
    for _ in 0..count.min(ENTRIES_PER_BUCKET) {
        let (Some(hash), Some(n)) = (reader.u64(), reader.u8()) else {
            break;
        };
        let mut holders = Vec::with_capacity(HOLDERS_PER_ENTRY);
        for _ in 0..(n as usize).min(HOLDERS_PER_ENTRY) {
            let (Some(key), Some(tick)) = (reader.u64(), reader.u64()) else {
                return entries;
            };
            holders.push((key, tick));
        }
        entries.push(Entry { hash, holders });
    }
    entries
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(first)
    }

    fn u64(&mut self) -> Option<u64> {
        let (head, rest) = self.0.split_at_checked(8)?;
        self.0 = rest;
        Some(u64::from_le_bytes(head.try_into().ok()?))
    }
}

/// An in-process [`BlockStore`] (native use and tests).
#[derive(Debug)]
pub struct MemoryStore {
    buckets: u32,
    data: RefCell<HashMap<u32, (Vec<u8>, u32)>>,
}

impl MemoryStore {
    /// A store with `buckets` buckets.
    pub fn new(buckets: u32) -> MemoryStore {
        MemoryStore {
            buckets: buckets.max(1),
            data: RefCell::new(HashMap::new()),
        }
    }
}

impl BlockStore for MemoryStore {
    fn buckets(&self) -> u32 {
        self.buckets
    }

    fn read(&self, bucket: u32) -> (Vec<u8>, Option<u32>) {
        match self.data.borrow().get(&bucket) {
            Some((bytes, version)) => (bytes.clone(), Some(*version)),
            None => (Vec::new(), None),
        }
    }

    fn write(&self, bucket: u32, bytes: &[u8], token: Option<u32>) -> bool {
        let mut data = self.data.borrow_mut();
        let current = data.get(&bucket).map(|(_, v)| *v);
        if current != token {
            return false;
        }
        data.insert(bucket, (bytes.to_vec(), current.map_or(1, |v| v + 1)));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn matches_blocks_and_stops_at_first_unknown() {
        let owned = [endpoint(1, 0, 0.0), endpoint(2, 0, 0.0)];
        let eps = [&owned[0], &owned[1]];
        let store = MemoryStore::new(64);
        record(&store, eps[0], &[1, 2, 3], 10);
        record(&store, eps[1], &[1, 9, 3], 10);
        // Every block before the first unknown one counts for each endpoint holding it.
        assert_eq!(matched_blocks(&store, &eps, &[1, 2, 3, 4]), vec![3, 2]);
        // Block 5 is held by nobody: the walk stops, block 3 does not count.
        assert_eq!(matched_blocks(&store, &eps, &[1, 5, 3]), vec![1, 1]);
        assert_eq!(matched_blocks(&store, &eps, &[7]), vec![0, 0]);
    }

    #[test]
    fn a_full_bucket_evicts_its_least_recently_used_block() {
        let owned = [endpoint(1, 0, 0.0)];
        let eps = [&owned[0]];
        let store = MemoryStore::new(1); // every hash in one bucket
        let hashes: Vec<u64> = (100..100 + ENTRIES_PER_BUCKET as u64).collect();
        for (t, &h) in hashes.iter().enumerate() {
            record(&store, eps[0], &[h], t as u64 * REFRESH_AFTER_MS);
        }
        record(&store, eps[0], &[hashes[0]], 50 * REFRESH_AFTER_MS); // refresh the oldest
        record(&store, eps[0], &[999], 60 * REFRESH_AFTER_MS); // evicts hashes[1], now the least recent
        assert_eq!(matched_blocks(&store, &eps, &[hashes[0]]), vec![1]);
        assert_eq!(matched_blocks(&store, &eps, &[hashes[1]]), vec![0]);
        assert_eq!(matched_blocks(&store, &eps, &[999]), vec![1]);
        assert_eq!(decode(&store.read(0).0).len(), ENTRIES_PER_BUCKET);
    }

    #[test]
    fn a_fresh_record_is_not_written_again() {
        let owned = [endpoint(1, 0, 0.0)];
        let store = MemoryStore::new(4);
        record(&store, &owned[0], &[7], 1_000);
        let token = store.read(bucket_of(&store, 7)).1;
        record(&store, &owned[0], &[7], 1_500);
        assert_eq!(
            store.read(bucket_of(&store, 7)).1,
            token,
            "rewritten within the refresh window"
        );
        record(&store, &owned[0], &[7], 2_000);
        assert_ne!(
            store.read(bucket_of(&store, 7)).1,
            token,
            "not refreshed after the window"
        );
    }

    #[test]
    fn holders_per_block_are_bounded() {
        let owned: Vec<_> = (1..=6).map(|i| endpoint(i, 0, 0.0)).collect();
        let eps: Vec<_> = owned.iter().collect();
        let store = MemoryStore::new(8);
        for (t, e) in eps.iter().enumerate() {
            record(&store, e, &[42], t as u64);
        }
        // The two least recently routed endpoints were forgotten.
        assert_eq!(matched_blocks(&store, &eps, &[42]), vec![0, 0, 1, 1, 1, 1]);
    }

    #[test]
    fn conflicting_writers_retry_and_nothing_is_lost() {
        struct Contended(MemoryStore, RefCell<u32>);
        impl BlockStore for Contended {
            fn buckets(&self) -> u32 {
                self.0.buckets()
            }
            fn read(&self, bucket: u32) -> (Vec<u8>, Option<u32>) {
                self.0.read(bucket)
            }
            fn write(&self, bucket: u32, bytes: &[u8], token: Option<u32>) -> bool {
                // Another worker writes first, twice.
                let mut left = self.1.borrow_mut();
                if *left > 0 {
                    *left -= 1;
                    let (other, t) = self.0.read(bucket);
                    self.0.write(bucket, &other, t);
                    return false;
                }
                self.0.write(bucket, bytes, token)
            }
        }
        let owned = [endpoint(1, 0, 0.0)];
        let store = Contended(MemoryStore::new(4), RefCell::new(2));
        record(&store, &owned[0], &[7], 1);
        assert_eq!(matched_blocks(&store, &[&owned[0]], &[7]), vec![1]);
    }

    #[test]
    fn malformed_buckets_decode_safely() {
        assert!(decode(&[]).is_empty());
        assert!(decode(&[3, 1, 2]).is_empty());
        let good = encode(&[Entry {
            hash: 5,
            holders: vec![(1, 2)],
        }]);
        assert_eq!(decode(&good).len(), 1);
        assert_eq!(decode(&good[..good.len() - 1]).len(), 0);
        let mut extra = good.clone();
        extra[0] = 200; // claims more entries than present
        assert_eq!(decode(&extra).len(), 1);
    }
}
