//! The load loop: a bounded number of requests, closed loop or paced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::{JoinError, JoinSet};

use crate::client::{Failure, Outcome, Target};
use crate::prompts::Workload;

/// How requests are started.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Load {
    /// Total requests.
    pub requests: u32,
    /// Most requests in flight at once.
    pub concurrency: u32,
    /// Open-loop start rate in requests per second; closed loop when `None`.
    pub rate: Option<f64>,
}

/// A request as it was sent.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sent {
    /// Its number in this run, from 0.
    pub index: u32,
    /// When it was started, from the run's start (it is sent as soon as its prompt is made).
    pub at: Duration,
    /// Bytes of its prompt (or user message).
    pub prompt_bytes: usize,
    /// Its `max_tokens`.
    pub max_tokens: u32,
}

/// Every request's outcome (in completion order) and the wall time.
#[derive(Debug)]
pub struct RunResult {
    /// One outcome per request sent.
    pub outcomes: Vec<Outcome>,
    /// The requests as sent, in the order of `outcomes` (`None` for a request whose task
    /// failed).
    pub sent: Vec<Option<Sent>>,
    /// From the first request start to the last response.
    pub wall: Duration,
}

/// Sends `load.requests` requests of `workload` to `target`. At most
/// `load.concurrency` are in flight; with a rate, request `i` starts no
/// earlier than `i / rate` seconds in, otherwise as soon as a slot frees.
pub async fn run(target: Arc<Target>, workload: Arc<Workload>, load: Load) -> RunResult {
    let slots = Arc::new(Semaphore::new(load.concurrency as usize));
    let mut tasks = JoinSet::new();
    let mut outcomes = Vec::with_capacity(load.requests as usize);
    let mut sent = Vec::with_capacity(load.requests as usize);
    let start = Instant::now();
    for index in 0..load.requests {
        if let Some(rate) = load.rate {
            let due = start + Duration::from_secs_f64(f64::from(index) / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        // The semaphore is never closed, so this only waits.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            break;
        };
        let (target, workload) = (target.clone(), workload.clone());
        let at = start.elapsed();
        tasks.spawn(async move {
            let plan = workload.plan(index);
            let request = Sent {
                index,
                at,
                prompt_bytes: plan.prompt.len(),
                max_tokens: plan.max_tokens.unwrap_or(target.max_tokens()),
            };
            let outcome = target.send(&plan, index).await;
            drop(slot);
            (request, outcome)
        });
        // Collect finished tasks as we go so the set stays small.
        while let Some(done) = tasks.try_join_next() {
            record(&mut sent, &mut outcomes, done);
        }
    }
    while let Some(done) = tasks.join_next().await {
        record(&mut sent, &mut outcomes, done);
    }
    RunResult {
        outcomes,
        sent,
        wall: start.elapsed(),
    }
}

/// Records a finished task: its request and its outcome (a task that failed, which `send`
/// never makes one do, as a transport failure of an unknown request).
fn record(
    sent: &mut Vec<Option<Sent>>,
    outcomes: &mut Vec<Outcome>,
    done: Result<(Sent, Outcome), JoinError>,
) {
    match done {
        Ok((request, outcome)) => {
            sent.push(Some(request));
            outcomes.push(outcome);
        }
        Err(e) => {
            sent.push(None);
            outcomes.push(Err(Failure::Transport(format!("request task failed: {e}"))));
        }
    }
}
