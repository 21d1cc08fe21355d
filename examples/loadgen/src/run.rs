//! The load loop: a bounded number of requests, closed loop or paced.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio::task::JoinSet;

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

/// Every request's outcome (in completion order) and the wall time.
#[derive(Debug)]
pub struct RunResult {
    /// One outcome per request sent.
    pub outcomes: Vec<Outcome>,
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
        tasks.spawn(async move {
            let outcome = target.send(&workload.plan(index), index).await;
            drop(slot);
            outcome
        });
        // Collect finished tasks as we go so the set stays small.
        while let Some(done) = tasks.try_join_next() {
            outcomes.push(joined(done));
        }
    }
    while let Some(done) = tasks.join_next().await {
        outcomes.push(joined(done));
    }
    RunResult {
        outcomes,
        wall: start.elapsed(),
    }
}

fn joined(done: Result<Outcome, tokio::task::JoinError>) -> Outcome {
    done.unwrap_or_else(|e| Err(Failure::Transport(format!("request task failed: {e}"))))
}
