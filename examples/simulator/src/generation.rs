//! Paces one admitted request's output tokens by the latency model.

use crate::engine::Sequence;
use crate::openai::Usage;
use crate::tokens;

/// The output side of one request: each call to [`Generation::next_token`]
/// waits for the scheduler, then the time to first token, then one
/// inter-token latency per further token. The request leaves the engine, as
/// a success, right after its last token.
#[derive(Debug)]
pub struct Generation {
    sequence: Option<Sequence>,
    id: u64,
    prompt_tokens: u64,
    output_tokens: u64,
    produced: u64,
    cached_tokens: u64,
}

impl Generation {
    /// Generation of `output_tokens` (at least one) for a submitted sequence
    /// with `prompt_tokens` prompt tokens.
    pub fn new(sequence: Sequence, prompt_tokens: u64, output_tokens: u64) -> Self {
        Self {
            id: sequence.id(),
            sequence: Some(sequence),
            prompt_tokens,
            output_tokens,
            produced: 0,
            cached_tokens: 0,
        }
    }

    /// The engine-wide id of the request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Waits for and returns the next output token, or `None` when all are out.
    pub async fn next_token(&mut self) -> Option<&'static str> {
        let sequence = self.sequence.as_ref()?;
        let (delay, decode_step) = if self.produced == 0 {
            let admission = sequence.admitted().await;
            self.cached_tokens = admission.cached_tokens;
            (admission.ttft, None)
        } else {
            let itl = sequence.itl();
            (itl, Some(itl))
        };
        tokio::time::sleep(delay).await;
        sequence.record_token(decode_step);
        let token = tokens::output_token(self.id, self.produced);
        self.produced += 1;
        if self.is_done() {
            if let Some(sequence) = self.sequence.take() {
                sequence.finish();
            }
        }
        Some(token)
    }

    /// Output tokens produced so far.
    pub fn produced(&self) -> u64 {
        self.produced
    }

    /// Whether every output token has been produced.
    pub fn is_done(&self) -> bool {
        self.produced >= self.output_tokens
    }

    /// The usage so far.
    pub fn usage(&self) -> Usage {
        Usage::new(self.prompt_tokens, self.produced, self.cached_tokens)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::engine::{Engine, EngineConfig, Job};
    use crate::latency::LatencyModel;

    #[tokio::test(start_paused = true)]
    async fn tokens_arrive_after_ttft_then_one_itl_each() {
        let engine = Engine::new(EngineConfig {
            max_num_seqs: 1,
            max_loras: 1,
            block_size: 16,
            num_gpu_blocks: 10,
            latency: LatencyModel {
                ttft_base_ms: 50.0,
                prefill_ms_per_token: 0.0,
                itl_ms: 10.0,
                batch_slowdown: 0.0,
                lora_load_ms: 0.0,
                time_scale: 1.0,
            },
            prefill_stalls_decode: false,
        });
        let job = Job {
            prompt_tokens: 20,
            ..Job::default()
        };
        let mut generation = Generation::new(engine.submit(job), 20, 3);
        let start = tokio::time::Instant::now();
        let mut arrivals = Vec::new();
        while generation.next_token().await.is_some() {
            arrivals.push(start.elapsed());
        }
        let ms = Duration::from_millis;
        assert_eq!(arrivals, [ms(50), ms(60), ms(70)]);
        assert_eq!(generation.usage(), Usage::new(20, 3, 0));
        let snapshot = engine.snapshot();
        assert_eq!(snapshot.running, 0);
        assert_eq!(snapshot.totals.request_success_total, 1);
    }
}
