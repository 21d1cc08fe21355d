//! Counts the host calls made on the request path, so a test can check that a request costs
//! the same number whatever its prompt length and pool size. Each HTTP context adds up the
//! calls its callbacks made and reports them when it ends (see [`super::http`]).

use std::sync::atomic::{AtomicU64, Ordering};

/// Host calls counted so far on this worker's request path.
static CALLS: AtomicU64 = AtomicU64::new(0);

/// Counts one host call and passes its result through.
pub fn counted<T>(result: T) -> T {
    CALLS.fetch_add(1, Ordering::Relaxed);
    result
}

/// Counts `n` host calls made elsewhere.
pub fn add(n: u64) {
    CALLS.fetch_add(n, Ordering::Relaxed);
}

/// Host calls counted so far.
pub fn total() -> u64 {
    CALLS.load(Ordering::Relaxed)
}
