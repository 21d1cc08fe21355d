//! Flow control inside the proxy (upstream's `flowControl` feature gate): while the pool is
//! saturated, requests wait in this worker's queue, one band per priority, instead of being
//! sent to overloaded servers; they are released highest band first, in the band's
//! [`Ordering`] (oldest first by default), as capacity frees; a request that waits past its
//! TTL, or that the bounded queue has no room for, is answered with upstream's error.
//!
//! Plain Rust: the shim parks the streams and resumes them. What is pool-wide:
//! - *saturation* comes from the snapshot's metrics, which every worker shares, or with a
//!   `concurrency-detector` from the proxy's in-flight counts, which every worker keeps;
//! - *priority* across workers: each worker publishes its waiting bands on a small board in
//!   shared data ([`Board`], one key, written when its bands change and refreshed while it
//!   waits); a worker releases a band only when no other worker has a higher one waiting;
//! - *capacity limits* count this worker's queue plus what the others published.
//!
//! Between two snapshots the metrics cannot see the requests just released, so each release
//! is assumed to wait in its server's queue until the next snapshot (or until it finishes):
//! the estimate keeps one refresh from releasing the whole queue at once (upstream releases
//! on its scraped metrics alone).

pub mod shortest_job_first_ordering_policy;

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};

use self::shortest_job_first_ordering_policy::SjfParams;

use crate::errors::InferenceError;
use crate::shared_data::SharedStore;

/// The compiled `flowControl` section (present only when the `flowControl` gate is on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FlowControl {
    /// Requests waiting at most, all bands together (0: unlimited).
    pub max_requests: u64,
    /// Body bytes waiting at most, all bands together (0: unlimited).
    pub max_bytes: u64,
    /// How long a request may wait while the pool has endpoints, ms (0: no limit).
    pub default_request_ttl_ms: u64,
    /// How long a request may wait while the pool has none, ms (0: no limit).
    pub no_endpoint_request_ttl_ms: u64,
    /// Limits of the bands configured by priority.
    pub priority_bands: Vec<BandLimits>,
    /// Limits of a band for a priority ≥ 0 not configured.
    pub default_band: BandLimits,
    /// Limits of a band for a priority < 0 not configured.
    pub default_negative_band: BandLimits,
    /// Requests are released while the pool saturation is below this ceiling
    /// (`static-usage-limit-policy`'s `threshold`).
    pub usage_threshold: f64,
}

impl Default for FlowControl {
    fn default() -> FlowControl {
        FlowControl {
            max_requests: 0,
            max_bytes: 0,
            default_request_ttl_ms: 60_000,
            no_endpoint_request_ttl_ms: 60_000,
            priority_bands: Vec::new(),
            default_band: BandLimits::default(),
            default_negative_band: BandLimits::default(),
            usage_threshold: 1.0,
        }
    }
}

/// One band's limits and ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct BandLimits {
    /// The band's priority (ignored for the default band).
    pub priority: i32,
    /// Requests waiting at most (0: unlimited).
    pub max_requests: u64,
    /// Body bytes waiting at most (0: unlimited).
    pub max_bytes: u64,
    /// Which waiting request of the band goes next.
    pub ordering: Ordering,
}

/// A band's ordering policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Ordering {
    /// `fcfs-ordering-policy`: oldest first.
    #[default]
    #[serde(rename = "fcfs-ordering-policy")]
    Fcfs,
    /// `shortest-job-first-ordering-policy`: earliest arrival plus expected decode time first.
    #[serde(rename = "shortest-job-first-ordering-policy")]
    ShortestJobFirst(SjfParams),
}

impl Default for BandLimits {
    fn default() -> BandLimits {
        BandLimits {
            priority: 0,
            max_requests: 5_000,
            max_bytes: 1_000_000_000,
            ordering: Ordering::Fcfs,
        }
    }
}

impl FlowControl {
    /// The limits of the band for `priority`.
    pub fn band(&self, priority: i32) -> BandLimits {
        self.priority_bands
            .iter()
            .find(|b| b.priority == priority)
            .copied()
            .unwrap_or(BandLimits {
                priority,
                ..if priority < 0 {
                    self.default_negative_band
                } else {
                    self.default_band
                }
            })
    }
}

/// `x-llm-d-request-dropped-reason` of a request whose TTL ran out.
pub const TTL_EXPIRED: &str = "rejected-ttl-expired";
/// `x-llm-d-request-dropped-reason` of a request the queue had no room for.
pub const SATURATED: &str = "rejected-saturated";

/// One waiting request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    /// The stream's context id.
    pub id: u32,
    /// When it started waiting, ms since the Unix epoch.
    pub since_ms: u64,
    /// Its body's size.
    pub bytes: u64,
    /// When it would finish had it started on arrival, ms since the Unix epoch
    /// ([`shortest_job_first_ordering_policy::finish_by_ms`]).
    pub finish_by_ms: u64,
}

#[derive(Debug, Default)]
struct Band {
    waiting: VecDeque<Waiting>,
    bytes: u64,
}

/// What one worker has waiting, per priority: `(priority, requests, bytes)`.
pub type Summary = Vec<(i32, u64, u64)>;

/// One worker's waiting requests, a FIFO per priority band.
#[derive(Debug, Default)]
pub struct FlowQueue {
    bands: BTreeMap<i32, Band>,
    /// Requests released from the queue since the metrics last changed, not finished yet.
    released_unseen: u64,
    /// The bands changed since the board last heard.
    changed: bool,
}

impl FlowQueue {
    /// Nothing waits here.
    pub fn is_empty(&self) -> bool {
        self.bands.is_empty()
    }

    /// The highest priority waiting here.
    pub fn top(&self) -> Option<i32> {
        self.bands.keys().next_back().copied()
    }

    /// Requests waiting here per priority, with their bytes.
    pub fn summary(&self) -> Summary {
        self.bands
            .iter()
            .map(|(&p, b)| (p, b.waiting.len() as u64, b.bytes))
            .collect()
    }

    /// Queues `waiting` at `priority`, unless that would pass a limit of `config` counting
    /// what `others` (the other workers) have waiting: then the 429 to answer.
    pub fn enqueue(
        &mut self,
        config: &FlowControl,
        others: &Summary,
        priority: i32,
        waiting: Waiting,
    ) -> Result<(), InferenceError> {
        let limits = config.band(priority);
        let band = self.bands.get(&priority);
        let (band_requests, band_bytes) =
            band.map_or((0, 0), |b| (b.waiting.len() as u64, b.bytes));
        let (other_band_requests, other_band_bytes) = others
            .iter()
            .filter(|(p, _, _)| *p == priority)
            .fold((0, 0), |(r, b), (_, rr, bb)| (r + rr, b + bb));
        let (mine_requests, mine_bytes) = self.bands.values().fold((0, 0), |(r, b), band| {
            (r + band.waiting.len() as u64, b + band.bytes)
        });
        let (other_requests, other_bytes) = others
            .iter()
            .fold((0, 0), |(r, b), (_, rr, bb)| (r + rr, b + bb));
        let over = |limit: u64, now: u64| limit > 0 && now > limit;
        let full = over(limits.max_requests, band_requests + other_band_requests + 1)
            || over(
                limits.max_bytes,
                band_bytes + other_band_bytes + waiting.bytes,
            )
            || over(config.max_requests, mine_requests + other_requests + 1)
            || over(config.max_bytes, mine_bytes + other_bytes + waiting.bytes);
        if full {
            return Err(InferenceError::Dropped {
                status: 429,
                reason: SATURATED,
                message: "request rejected pre-queue: queue at capacity".to_string(),
            });
        }
        let band = self.bands.entry(priority).or_default();
        band.bytes += waiting.bytes;
        band.waiting.push_back(waiting);
        self.changed = true;
        Ok(())
    }

    /// Removes the request `id` (its client went away); whether it was waiting.
    pub fn remove(&mut self, id: u32) -> bool {
        let found = self.bands.iter_mut().find_map(|(&p, band)| {
            let at = band.waiting.iter().position(|w| w.id == id)?;
            Some((p, at))
        });
        let Some((priority, at)) = found else {
            return false;
        };
        self.take(priority, at);
        true
    }

    fn take(&mut self, priority: i32, at: usize) -> Option<Waiting> {
        let band = self.bands.get_mut(&priority)?;
        let waiting = band.waiting.remove(at)?;
        band.bytes = band.bytes.saturating_sub(waiting.bytes);
        if band.waiting.is_empty() {
            self.bands.remove(&priority);
        }
        self.changed = true;
        Some(waiting)
    }

    /// Takes the requests that have waited `ttl_ms` or longer at `now_ms` (0: none expire),
    /// oldest first, with their priorities.
    pub fn expire(&mut self, ttl_ms: u64, now_ms: u64) -> Vec<(i32, Waiting)> {
        let mut expired = Vec::new();
        if ttl_ms == 0 {
            return expired;
        }
        let priorities: Vec<i32> = self.bands.keys().copied().collect();
        for priority in priorities {
            while let Some(front) = self.bands.get(&priority).and_then(|b| b.waiting.front()) {
                if now_ms.saturating_sub(front.since_ms) < ttl_ms {
                    break;
                }
                if let Some(w) = self.take(priority, 0) {
                    expired.push((priority, w));
                }
            }
        }
        expired
    }

    /// Takes the requests to release at `now_ms`, highest band first and within a band in its
    /// ordering: while the estimated saturation stays below the ceiling and no other worker
    /// has a higher band waiting (`others_top`). `saturation` is the pool's by the detector;
    /// `step` what one released request adds to it until the detector sees it.
    pub fn release(
        &mut self,
        config: &FlowControl,
        saturation: f64,
        step: f64,
        others_top: Option<i32>,
        now_ms: u64,
    ) -> Vec<(i32, Waiting)> {
        let mut released = Vec::new();
        while let Some(priority) = self.top() {
            if others_top.is_some_and(|other| other > priority) {
                break;
            }
            let estimate = saturation + step * self.released_unseen as f64;
            if estimate >= config.usage_threshold {
                break;
            }
            let at = match config.band(priority).ordering {
                Ordering::Fcfs => 0,
                Ordering::ShortestJobFirst(params) => self.bands.get(&priority).map_or(0, |b| {
                    shortest_job_first_ordering_policy::next(&params, &b.waiting, now_ms)
                        .unwrap_or(0)
                }),
            };
            if let Some(w) = self.take(priority, at) {
                self.released_unseen += 1;
                released.push((priority, w));
            }
        }
        released
    }

    /// New metrics arrived: they count the requests released so far.
    pub fn metrics_changed(&mut self) {
        self.released_unseen = 0;
    }

    /// A released request finished before the metrics saw it.
    pub fn released_finished(&mut self) {
        self.released_unseen = self.released_unseen.saturating_sub(1);
    }

    /// Whether the board should hear of this worker's bands; clears the flag.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }
}

/// The error of a request whose wait ran out (`pool_empty`: the pool has no endpoint), in
/// upstream's words.
pub fn expired_error(pool_empty: bool) -> InferenceError {
    if pool_empty {
        InferenceError::NoEndpoints(
            "request timed out in queue and no endpoints are available: request evicted from queue: request TTL expired".to_string(),
        )
    } else {
        InferenceError::Dropped {
            status: 429,
            reason: TTL_EXPIRED,
            message: "request timed out in queue: request evicted from queue: request TTL expired"
                .to_string(),
        }
    }
}

/// The shared-data key of the board.
pub const BOARD_KEY: &str = "wasm-epp.flow-control.board";
/// A worker's entry older than this is ignored (a worker refreshes its own every tick while
/// it has requests waiting; one that stopped, or was replaced by a reload, fades out).
pub const BOARD_ENTRY_TTL_MS: u64 = 3_000;

/// One worker's entry on the board.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Entry {
    worker: u64,
    at_ms: u64,
    bands: Summary,
}

/// The pool-wide board of waiting bands: one shared-data key that every worker of the Envoy
/// process reads once per release cycle and writes when its own bands change (each a host
/// call taking the host's shared-data lock; never per request that does not wait).
#[derive(Debug)]
pub struct Board {
    worker: u64,
}

/// What the other workers have waiting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Others {
    /// Their bands, summed per priority.
    pub bands: Summary,
}

impl Others {
    /// The highest priority waiting at another worker.
    pub fn top(&self) -> Option<i32> {
        self.bands
            .iter()
            .filter(|(_, n, _)| *n > 0)
            .map(|(p, _, _)| *p)
            .max()
    }
}

impl Board {
    /// The board as seen by the worker `worker` (a random id of this worker).
    pub fn new(worker: u64) -> Board {
        Board { worker }
    }

    fn entries(store: &dyn SharedStore) -> (Vec<Entry>, Option<u32>) {
        match store.get(BOARD_KEY) {
            Some((Some(bytes), token)) => {
                (serde_json::from_slice(&bytes).unwrap_or_default(), token)
            }
            Some((None, token)) => (Vec::new(), token),
            None => (Vec::new(), None),
        }
    }

    /// What the other workers have waiting, from their live entries (one host call).
    pub fn others(&self, store: &dyn SharedStore, now_ms: u64) -> Others {
        let mut sums: BTreeMap<i32, (u64, u64)> = BTreeMap::new();
        for entry in Board::entries(store).0 {
            if entry.worker == self.worker
                || now_ms.saturating_sub(entry.at_ms) > BOARD_ENTRY_TTL_MS
            {
                continue;
            }
            for (p, n, b) in entry.bands {
                let sum = sums.entry(p).or_default();
                sum.0 += n;
                sum.1 += b;
            }
        }
        Others {
            bands: sums.into_iter().map(|(p, (n, b))| (p, n, b)).collect(),
        }
    }

    /// Writes this worker's bands (an empty summary removes its entry) and drops entries that
    /// faded out: a read and a compare-and-swap write, retried a few times on a conflict.
    pub fn publish(&self, store: &dyn SharedStore, bands: Summary, now_ms: u64) {
        for _ in 0..4 {
            let (mut entries, token) = Board::entries(store);
            let before = entries.len();
            entries.retain(|e| {
                e.worker != self.worker && now_ms.saturating_sub(e.at_ms) <= BOARD_ENTRY_TTL_MS
            });
            if bands.is_empty() && entries.len() == before {
                return;
            }
            if !bands.is_empty() {
                entries.push(Entry {
                    worker: self.worker,
                    at_ms: now_ms,
                    bands: bands.clone(),
                });
            }
            let bytes = serde_json::to_vec(&entries).unwrap_or_default();
            if store.set(BOARD_KEY, &bytes, token) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests;
