//! The wire format of the workers' inboxes: a [`Message`] (sender, flags, in-flight counts,
//! prefix records) as little-endian 64-bit words, and the poller's fixed snapshot notice.

/// First word of a message (`"wasmepq"` and layout 2: in-flight entries of three words).
const MAGIC: u64 = u64::from_le_bytes(*b"wasmepq\x02");
/// Words per in-flight entry: endpoint key, requests, prefill bytes.
const ENTRY_WORDS: usize = 3;
/// The whole of a snapshot notice (`"wasmeps"` and layout 1).
pub(super) const SNAPSHOT_NOTICE: [u8; 8] = *b"wasmeps\x01";
/// Flag: the message's counts are the sender's whole table, not changes.
const WHOLE_TABLE: u64 = 1;
/// Flag: the sender is active (and wants every decision's records and counts at once).
const ACTIVE: u64 = 2;
/// Sender id of the other Envoy replicas' records (no worker id contains `-`).
pub(super) const REPLICAS_SENDER: &str = "other-replicas";

/// What a worker has in flight to one endpoint, or a change to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    /// Requests.
    pub requests: i64,
    /// Prompt bytes still to prefill.
    pub prefill_bytes: i64,
}

impl Counts {
    /// Adds `other`, field by field (saturating).
    pub fn add(&mut self, other: Counts) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prefill_bytes = self.prefill_bytes.saturating_add(other.prefill_bytes);
    }

    /// Takes `other` away, field by field (saturating).
    pub fn subtract(&mut self, other: Counts) {
        self.requests = self.requests.saturating_sub(other.requests);
        self.prefill_bytes = self.prefill_bytes.saturating_sub(other.prefill_bytes);
    }

    /// Both fields are zero.
    pub fn is_zero(&self) -> bool {
        *self == Counts::default()
    }
}

/// One message between workers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// The sender's worker id.
    pub sender: String,
    /// Whether `counts` is the sender's whole in-flight table (else changes to it).
    pub whole_table: bool,
    /// Whether the sender is active.
    pub active: bool,
    /// In-flight counts (or changes) by endpoint key.
    pub counts: Vec<(u64, Counts)>,
    /// Prefix record groups, in the form of
    /// [`PrefixIndex::outbox`](crate::scheduler::prefix::PrefixIndex::outbox).
    pub records: Vec<u64>,
}

impl Message {
    /// Writes the stored form into `out`, replacing its content (the workers call `encode` with
    /// borrowed parts instead).
    #[cfg(test)]
    pub(crate) fn encode_into(&self, out: &mut Vec<u8>) {
        encode(
            out,
            &self.sender,
            self.whole_table,
            self.active,
            &self.counts,
            &self.records,
        );
    }

    /// Decodes the stored form `encode` writes; `None` for anything else.
    pub fn decode(bytes: &[u8]) -> Option<Message> {
        if bytes.len() % 8 != 0 {
            return None;
        }
        let words: Vec<u64> = bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or_default()))
            .collect();
        let (&magic, rest) = words.split_first()?;
        let (&id_len, rest) = rest.split_first()?;
        if magic != MAGIC || id_len > 64 {
            return None;
        }
        let id_len = id_len as usize;
        let (id_words, rest) = rest.split_at_checked(id_len.div_ceil(8))?;
        let id_bytes: Vec<u8> = id_words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let sender = String::from_utf8(id_bytes[..id_len].to_vec()).ok()?;
        let (&flags, rest) = rest.split_first()?;
        let (&n, rest) = rest.split_first()?;
        let n = usize::try_from(n)
            .ok()
            .filter(|&n| n <= rest.len() / ENTRY_WORDS)?;
        let (entries, records) = rest.split_at(ENTRY_WORDS * n);
        Some(Message {
            sender,
            whole_table: flags & WHOLE_TABLE != 0,
            active: flags & ACTIVE != 0,
            counts: entries
                .chunks_exact(ENTRY_WORDS)
                .map(|e| {
                    let counts = Counts {
                        requests: e[1] as i64,
                        prefill_bytes: e[2] as i64,
                    };
                    (e[0], counts)
                })
                .collect(),
            records: records.to_vec(),
        })
    }
}

/// Writes a message from its parts into `out`, replacing its content (no other allocation:
/// a decision sends its records straight from the index's outbox).
pub(super) fn encode(
    out: &mut Vec<u8>,
    sender: &str,
    whole_table: bool,
    active: bool,
    counts: &[(u64, Counts)],
    records: &[u64],
) {
    out.clear();
    let id = sender.as_bytes();
    out.reserve((5 + id.len().div_ceil(8) + ENTRY_WORDS * counts.len() + records.len()) * 8);
    let mut put = |word: u64| out.extend_from_slice(&word.to_le_bytes());
    put(MAGIC);
    put(id.len() as u64);
    for chunk in id.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        put(u64::from_le_bytes(word));
    }
    let flag = |on: bool, bit: u64| if on { bit } else { 0 };
    put(flag(whole_table, WHOLE_TABLE) | flag(active, ACTIVE));
    put(counts.len() as u64);
    for &(key, count) in counts {
        put(key);
        put(count.requests as u64);
        put(count.prefill_bytes as u64);
    }
    records.iter().for_each(|&w| put(w));
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn messages_round_trip_and_garbage_is_refused() {
        let message = Message {
            sender: "12.345678901".to_string(),
            whole_table: true,
            active: true,
            counts: vec![
                (
                    1,
                    Counts {
                        requests: 2,
                        prefill_bytes: 4_096,
                    },
                ),
                (
                    3,
                    Counts {
                        requests: -4,
                        prefill_bytes: -7,
                    },
                ),
            ],
            records: vec![9, 8, 1, 5],
        };
        let mut bytes = Vec::new();
        message.encode_into(&mut bytes);
        assert_eq!(Message::decode(&bytes), Some(message));
        assert_eq!(Message::decode(&bytes[1..]), None);
        assert_eq!(Message::decode(b"not a message!!!"), None);
        assert_eq!(Message::decode(&[]), None);
        let mut huge = bytes.clone();
        huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes()); // claims a 2^64-byte id
        assert_eq!(Message::decode(&huge), None);
        let mut counts = bytes.clone();
        counts[40..48].copy_from_slice(&u64::MAX.to_le_bytes()); // claims 2^64 counts
        assert_eq!(Message::decode(&counts), None);
    }
}
