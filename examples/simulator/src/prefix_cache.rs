//! The prefix cache: chained block hashes and a per-server LRU of them.
//!
//! A prompt is cut into full blocks of `block_size` tokens
//! (`block_size × 4` bytes). Block `i` is named by the hash of block `i - 1`'s
//! hash and block `i`'s bytes; the chain starts from the hash of the model
//! name, so the same text under another model (or LoRA adapter) shares
//! nothing. The cached prefix of a prompt is its leading run of blocks found
//! in the LRU.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};

use crate::tokens::BYTES_PER_TOKEN;

/// The chained hashes of the full blocks of `prompt` under model `model`.
pub fn block_hashes(model: &str, prompt: &[u8], block_size: u64) -> Vec<u64> {
    let block_bytes = usize::try_from(block_size)
        .unwrap_or(usize::MAX)
        .saturating_mul(BYTES_PER_TOKEN);
    let mut previous = hash_of(|h| model.hash(h));
    prompt
        .chunks_exact(block_bytes)
        .map(|block| {
            previous = hash_of(|h| {
                previous.hash(h);
                block.hash(h);
            });
            previous
        })
        .collect()
}

fn hash_of(feed: impl FnOnce(&mut DefaultHasher)) -> u64 {
    let mut hasher = DefaultHasher::new();
    feed(&mut hasher);
    hasher.finish()
}

/// A least-recently-used set of block hashes with a fixed capacity.
#[derive(Debug)]
pub struct PrefixCache {
    capacity: usize,
    clock: u64,
    /// Block hash → the clock value of its last use.
    last_use: HashMap<u64, u64>,
    /// Clock value → block hash, oldest first.
    by_age: BTreeMap<u64, u64>,
}

impl PrefixCache {
    /// An empty cache holding at most `capacity` blocks.
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            clock: 0,
            last_use: HashMap::new(),
            by_age: BTreeMap::new(),
        }
    }

    /// How many leading blocks of `hashes` are cached.
    pub fn cached_blocks(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.last_use.contains_key(h))
            .count()
    }

    /// Inserts (or refreshes) `hashes`, evicting the least recently used
    /// blocks beyond capacity. The chain is inserted tail first so that its
    /// head, which every longer prompt needs, is the last to be evicted.
    pub fn insert(&mut self, hashes: &[u64]) {
        for &hash in hashes.iter().rev() {
            self.clock += 1;
            if let Some(old) = self.last_use.insert(hash, self.clock) {
                self.by_age.remove(&old);
            }
            self.by_age.insert(self.clock, hash);
        }
        while self.last_use.len() > self.capacity {
            match self.by_age.pop_first() {
                Some((_, oldest)) => self.last_use.remove(&oldest),
                None => break,
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOCK: u64 = 16;

    fn text(blocks: usize, fill: char) -> String {
        fill.to_string()
            .repeat(blocks * BLOCK as usize * BYTES_PER_TOKEN)
    }

    #[test]
    fn only_full_blocks_are_hashed() {
        assert_eq!(block_hashes("m", text(3, 'a').as_bytes(), BLOCK).len(), 3);
        let partial = format!("{}xyz", text(2, 'a'));
        assert_eq!(block_hashes("m", partial.as_bytes(), BLOCK).len(), 2);
        assert!(block_hashes("m", b"short", BLOCK).is_empty());
    }

    #[test]
    fn hashes_are_chained() {
        // Same second block after different first blocks: different names.
        let a = block_hashes(
            "m",
            format!("{}{}", text(1, 'a'), text(1, 'z')).as_bytes(),
            BLOCK,
        );
        let b = block_hashes(
            "m",
            format!("{}{}", text(1, 'b'), text(1, 'z')).as_bytes(),
            BLOCK,
        );
        assert_ne!(a[1], b[1]);
    }

    #[test]
    fn same_prompt_twice_hits() {
        let mut cache = PrefixCache::new(100);
        let hashes = block_hashes("m", text(4, 'a').as_bytes(), BLOCK);
        assert_eq!(cache.cached_blocks(&hashes), 0);
        cache.insert(&hashes);
        assert_eq!(cache.cached_blocks(&hashes), 4);
    }

    #[test]
    fn shared_prefix_hits_up_to_the_divergence() {
        let mut cache = PrefixCache::new(100);
        cache.insert(&block_hashes(
            "m",
            format!("{}{}", text(2, 'a'), text(2, 'b')).as_bytes(),
            BLOCK,
        ));
        let other = block_hashes(
            "m",
            format!("{}{}", text(2, 'a'), text(2, 'c')).as_bytes(),
            BLOCK,
        );
        assert_eq!(cache.cached_blocks(&other), 2);
    }

    #[test]
    fn another_model_seed_misses() {
        let mut cache = PrefixCache::new(100);
        cache.insert(&block_hashes("base", text(4, 'a').as_bytes(), BLOCK));
        let other = block_hashes("adapter", text(4, 'a').as_bytes(), BLOCK);
        assert_eq!(cache.cached_blocks(&other), 0);
    }

    #[test]
    fn evicts_least_recently_used_beyond_capacity() {
        let mut cache = PrefixCache::new(4);
        let first = block_hashes("m", text(4, 'a').as_bytes(), BLOCK);
        let second = block_hashes("m", text(2, 'b').as_bytes(), BLOCK);
        cache.insert(&first);
        cache.insert(&second);
        // The tail of the older chain went first; its head survives.
        assert_eq!(cache.cached_blocks(&first), 2);
        assert_eq!(cache.cached_blocks(&second), 2);
    }
}
