//! The prefix-record exchange between Envoy replicas (`/v1/prefix-records` on `--listen`).
//!
//! Each Envoy's poller uploads the prefix records its workers made (which endpoint was sent
//! which prompt blocks; block hashes and endpoint keys only, never prompt text) and long-polls
//! for the records of every *other* replica, which it hands to its workers' indexes. So every
//! replica's index learns from every replica's decisions about one round trip later.
//!
//! - `POST /v1/prefix-records?replica=R` with a body of little-endian 64-bit words in groups
//!   `[endpoint key, unix ms, n, hash × n]` → 204, or 400 (malformed), 413 (over
//!   [`MAX_BATCH_BYTES`]) or 429 (over the replica's rate), each refusal logged with the
//!   replica's id (at most one line per replica per [`LOG_EVERY`], with the count since).
//! - `GET /v1/prefix-records?replica=R&since=C&instance=I&share=S&wait_ms=W` → 200 with the
//!   other replicas' batches after cursor `C` (at most [`MAX_ANSWER_BYTES`]), held up to `W` ms
//!   (capped by `--long-poll-max`) while there are none and the replica's idea of sharing
//!   (`S`, `0` or `1`; absent: none yet) is right, else 304. A cursor from another
//!   controller instance (`I`) starts from the oldest batch kept, so a new replica, or one
//!   whose controller restarted, warms its index from what the others learnt. Instead of
//!   `since` and `instance`, `cursors=I1:C1,I2:C2…` names the cursor held for each controller
//!   replica (behind a Service, either may answer); the answering one takes its own.
//!
//! An upload relayed by a peer controller (`&relay=<origin instance>`, see [`crate::peers`]) is
//! kept like any other but not relayed again; one this controller relayed itself is ignored.
//!
//! Every answer carries [`CURSOR_HEADER`], the controller's instance in
//! [`crate::serve::INSTANCE_HEADER`], and [`SHARE_HEADER`]: `1` while sharing is worth its cost
//! (at least two replicas polled within [`LIVE_FOR`], or controller peers are configured), so a
//! lone replica's workers send nothing.
//!
//! Everything is bounded: a batch, an answer, each replica's log ([`REPLICA_LOG_BYTES`], its
//! oldest batches dropped first), the number of replicas ([`MAX_REPLICAS`], the longest silent
//! forgotten first) and each replica's upload rate (a token bucket of [`RATE_BYTES_PER_S`]), so
//! a replica that floods fills only its own log and cannot delay the others' records beyond
//! its fair share of an answer.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use thiserror::Error;
use tokio::sync::{broadcast, watch};

/// Where the exchange is served.
pub const PATH: &str = "/v1/prefix-records";
/// Response header: the cursor to send as `since` next time.
pub const CURSOR_HEADER: &str = "x-records-cursor";
/// Response header: `1` while replicas should share their records, else `0`.
pub const SHARE_HEADER: &str = "x-records-share";
/// Largest upload accepted (32,768 words: the records of a prompt of about 2 M tokens).
pub const MAX_BATCH_BYTES: usize = 256 * 1024;
/// Most bytes of batches in one answer (a batch never exceeds it, so one always fits).
pub const MAX_ANSWER_BYTES: usize = MAX_BATCH_BYTES;
/// Bytes of batches kept per replica.
pub const REPLICA_LOG_BYTES: usize = 512 * 1024;
/// Replicas remembered; the log's memory is at most this times [`REPLICA_LOG_BYTES`].
pub const MAX_REPLICAS: usize = 64;
/// Sustained upload rate per replica; bursts up to [`MAX_BATCH_BYTES`] twice over.
pub const RATE_BYTES_PER_S: f64 = 1024.0 * 1024.0;
/// A replica that has not polled or uploaded for this long no longer counts as live.
pub const LIVE_FOR: Duration = Duration::from_secs(30);
/// Refusals of one replica are logged at most once per this period.
pub const LOG_EVERY: Duration = Duration::from_secs(10);
/// Longest replica id accepted.
const MAX_REPLICA_ID: usize = 64;

/// Why an upload was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Refusal {
    /// The replica id is missing or not `[A-Za-z0-9._-]{1,64}`.
    #[error("the replica query parameter must be 1 to 64 characters of [A-Za-z0-9._-]")]
    BadReplica,
    /// The body is not whole record groups.
    #[error("malformed records: {0}")]
    Malformed(String),
    /// The body is larger than [`MAX_BATCH_BYTES`].
    #[error("a batch of {0} bytes or more is over the limit of {MAX_BATCH_BYTES} bytes")]
    TooLarge(usize),
    /// The replica uploads faster than [`RATE_BYTES_PER_S`].
    #[error("over the upload rate of {RATE_BYTES_PER_S} bytes/s")]
    RateLimited,
}

/// Checks that `body` is whole record groups `[key, ms, n, hash × n]` with `n ≥ 1`.
pub fn validate(body: &[u8]) -> Result<(), Refusal> {
    if body.len() > MAX_BATCH_BYTES {
        return Err(Refusal::TooLarge(body.len()));
    }
    if body.is_empty() || !body.len().is_multiple_of(8) {
        return Err(Refusal::Malformed(format!(
            "{} bytes is not a positive whole number of 64-bit words",
            body.len()
        )));
    }
    let words = body.len() / 8;
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&body[i * 8..i * 8 + 8]);
        u64::from_le_bytes(w)
    };
    let mut at = 0;
    while at < words {
        if at + 3 > words {
            return Err(Refusal::Malformed(format!("truncated group at word {at}")));
        }
        let n = word(at + 2);
        let end = usize::try_from(n)
            .ok()
            .filter(|&n| n >= 1)
            .and_then(|n| (at + 3).checked_add(n))
            .filter(|&end| end <= words)
            .ok_or_else(|| Refusal::Malformed(format!("group at word {at} claims {n} hashes")))?;
        at = end;
    }
    Ok(())
}

/// The cursor held for controller `instance` in a `cursors` list (`I1:C1,I2:C2…`), if any.
pub fn cursor_of(list: &str, instance: &str) -> Option<u64> {
    list.split(',')
        .filter_map(|pair| pair.split_once(':'))
        .find(|(i, _)| *i == instance)
        .and_then(|(_, cursor)| cursor.parse().ok())
}

/// Whether `id` is an acceptable replica id.
fn valid_replica(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REPLICA_ID
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// One replica's side of the log.
#[derive(Debug)]
struct Replica {
    /// Its batches, oldest first, by sequence number.
    batches: VecDeque<(u64, Bytes)>,
    bytes: usize,
    /// Upload allowance in bytes, refilled at [`RATE_BYTES_PER_S`].
    allowance: f64,
    refilled: Instant,
    heard: Instant,
    /// Refusals not logged yet, and when one was last logged.
    unlogged: u64,
    logged: Option<Instant>,
}

impl Replica {
    fn new(now: Instant) -> Replica {
        Replica {
            batches: VecDeque::new(),
            bytes: 0,
            allowance: 2.0 * MAX_BATCH_BYTES as f64,
            refilled: now,
            heard: now,
            unlogged: 0,
            logged: None,
        }
    }
}

#[derive(Debug, Default)]
struct Inner {
    /// The last sequence number given to a batch.
    seq: u64,
    replicas: HashMap<String, Replica>,
}

impl Inner {
    /// The replica `id`, remembered from now on (forgetting the longest silent one if full).
    fn replica(&mut self, id: &str, now: Instant) -> &mut Replica {
        if !self.replicas.contains_key(id) && self.replicas.len() >= MAX_REPLICAS {
            if let Some(oldest) = self
                .replicas
                .iter()
                .min_by_key(|(_, r)| r.heard)
                .map(|(id, _)| id.clone())
            {
                self.replicas.remove(&oldest);
            }
        }
        let replica = self
            .replicas
            .entry(id.to_string())
            .or_insert_with(|| Replica::new(now));
        replica.heard = now;
        replica
    }
}

/// Counts a refusal of `replica`'s upload; with it, whether to log it now (`Some(refusals
/// since the last line)`, at most once per [`LOG_EVERY`]).
fn refused(replica: &mut Replica, refusal: Refusal, now: Instant) -> (Refusal, Option<u64>) {
    replica.unlogged += 1;
    let due = replica
        .logged
        .is_none_or(|at| now.saturating_duration_since(at) >= LOG_EVERY);
    if !due {
        return (refusal, None);
    }
    replica.logged = Some(now);
    (refusal, Some(std::mem::take(&mut replica.unlogged)))
}

/// One batch a local Envoy uploaded, to relay to the peer controllers ([`crate::peers`]).
#[derive(Debug, Clone)]
pub struct Batch {
    /// The uploading Envoy replica's id.
    pub replica: String,
    /// The records, as uploaded.
    pub body: Bytes,
}

/// What a download gets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The batches, concatenated (empty when there were none).
    pub body: Bytes,
    /// The cursor to send next time.
    pub cursor: u64,
    /// Whether replicas should share their records.
    pub share: bool,
}

/// The controller's record log; see the module docs.
#[derive(Debug)]
pub struct RecordLog {
    inner: Mutex<Inner>,
    /// The last sequence number, for waiting downloads.
    latest: watch::Sender<u64>,
    instance: String,
    /// Where local uploads go to be relayed to the peer controllers, if there are any (then
    /// replicas share even with one local replica).
    relay: Option<broadcast::Sender<Batch>>,
}

impl RecordLog {
    /// An empty log of the controller instance `instance`, relaying local uploads to `relay`.
    pub fn new(instance: &str, relay: Option<broadcast::Sender<Batch>>) -> RecordLog {
        RecordLog {
            inner: Mutex::default(),
            latest: watch::channel(0).0,
            instance: instance.to_string(),
            relay,
        }
    }

    /// The controller instance this log belongs to.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // The log holds no invariant a panicking holder could break halfway.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Appends `body` from `replica` at `now` after checking it, and relays it to the peers
    /// unless it came from one (`relayed_from`, the origin controller's instance); the
    /// refusal otherwise, and whether to log it now (`Some(refusals since the last line)`).
    /// Returns the batch's sequence number (0 for this controller's own relay, not kept).
    pub fn append(
        &self,
        replica: &str,
        body: Bytes,
        relayed_from: Option<&str>,
        now: Instant,
    ) -> Result<u64, (Refusal, Option<u64>)> {
        if !valid_replica(replica) {
            return Err((Refusal::BadReplica, Some(1)));
        }
        if relayed_from == Some(self.instance.as_str()) {
            return Ok(0);
        }
        let mut inner = self.lock();
        let checked = validate(&body);
        let seq = inner.seq + 1;
        let entry = inner.replica(replica, now);
        let elapsed = now.saturating_duration_since(entry.refilled).as_secs_f64();
        entry.allowance =
            (entry.allowance + elapsed * RATE_BYTES_PER_S).min(2.0 * MAX_BATCH_BYTES as f64);
        entry.refilled = now;
        let checked = checked.and_then(|()| {
            if entry.allowance < body.len() as f64 {
                Err(Refusal::RateLimited)
            } else {
                Ok(())
            }
        });
        if let Err(refusal) = checked {
            return Err(refused(entry, refusal, now));
        }
        entry.allowance -= body.len() as f64;
        entry.bytes += body.len();
        entry.batches.push_back((seq, body.clone()));
        while entry.bytes > REPLICA_LOG_BYTES {
            match entry.batches.pop_front() {
                Some((_, dropped)) => entry.bytes -= dropped.len(),
                None => break,
            }
        }
        inner.seq = seq;
        drop(inner);
        self.latest.send_replace(seq);
        if let (Some(relay), None) = (&self.relay, relayed_from) {
            // No peer task listening (yet) is not an error: nothing to relay to.
            let _ = relay.send(Batch {
                replica: replica.to_string(),
                body,
            });
        }
        Ok(seq)
    }

    /// Notes an upload from `replica` refused before it could be read whole (over
    /// [`MAX_BATCH_BYTES`]), as [`append`](Self::append) notes its own refusals.
    pub fn refuse(&self, replica: &str, refusal: Refusal, now: Instant) -> (Refusal, Option<u64>) {
        if !valid_replica(replica) {
            return (Refusal::BadReplica, Some(1));
        }
        refused(self.lock().replica(replica, now), refusal, now)
    }

    /// The batches of replicas other than `replica` after `cursor`, oldest first, up to
    /// [`MAX_ANSWER_BYTES`]; notes that `replica` is live.
    pub fn since(&self, replica: &str, cursor: u64, now: Instant) -> Answer {
        let mut inner = self.lock();
        if valid_replica(replica) {
            let new = !inner.replicas.contains_key(replica);
            inner.replica(replica, now);
            if new {
                // Waiting replicas learn at once that sharing may have become worth it.
                self.latest.send_replace(inner.seq);
            }
        }
        let mut found: Vec<&(u64, Bytes)> = inner
            .replicas
            .iter()
            .filter(|(id, _)| id.as_str() != replica)
            .flat_map(|(_, r)| r.batches.iter().filter(|(seq, _)| *seq > cursor))
            .collect();
        found.sort_unstable_by_key(|(seq, _)| *seq);
        let mut body = BytesMut::new();
        let mut last = None;
        for (seq, batch) in found {
            if body.len() + batch.len() > MAX_ANSWER_BYTES {
                break;
            }
            body.put_slice(batch);
            last = Some(*seq);
        }
        let live = inner
            .replicas
            .values()
            .filter(|r| now.saturating_duration_since(r.heard) < LIVE_FOR)
            .count();
        Answer {
            body: body.freeze(),
            // With nothing to give, skip to the head (past this replica's own batches).
            cursor: last.unwrap_or(inner.seq.max(cursor)),
            share: self.relay.is_some() || live >= 2,
        }
    }

    /// Like [`since`](Self::since), but waits up to `wait` while there is nothing to give and
    /// `shares` (what the replica believes) is what the answer would say. A cursor of another
    /// instance (`instance` not this log's) starts from the oldest batch.
    pub async fn wait_since(
        &self,
        replica: &str,
        cursor: u64,
        instance: Option<&str>,
        shares: Option<bool>,
        wait: Duration,
    ) -> Answer {
        let cursor = match instance {
            Some(i) if i == self.instance => cursor,
            _ => 0,
        };
        let deadline = tokio::time::Instant::now() + wait;
        let mut latest = self.latest.subscribe();
        loop {
            let answer = self.since(replica, cursor, Instant::now());
            if !answer.body.is_empty() || shares != Some(answer.share) {
                return answer;
            }
            match tokio::time::timeout_at(deadline, latest.changed()).await {
                Ok(Ok(())) => continue,
                _ => return answer,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words in the upload form.
    fn words(words: &[u64]) -> Bytes {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    #[test]
    fn only_whole_groups_pass() {
        assert_eq!(
            validate(&words(&[7, 1000, 2, 11, 12, 8, 1000, 1, 13])),
            Ok(())
        );
        for bad in [
            words(&[]),
            words(&[7, 1000]),
            words(&[7, 1000, 3, 11, 12]),
            words(&[7, 1000, 0]),
            words(&[7, 1000, u64::MAX, 1]),
        ] {
            assert!(
                matches!(validate(&bad), Err(Refusal::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(validate(&[0u8; 12]), Err(Refusal::Malformed(_))));
        let huge = vec![0u8; MAX_BATCH_BYTES + 8];
        assert_eq!(validate(&huge), Err(Refusal::TooLarge(MAX_BATCH_BYTES + 8)));
    }

    #[test]
    fn a_cursor_list_names_each_controllers_cursor() {
        assert_eq!(cursor_of("aa:3,bb:17", "bb"), Some(17));
        assert_eq!(cursor_of("aa:3,bb:17", "cc"), None);
        assert_eq!(cursor_of("aa:x,garbage", "aa"), None);
        assert_eq!(cursor_of("", "aa"), None);
    }

    #[test]
    fn a_replica_gets_the_others_batches_not_its_own() {
        let log = RecordLog::new("i", None);
        let now = Instant::now();
        let a = words(&[1, 5, 1, 100]);
        let b = words(&[2, 6, 1, 200]);
        log.append("a", a.clone(), None, now).unwrap();
        log.append("b", b.clone(), None, now).unwrap();
        let for_a = log.since("a", 0, now);
        assert_eq!(for_a.body, b);
        assert_eq!(for_a.cursor, 2);
        assert!(for_a.share, "two live replicas share");
        let for_b = log.since("b", 0, now);
        assert_eq!(for_b.body, a);
        assert_eq!(for_b.cursor, 1);
        // Nothing new: the cursor moves to the head, past the replica's own batch.
        let again = log.since("b", for_b.cursor, now);
        assert!(again.body.is_empty());
        assert_eq!(again.cursor, 2);
        // A third replica starting from 0 gets both, in order.
        let c = log.since("c", 0, now);
        assert_eq!(&c.body[..], &[a, b].concat()[..]);
    }

    #[test]
    fn a_lone_replica_is_told_not_to_share_unless_there_are_peers() {
        let now = Instant::now();
        let alone = RecordLog::new("i", None);
        assert!(!alone.since("a", 0, now).share);
        let later = now + LIVE_FOR + Duration::from_secs(1);
        alone.since("b", 0, now);
        assert!(alone.since("a", 0, now).share);
        assert!(!alone.since("a", 0, later).share, "b went silent");
        assert!(
            RecordLog::new("i", Some(broadcast::channel(4).0))
                .since("a", 0, now)
                .share
        );
    }

    #[test]
    fn refusals_are_counted_and_logged_at_most_once_per_period() {
        let log = RecordLog::new("i", None);
        let now = Instant::now();
        let garbage = Bytes::from_static(b"not words");
        assert!(matches!(
            log.append("bad", garbage.clone(), None, now),
            Err((Refusal::Malformed(_), Some(1)))
        ));
        assert!(matches!(
            log.append("bad", garbage.clone(), None, now),
            Err((_, None))
        ));
        let later = now + LOG_EVERY;
        assert!(matches!(
            log.append("bad", garbage, None, later),
            Err((_, Some(2)))
        ));
        assert_eq!(
            log.append("no spaces", words(&[1, 1, 1, 1]), None, now)
                .unwrap_err()
                .0,
            Refusal::BadReplica
        );
        assert!(
            log.since("x", 0, now).body.is_empty(),
            "nothing refused was kept"
        );
    }

    #[test]
    fn a_flooding_replica_is_rate_limited_and_bounded() {
        let log = RecordLog::new("i", None);
        let now = Instant::now();
        let group = |hash: u64| {
            let mut w = vec![1, 1, (MAX_BATCH_BYTES / 8 - 3) as u64];
            w.extend((0..MAX_BATCH_BYTES / 8 - 3).map(|i| hash + i as u64));
            words(&w)
        };
        assert!(log.append("flood", group(1), None, now).is_ok());
        assert!(log.append("flood", group(2), None, now).is_ok());
        assert_eq!(
            log.append("flood", group(3), None, now).unwrap_err().0,
            Refusal::RateLimited
        );
        // A second later the bucket allows four more batches' worth; the log keeps two.
        let mut t = now;
        for i in 0..8 {
            t += Duration::from_millis(250);
            let _ = log.append("flood", group(10 + i), None, t);
        }
        let kept = log.lock().replicas["flood"].bytes;
        assert!(kept <= REPLICA_LOG_BYTES, "{kept}");
        // A quiet replica's batch still reaches the others, in the first answer after it.
        let quiet = words(&[9, 9, 1, 99]);
        let seq = log.append("quiet", quiet.clone(), None, t).unwrap();
        let answer = log.since("reader", seq - 1, t);
        assert_eq!(answer.body, quiet);
        // An answer never exceeds its bound.
        assert!(log.since("reader", 0, t).body.len() <= MAX_ANSWER_BYTES);
    }

    #[test]
    fn local_uploads_are_relayed_and_relayed_ones_are_kept_but_not_relayed_again() {
        let (relay, mut relayed) = broadcast::channel(4);
        let log = RecordLog::new("me", Some(relay));
        let now = Instant::now();
        let batch = words(&[1, 1, 1, 7]);
        log.append("a", batch.clone(), None, now).unwrap();
        let sent = relayed.try_recv().expect("relayed");
        assert_eq!((sent.replica.as_str(), &sent.body), ("a", &batch));
        // From a peer: kept for the local replicas, not relayed on.
        let theirs = words(&[2, 2, 1, 8]);
        log.append("far", theirs.clone(), Some("peer"), now)
            .unwrap();
        assert!(relayed.try_recv().is_err());
        assert_eq!(log.since("b", 1, now).body, theirs);
        // Its own relay coming back (a DNS peer list includes itself): ignored.
        assert_eq!(log.append("a", batch, Some("me"), now), Ok(0));
        assert!(log.since("b", 2, now).body.is_empty());
        assert!(relayed.try_recv().is_err());
    }

    #[test]
    fn replicas_are_bounded_in_number() {
        let log = RecordLog::new("i", None);
        let start = Instant::now();
        for i in 0..MAX_REPLICAS + 10 {
            let at = start + Duration::from_millis(i as u64);
            log.append(&format!("r{i}"), words(&[1, 1, 1, i as u64 + 1]), None, at)
                .unwrap();
        }
        let inner = log.lock();
        assert_eq!(inner.replicas.len(), MAX_REPLICAS);
        assert!(
            !inner.replicas.contains_key("r0"),
            "the longest silent went first"
        );
    }

    /// Replica `a` waiting (up to 5 s) for records after cursor 0, believing it shares nothing.
    fn wait_as_a(log: &std::sync::Arc<RecordLog>) -> tokio::task::JoinHandle<Answer> {
        let log = log.clone();
        tokio::spawn(async move {
            log.wait_since("a", 0, Some("i"), Some(false), Duration::from_secs(5))
                .await
        })
    }

    #[tokio::test]
    async fn a_download_waits_for_another_replicas_batch() {
        let log = std::sync::Arc::new(RecordLog::new("i", None));
        let waiting = wait_as_a(&log);
        tokio::time::sleep(Duration::from_millis(50)).await;
        log.append("a", words(&[1, 1, 1, 1]), None, Instant::now())
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished(), "its own batch does not answer it");
        let b = words(&[2, 2, 1, 2]);
        log.append("b", b.clone(), None, Instant::now()).unwrap();
        let answer = waiting.await.unwrap();
        assert_eq!(answer.body, b);
        assert_eq!(answer.cursor, 2);
        assert!(answer.share);
        let none = log
            .wait_since("a", 2, Some("i"), Some(true), Duration::from_millis(20))
            .await;
        assert!(none.body.is_empty());
        // Another instance's cursor starts over.
        let restarted = log
            .wait_since("a", 2, Some("other"), Some(true), Duration::from_millis(20))
            .await;
        assert_eq!(restarted.body, b);
    }

    #[tokio::test]
    async fn a_waiting_replica_is_told_at_once_when_a_second_one_appears() {
        let log = std::sync::Arc::new(RecordLog::new("i", None));
        // Without an idea of sharing yet, the answer comes at once.
        let first = log
            .wait_since("a", 0, None, None, Duration::from_secs(5))
            .await;
        assert!(!first.share);
        let waiting = wait_as_a(&log);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiting.is_finished());
        log.since("b", 0, Instant::now());
        let answer = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("answered when b appeared")
            .unwrap();
        assert!(answer.share && answer.body.is_empty());
    }
}
