//! This Envoy's side of sharing prefix records with the other Envoy replicas, through the
//! controller's `/v1/prefix-records` (see the controller's `records` module).
//!
//! The poller (one per Envoy) registers [`crate::exchange::UPLINK_QUEUE`]; while the controller
//! says replicas share, each worker enqueues there the records its decisions made. The
//! poller's [`Uplink`] gathers them, drops what another worker of this Envoy already sent
//! within [`RESEND_AFTER_MS`], and uploads them in batches of at most [`MAX_BATCH_WORDS`], one
//! upload at a time (so batches grow with the load, and uploads do not). What the controller
//! sends back — the other replicas' records — goes to every worker
//! ([`crate::exchange::deliver_replica_records`]). Records are block hashes, endpoint keys (a
//! hash of address and port, the same in every replica) and times: never prompt text.

use crate::exchange::Message;

/// Most words in one upload (the controller's limit is 256 KiB).
pub const MAX_BATCH_WORDS: usize = 32 * 1024;
/// Most words waiting to be uploaded; beyond it new records are dropped (and counted).
pub const MAX_PENDING_WORDS: usize = 4 * MAX_BATCH_WORDS;
/// A block recorded for an endpoint is not uploaded again within this long.
pub const RESEND_AFTER_MS: u64 = 1_000;
/// Hashes per group, so that a group always fits in a batch.
const GROUP_HASHES: usize = 4_096;
/// Slots of the table of recently uploaded (block, endpoint) pairs.
const RECENT_SLOTS: usize = 8_192;

/// Records waiting to be uploaded; see the module docs.
#[derive(Debug)]
pub struct Uplink {
    /// Groups `[endpoint key, ms, n, hash × n]`.
    pending: Vec<u64>,
    /// (fingerprint of block and endpoint, ms) of recent uploads, by slot.
    recent: Vec<(u64, u64)>,
    /// Hashes dropped because [`MAX_PENDING_WORDS`] were waiting.
    dropped: u64,
}

impl Default for Uplink {
    fn default() -> Self {
        Uplink {
            pending: Vec::new(),
            recent: vec![(0, 0); RECENT_SLOTS],
            dropped: 0,
        }
    }
}

impl Uplink {
    /// An empty uplink.
    pub fn new() -> Uplink {
        Uplink::default()
    }

    /// Takes one worker's message from the uplink queue and keeps its records not uploaded
    /// within [`RESEND_AFTER_MS`]; returns how many hashes were kept. Anything malformed is
    /// ignored.
    pub fn add(&mut self, message: &[u8]) -> usize {
        let Some(message) = Message::decode(message) else {
            return 0;
        };
        let mut kept = 0;
        let mut rest = message.records.as_slice();
        while let [key, at, n, tail @ ..] = rest {
            let Some(hashes) = usize::try_from(*n).ok().and_then(|n| tail.get(..n)) else {
                break;
            };
            rest = &tail[hashes.len()..];
            let mut header = None;
            for &hash in hashes {
                if !self.fresh(*key, hash, *at) {
                    continue;
                }
                if self.pending.len() + 4 > MAX_PENDING_WORDS {
                    self.dropped += 1;
                    continue;
                }
                let start = match header {
                    Some(start) if self.pending[start + 2] < GROUP_HASHES as u64 => start,
                    _ => {
                        self.pending.extend_from_slice(&[*key, *at, 0]);
                        self.pending.len() - 3
                    }
                };
                header = Some(start);
                self.pending[start + 2] += 1;
                self.pending.push(hash);
                kept += 1;
            }
        }
        kept
    }

    /// Whether the pair was not uploaded within [`RESEND_AFTER_MS`] of `at`; notes it as
    /// uploaded at `at` if so.
    fn fresh(&mut self, key: u64, hash: u64, at: u64) -> bool {
        let fingerprint = hash ^ key.rotate_left(29);
        let slot = (fingerprint.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 51) as usize % RECENT_SLOTS;
        let (seen, seen_at) = self.recent[slot];
        if seen == fingerprint && at.saturating_sub(seen_at) < RESEND_AFTER_MS {
            return false;
        }
        self.recent[slot] = (fingerprint, at);
        true
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Forgets what waits (sharing was turned off).
    pub fn clear(&mut self) {
        self.pending.clear();
    }

    /// The next upload: whole groups, at most [`MAX_BATCH_WORDS`], as little-endian bytes
    /// (empty when nothing waits).
    pub fn take_batch(&mut self) -> Vec<u8> {
        let mut end = 0;
        while let Some(&n) = self.pending.get(end + 2) {
            let next = end + 3 + n as usize;
            if next > MAX_BATCH_WORDS || next > self.pending.len() {
                break;
            }
            end = next;
        }
        let batch = self
            .pending
            .drain(..end)
            .flat_map(u64::to_le_bytes)
            .collect();
        batch
    }
}

/// The words of a download's body (the other replicas' record groups); `None` unless it is a
/// whole number of words and at most `max_words` of them.
pub fn words(body: &[u8], max_words: usize) -> Option<Vec<u64>> {
    if body.len() % 8 != 0 || body.len() / 8 > max_words {
        return None;
    }
    Some(
        body.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Uplink {
        /// Hashes dropped so far because too many waited.
        fn dropped(&self) -> u64 {
            self.dropped
        }
    }

    /// A worker's uplink message carrying `records`.
    fn message(records: &[u64]) -> Vec<u8> {
        let mut out = Vec::new();
        Message {
            sender: "other-replicas".into(),
            records: records.to_vec(),
            ..Message::default()
        }
        .encode_into(&mut out);
        out
    }

    fn batch_words(uplink: &mut Uplink) -> Vec<u64> {
        words(&uplink.take_batch(), usize::MAX).unwrap()
    }

    #[test]
    fn records_are_batched_once_per_resend_window() {
        let mut uplink = Uplink::new();
        assert_eq!(uplink.add(&message(&[7, 1_000, 2, 11, 12])), 2);
        // Another worker of this Envoy sent the same blocks to the same endpoint: dropped.
        assert_eq!(uplink.add(&message(&[7, 1_200, 2, 11, 12])), 0);
        // A new block, or the same block to another endpoint, is kept.
        assert_eq!(
            uplink.add(&message(&[7, 1_300, 2, 12, 13, 8, 1_300, 1, 11])),
            2
        );
        assert_eq!(
            batch_words(&mut uplink),
            vec![7, 1_000, 2, 11, 12, 7, 1_300, 1, 13, 8, 1_300, 1, 11]
        );
        assert!(uplink.is_empty());
        // After the window the pair goes again, so the others refresh it.
        assert_eq!(uplink.add(&message(&[7, 2_000, 1, 11])), 1);
    }

    #[test]
    fn garbage_is_ignored() {
        let mut uplink = Uplink::new();
        assert_eq!(uplink.add(b"not a message"), 0);
        assert_eq!(
            uplink.add(&message(&[7, 1_000, 5, 11])),
            0,
            "claims more than it has"
        );
        assert!(uplink.is_empty());
        assert_eq!(words(b"1234567", 10), None);
        assert_eq!(words(&[0; 16], 1), None);
        assert_eq!(words(&[1, 0, 0, 0, 0, 0, 0, 0], 1), Some(vec![1]));
    }

    #[test]
    fn batches_and_waiting_records_are_bounded() {
        let mut uplink = Uplink::new();
        let mut records = vec![9, 5_000, 60_000];
        records.extend(1..=60_000u64);
        assert_eq!(uplink.add(&message(&records)), 60_000);
        let first = batch_words(&mut uplink);
        assert!(first.len() <= MAX_BATCH_WORDS);
        let mut seen = first.len();
        while !uplink.is_empty() {
            let batch = batch_words(&mut uplink);
            assert!(!batch.is_empty() && batch.len() <= MAX_BATCH_WORDS);
            seen += batch.len();
        }
        // 60,000 hashes in groups of at most GROUP_HASHES, each with a 3-word header.
        assert_eq!(seen, 60_000 + 3 * 60_000usize.div_ceil(GROUP_HASHES));
        let mut flood = vec![9, 6_000, 200_000];
        flood.extend(100_000..300_000u64);
        uplink.add(&message(&flood));
        let kept = uplink.pending.len();
        assert!(kept <= MAX_PENDING_WORDS, "{kept}");
        assert!(uplink.dropped() > 0);
        uplink.clear();
        assert!(uplink.is_empty());
    }
}
