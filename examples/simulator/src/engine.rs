//! The engine: continuous batching with a FIFO waiting queue, LoRA slots,
//! the prefix cache and the KV-cache accounting.
//!
//! All state lives behind one mutex and every change (submit, admission,
//! token, release) happens in a single critical section, so the waiting and
//! running counts are exact at any instant. Each request is driven by its own
//! task holding a [`Sequence`]; dropping the sequence (request finished or
//! client gone) removes it and admits whatever can run next.
//!
//! Admission scans the waiting queue in FIFO order and admits every request
//! that fits while a batch slot is free. A request whose LoRA adapter is not
//! running and would exceed `max_loras` distinct running adapters is skipped
//! (it keeps its place) and requests behind it may go first, as vLLM's
//! scheduler does.
//!
//! With [`EngineConfig::prefill_stalls_decode`] the engine computes prefill and
//! decode on one device, as a GPU does: prefills run one after another (a request
//! admitted behind others waits for their prefill before its own), and every
//! decode step also pays for the prefill work admitted since the request's
//! previous token, as vLLM's steps that mix prefill chunks with decodes take
//! longer. A prefix-cache miss then costs the whole batch, not only its own
//! request. Off, each prefill runs beside the others and costs nobody else.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::latency::LatencyModel;
use crate::prefix_cache::PrefixCache;

/// Static configuration of the engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Most distinct LoRA adapters running (and loaded) at once.
    pub max_loras: usize,
    /// Tokens per KV-cache block.
    pub block_size: u64,
    /// KV-cache blocks on the (simulated) GPU; also the prefix-cache capacity.
    pub num_gpu_blocks: u64,
    /// Timing of prefill and decode.
    pub latency: LatencyModel,
    /// Whether prefills serialize and stall the running requests' decode steps (see the
    /// module documentation).
    pub prefill_stalls_decode: bool,
}

/// One request as the engine sees it.
#[derive(Clone, Debug, Default)]
pub struct Job {
    /// The LoRA adapter, or `None` for the base model.
    pub adapter: Option<String>,
    /// Prompt length in tokens.
    pub prompt_tokens: u64,
    /// Chained hashes of the prompt's full blocks.
    pub block_hashes: Vec<u64>,
}

/// What the scheduler decided when it admitted a request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Admission {
    /// Prompt tokens served from the prefix cache.
    pub cached_tokens: u64,
    /// Time to first token.
    pub ttft: Duration,
}

/// Lifetime totals of the engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Totals {
    /// Requests submitted.
    pub requests_total: u64,
    /// Prompt tokens of admitted requests (each one a prefix-cache query).
    pub prompt_tokens_total: u64,
    /// Prompt tokens served from the prefix cache.
    pub cached_prompt_tokens_total: u64,
    /// Output tokens generated.
    pub completion_tokens_total: u64,
    /// Requests that produced all their output tokens.
    pub request_success_total: u64,
    /// Output tokens of those requests: the `_sum` of the generated-tokens-per-request
    /// histogram, whose `_count` is `request_success_total`.
    pub request_generation_tokens_sum: u64,
    /// Admissions that had to load their LoRA adapter into a slot.
    pub lora_loads_total: u64,
    /// Decode steps (output tokens after each request's first), by inter-token latency.
    pub inter_token_latency: Histogram,
}

/// Upper bounds, in seconds, of the inter-token-latency histogram's buckets (a subset of
/// vLLM's), ending in `+Inf`.
pub const ITL_BUCKETS_S: [f64; 10] = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.5,
    f64::INFINITY,
];

/// A cumulative Prometheus histogram over [`ITL_BUCKETS_S`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Histogram {
    /// Observations at most each bound (cumulative, as exposed).
    pub buckets: [u64; ITL_BUCKETS_S.len()],
    /// Sum of the observations, in seconds.
    pub sum: f64,
    /// Number of observations.
    pub count: u64,
}

impl Histogram {
    /// Adds one observation of `seconds`.
    pub fn observe(&mut self, seconds: f64) {
        for (bucket, bound) in self.buckets.iter_mut().zip(ITL_BUCKETS_S) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
        self.sum += seconds;
        self.count += 1;
    }
}

/// The engine's state at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// Requests in the waiting queue.
    pub waiting: usize,
    /// Requests in the running batch.
    pub running: usize,
    /// KV-cache blocks held by running requests over the total, at most 1.
    pub kv_cache_usage: f64,
    /// Distinct adapters of running requests, sorted.
    pub running_adapters: Vec<String>,
    /// Distinct adapters of waiting requests, sorted.
    pub waiting_adapters: Vec<String>,
    /// Lifetime totals.
    pub totals: Totals,
}

/// The scheduler shared by all request tasks.
#[derive(Debug)]
pub struct Engine {
    config: EngineConfig,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    next_id: u64,
    waiting: VecDeque<Waiting>,
    running: HashMap<u64, Running>,
    /// Adapters in the GPU's LoRA slots, least recently used first.
    loaded_adapters: Vec<String>,
    prefix_cache: PrefixCache,
    totals: Totals,
    /// When the last prefill admitted so far completes (with `prefill_stalls_decode`).
    prefill_busy_until: Instant,
    /// All prefill time admitted so far (with `prefill_stalls_decode`; zero otherwise).
    prefill_work: Duration,
}

#[derive(Debug)]
struct Waiting {
    id: u64,
    job: Job,
    admitted: Arc<Notify>,
}

#[derive(Debug)]
struct Running {
    adapter: Option<String>,
    /// Prompt plus generated tokens, i.e. the KV cache it holds.
    tokens: u64,
    /// Output tokens generated so far.
    generated: u64,
    admission: Admission,
    /// [`State::prefill_work`] when this request last produced a token or was admitted: the
    /// prefill work since then delays its next decode step.
    prefill_seen: Duration,
}

impl Engine {
    /// An idle engine.
    pub fn new(config: EngineConfig) -> Arc<Self> {
        let capacity = usize::try_from(config.num_gpu_blocks).unwrap_or(usize::MAX);
        Arc::new(Self {
            state: Mutex::new(State {
                next_id: 0,
                waiting: VecDeque::new(),
                running: HashMap::new(),
                loaded_adapters: Vec::new(),
                prefix_cache: PrefixCache::new(capacity),
                totals: Totals::default(),
                prefill_busy_until: Instant::now(),
                prefill_work: Duration::ZERO,
            }),
            config,
        })
    }

    /// The engine's configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Queues `job` and admits it at once if it fits. The returned sequence
    /// keeps the request in the engine until it is dropped.
    pub fn submit(self: &Arc<Self>, job: Job) -> Sequence {
        let admitted = Arc::new(Notify::new());
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        state.totals.requests_total += 1;
        state.waiting.push_back(Waiting {
            id,
            job,
            admitted: Arc::clone(&admitted),
        });
        state.schedule(&self.config);
        Sequence {
            engine: Arc::clone(self),
            id,
            admitted,
            succeeded: false,
        }
    }

    /// The engine's current state.
    pub fn snapshot(&self) -> Snapshot {
        let state = self.lock();
        let blocks: u64 = state
            .running
            .values()
            .map(|r| r.tokens.div_ceil(self.config.block_size))
            .sum();
        Snapshot {
            waiting: state.waiting.len(),
            running: state.running.len(),
            kv_cache_usage: (blocks as f64 / self.config.num_gpu_blocks as f64).min(1.0),
            running_adapters: state.running_adapters().into_iter().cloned().collect(),
            waiting_adapters: distinct(state.waiting.iter().map(|w| &w.job.adapter))
                .into_iter()
                .cloned()
                .collect(),
            totals: state.totals,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    fn running_adapters(&self) -> BTreeSet<&String> {
        distinct(self.running.values().map(|r| &r.adapter))
    }

    /// Admits waiting requests, in FIFO order, while batch slots are free.
    fn schedule(&mut self, config: &EngineConfig) {
        let mut index = 0;
        while self.running.len() < config.max_num_seqs && index < self.waiting.len() {
            let fits = self
                .waiting
                .get(index)
                .is_some_and(|w| self.lora_fits(w.job.adapter.as_ref(), config.max_loras));
            if !fits {
                index += 1;
            } else if let Some(waiting) = self.waiting.remove(index) {
                self.admit(waiting, config);
            }
        }
    }

    /// Whether a request for `adapter` may join the running batch.
    fn lora_fits(&self, adapter: Option<&String>, max_loras: usize) -> bool {
        let Some(adapter) = adapter else {
            return true;
        };
        let running = self.running_adapters();
        running.contains(adapter) || running.len() < max_loras
    }

    fn admit(&mut self, waiting: Waiting, config: &EngineConfig) {
        let Waiting { id, job, admitted } = waiting;
        // As vLLM, the last prompt token is always computed, so at most
        // `prompt - 1` tokens can come from the cache.
        let max_hit_blocks =
            usize::try_from(job.prompt_tokens.saturating_sub(1) / config.block_size)
                .unwrap_or(usize::MAX)
                .min(job.block_hashes.len());
        let cached_blocks = self
            .prefix_cache
            .cached_blocks(&job.block_hashes[..max_hit_blocks]);
        let cached_tokens = cached_blocks as u64 * config.block_size;
        self.prefix_cache.insert(&job.block_hashes);
        let lora_load = job
            .adapter
            .as_ref()
            .is_some_and(|a| self.load_adapter(a, config.max_loras));
        let prefill = config
            .latency
            .prefill(job.prompt_tokens - cached_tokens, self.running.len());
        let prefill = if config.prefill_stalls_decode {
            self.queue_prefill(prefill)
        } else {
            prefill
        };
        let admission = Admission {
            cached_tokens,
            ttft: config
                .latency
                .ttft_overhead(lora_load)
                .saturating_add(prefill),
        };
        self.totals.prompt_tokens_total += job.prompt_tokens;
        self.totals.cached_prompt_tokens_total += cached_tokens;
        self.totals.lora_loads_total += u64::from(lora_load);
        self.running.insert(
            id,
            Running {
                adapter: job.adapter,
                tokens: job.prompt_tokens,
                generated: 0,
                admission,
                prefill_seen: self.prefill_work,
            },
        );
        admitted.notify_one();
    }

    /// Queues a prefill of `duration` behind the ones already admitted; returns how long
    /// from now until it completes.
    fn queue_prefill(&mut self, duration: Duration) -> Duration {
        let now = Instant::now();
        let start = self.prefill_busy_until.max(now);
        let Some(end) = start.checked_add(duration) else {
            return duration; // absurd durations: no queueing rather than a panic
        };
        self.prefill_busy_until = end;
        self.prefill_work = self.prefill_work.saturating_add(duration);
        end - now
    }

    /// Puts `adapter` in a LoRA slot; returns whether it had to be loaded.
    /// The evicted adapter is the least recently used one not running.
    fn load_adapter(&mut self, adapter: &String, max_loras: usize) -> bool {
        if let Some(pos) = self.loaded_adapters.iter().position(|a| a == adapter) {
            let hit = self.loaded_adapters.remove(pos);
            self.loaded_adapters.push(hit);
            return false;
        }
        if self.loaded_adapters.len() >= max_loras {
            let running = self.running_adapters();
            if let Some(pos) = self
                .loaded_adapters
                .iter()
                .position(|a| !running.contains(a))
            {
                self.loaded_adapters.remove(pos);
            }
        }
        self.loaded_adapters.push(adapter.clone());
        true
    }
}

fn distinct<'a>(adapters: impl Iterator<Item = &'a Option<String>>) -> BTreeSet<&'a String> {
    adapters.flatten().collect()
}

/// A request inside the engine, waiting or running. Dropping it removes the
/// request (a success if [`Sequence::finish`] was called) and lets the next
/// waiting requests in.
#[derive(Debug)]
pub struct Sequence {
    engine: Arc<Engine>,
    id: u64,
    admitted: Arc<Notify>,
    succeeded: bool,
}

impl Sequence {
    /// The engine-wide id of this request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits until the scheduler admits the request to the running batch.
    pub async fn admitted(&self) -> Admission {
        loop {
            let admission = self
                .engine
                .lock()
                .running
                .get(&self.id)
                .map(|r| r.admission);
            if let Some(admission) = admission {
                return admission;
            }
            self.admitted.notified().await;
        }
    }

    /// The duration of the next decode step, given the batch right now, plus (with
    /// `prefill_stalls_decode`) the prefill work admitted since this request's last token.
    pub fn itl(&self) -> Duration {
        let mut state = self.engine.lock();
        let others = state.running.len().saturating_sub(1);
        let work = state.prefill_work;
        let stall = state.running.get_mut(&self.id).map_or(Duration::ZERO, |r| {
            work.saturating_sub(std::mem::replace(&mut r.prefill_seen, work))
        });
        self.engine.config.latency.itl(others).saturating_add(stall)
    }

    /// Records one generated token (it grows the request's KV cache); `decode_step` is how
    /// long it took when it was not the request's first token (which is the time to first
    /// token, not an inter-token latency).
    pub fn record_token(&self, decode_step: Option<Duration>) {
        let mut state = self.engine.lock();
        if let Some(running) = state.running.get_mut(&self.id) {
            running.tokens += 1;
            running.generated += 1;
            state.totals.completion_tokens_total += 1;
            if let Some(step) = decode_step {
                state.totals.inter_token_latency.observe(step.as_secs_f64());
            }
        }
    }

    /// Leaves the engine as a successful request.
    pub fn finish(mut self) {
        self.succeeded = true;
    }
}

impl Drop for Sequence {
    fn drop(&mut self) {
        let mut state = self.engine.lock();
        if let Some(running) = state.running.remove(&self.id) {
            if self.succeeded {
                state.totals.request_success_total += 1;
                state.totals.request_generation_tokens_sum += running.generated;
            }
        } else {
            state.waiting.retain(|w| w.id != self.id);
        }
        state.schedule(&self.engine.config);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(max_num_seqs: usize, max_loras: usize) -> Arc<Engine> {
        Engine::new(EngineConfig {
            max_num_seqs,
            max_loras,
            block_size: 16,
            num_gpu_blocks: 100,
            latency: LatencyModel {
                ttft_base_ms: 5.0,
                prefill_ms_per_token: 0.02,
                itl_ms: 4.0,
                batch_slowdown: 0.05,
                lora_load_ms: 20.0,
                time_scale: 1.0,
            },
            prefill_stalls_decode: false,
        })
    }

    fn stalling_engine() -> Arc<Engine> {
        let plain = engine(8, 2);
        Engine::new(EngineConfig {
            prefill_stalls_decode: true,
            ..plain.config().clone()
        })
    }

    fn prompt(tokens: u64) -> Job {
        Job {
            prompt_tokens: tokens,
            ..Job::default()
        }
    }

    fn lora(name: &str) -> Job {
        Job {
            adapter: Some(name.to_owned()),
            ..Job::default()
        }
    }

    fn assert_ms(actual: Duration, expected_ms: f64) {
        let actual_ms = actual.as_secs_f64() * 1000.0;
        assert!(
            (actual_ms - expected_ms).abs() < 1e-6,
            "{actual_ms} ms, expected {expected_ms}"
        );
    }

    fn is_running(engine: &Engine, seq: &Sequence) -> bool {
        engine.lock().running.contains_key(&seq.id())
    }

    #[test]
    fn requests_beyond_max_num_seqs_wait_in_fifo_order() {
        let engine = engine(2, 2);
        let a = engine.submit(Job::default());
        let b = engine.submit(Job::default());
        let c = engine.submit(Job::default());
        let d = engine.submit(Job::default());
        let snap = engine.snapshot();
        assert_eq!((snap.running, snap.waiting), (2, 2));
        assert!(!is_running(&engine, &c) && !is_running(&engine, &d));

        drop(a);
        assert!(is_running(&engine, &c) && !is_running(&engine, &d));
        let snap = engine.snapshot();
        assert_eq!((snap.running, snap.waiting), (2, 1));

        drop(d); // a waiting request that goes away leaves the queue
        let snap = engine.snapshot();
        assert_eq!((snap.running, snap.waiting), (2, 0));
        drop((b, c));
        assert_eq!(engine.snapshot().running, 0);
        assert_eq!(engine.snapshot().totals.requests_total, 4);
    }

    #[test]
    fn lora_admission_is_limited_to_max_loras_adapters() {
        let engine = engine(8, 2);
        let a = engine.submit(lora("a"));
        let b = engine.submit(lora("b"));
        let c = engine.submit(lora("c"));
        // Same adapter as one running, and the base model: both admitted
        // ahead of the blocked `c`.
        let a2 = engine.submit(lora("a"));
        let base = engine.submit(Job::default());
        assert!(!is_running(&engine, &c));
        assert!(is_running(&engine, &a2) && is_running(&engine, &base));
        let snap = engine.snapshot();
        assert_eq!(snap.running_adapters, ["a", "b"]);
        assert_eq!(snap.waiting_adapters, ["c"]);

        drop(b);
        assert!(is_running(&engine, &c));
        assert_eq!(engine.snapshot().running_adapters, ["a", "c"]);
        drop((a, a2, base, c));
    }

    #[tokio::test]
    async fn loading_an_adapter_costs_ttft_once() {
        let engine = engine(8, 1);
        let first = engine.submit(lora("a"));
        assert_ms(first.admitted().await.ttft, 25.0);
        let second = engine.submit(lora("a"));
        assert_ms(second.admitted().await.ttft, 5.0);
        drop((first, second));
        // Still loaded while idle; a new adapter evicts it and pays the load.
        let other = engine.submit(lora("b"));
        assert_ms(other.admitted().await.ttft, 25.0);
        drop(other);
        let back = engine.submit(lora("a"));
        assert_ms(back.admitted().await.ttft, 25.0);
        assert_eq!(engine.snapshot().totals.lora_loads_total, 3);
    }

    #[tokio::test]
    async fn a_repeated_prompt_is_served_from_the_prefix_cache() {
        let engine = engine(8, 2);
        let prompt = "p".repeat(16 * 4 * 3); // exactly 3 blocks, 48 tokens
        let job = Job {
            adapter: None,
            prompt_tokens: 48,
            block_hashes: crate::prefix_cache::block_hashes("m", prompt.as_bytes(), 16),
        };
        let first = engine.submit(job.clone()).admitted().await;
        assert_eq!(first.cached_tokens, 0);
        let second = engine.submit(job).admitted().await;
        // The last block is recomputed so that the last token is.
        assert_eq!(second.cached_tokens, 32);
        assert!(second.ttft < first.ttft);
        let totals = engine.snapshot().totals;
        assert_eq!(
            (
                totals.prompt_tokens_total,
                totals.cached_prompt_tokens_total
            ),
            (96, 32)
        );
    }

    #[tokio::test]
    async fn kv_usage_counts_blocks_of_prompt_and_output() {
        let engine = engine(8, 2);
        let seq = engine.submit(Job {
            prompt_tokens: 16,
            ..Job::default()
        });
        seq.admitted().await;
        assert!((engine.snapshot().kv_cache_usage - 0.01).abs() < 1e-9);
        seq.record_token(None);
        assert!((engine.snapshot().kv_cache_usage - 0.02).abs() < 1e-9);
        seq.finish();
        let snap = engine.snapshot();
        assert_eq!(snap.kv_cache_usage, 0.0);
        assert_eq!(snap.totals.request_success_total, 1);
        assert_eq!(snap.totals.completion_tokens_total, 1);
    }

    #[tokio::test]
    async fn only_finished_requests_count_towards_their_generated_tokens() {
        let engine = engine(8, 2);
        let done = engine.submit(Job::default());
        let cancelled = engine.submit(Job::default());
        done.admitted().await;
        cancelled.admitted().await;
        for _ in 0..3 {
            done.record_token(None);
            cancelled.record_token(None);
        }
        done.finish();
        drop(cancelled);
        let totals = engine.snapshot().totals;
        assert_eq!(totals.completion_tokens_total, 6);
        assert_eq!(
            (
                totals.request_success_total,
                totals.request_generation_tokens_sum
            ),
            (1, 3)
        );
    }

    #[tokio::test]
    async fn decode_steps_feed_the_inter_token_latency_histogram() {
        let engine = engine(8, 2);
        let seq = engine.submit(Job::default());
        seq.admitted().await;
        seq.record_token(None);
        assert_eq!(engine.snapshot().totals.inter_token_latency.count, 0);
        seq.record_token(Some(Duration::from_millis(30)));
        seq.record_token(Some(Duration::from_millis(120)));
        let itl = engine.snapshot().totals.inter_token_latency;
        assert_eq!(itl.count, 2);
        assert!((itl.sum - 0.15).abs() < 1e-9);
        // Cumulative: bounds 0.01, 0.025 hold none; 0.05 … 0.1 one; 0.15 and up both.
        assert_eq!(itl.buckets, [0, 0, 1, 1, 1, 2, 2, 2, 2, 2]);
    }

    #[tokio::test(start_paused = true)]
    async fn stalling_prefills_run_one_after_another() {
        let engine = stalling_engine();
        // Alone: 5 + 0.02 × 1000 = 25 ms.
        let a = engine.submit(prompt(1000));
        assert_ms(a.admitted().await.ttft, 25.0);
        // Next to `a`: its own prefill is 0.02 × 1000 × 1.05 = 21 ms, after a's 20 ms.
        let b = engine.submit(prompt(1000));
        assert_ms(b.admitted().await.ttft, 5.0 + 20.0 + 21.0);
        // Once both are done, a new prefill waits for nobody.
        tokio::time::advance(Duration::from_millis(41)).await;
        let c = engine.submit(prompt(500));
        assert_ms(c.admitted().await.ttft, 5.0 + 10.0 * 1.1);
        drop((a, b, c));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalling_prefill_delays_the_next_decode_step_once() {
        let engine = stalling_engine();
        let a = engine.submit(prompt(0));
        a.admitted().await;
        assert_ms(a.itl(), 4.0);
        let b = engine.submit(prompt(1000)); // 0.02 × 1000 × 1.05 = 21 ms of prefill
        b.admitted().await;
        // a's next step: 4 × 1.05 for the batch, plus b's prefill; the step after, no stall.
        assert_ms(a.itl(), 4.2 + 21.0);
        assert_ms(a.itl(), 4.2);
        // b's own prefill does not stall b.
        assert_ms(b.itl(), 4.2);
        drop((a, b));
    }

    #[tokio::test]
    async fn without_the_stall_prefills_overlap_and_cost_nobody_else() {
        let engine = engine(8, 2);
        let a = engine.submit(prompt(0));
        a.admitted().await;
        let b = engine.submit(prompt(1000));
        assert_ms(b.admitted().await.ttft, 5.0 + 21.0);
        let c = engine.submit(prompt(1000));
        assert_ms(c.admitted().await.ttft, 5.0 + 22.0);
        assert_ms(a.itl(), 4.0 * 1.1);
        drop((a, b, c));
    }

    #[test]
    fn itl_reflects_the_other_running_requests() {
        let engine = engine(8, 2);
        let a = engine.submit(Job::default());
        assert_ms(a.itl(), 4.0);
        let _others: Vec<_> = (0..5).map(|_| engine.submit(Job::default())).collect();
        assert_ms(a.itl(), 5.0);
    }
}
