//! Per-phase histograms for the benchmark's "where a request's time goes" table, in a filter
//! built with the `phase-timers` feature: `wasmcustom.wasm_epp_phase_<phase>_ns` for the
//! filter's own callbacks (headers, body copy, applying the outcome, the response path) and for
//! the decision's phases ([`crate::phases`]). Each sample costs two clock reads and a histogram
//! host call, so the shipped filter is built without it and every function here is then empty.

use crate::phases::Phases;

/// A phase of the filter's own work around the decision.
#[derive(Debug, Clone, Copy)]
pub enum ShimPhase {
    /// Reading the request headers and removing the control headers.
    Headers,
    /// Copying the buffered body into Wasm memory.
    BodyCopy,
    /// Setting the destination (and a rewritten body), counting the request in flight.
    Apply,
    /// Response headers and body callbacks.
    Response,
}

#[cfg(feature = "phase-timers")]
mod enabled {
    use std::cell::RefCell;

    use proxy_wasm::hostcalls;
    use proxy_wasm::types::MetricType;

    use super::ShimPhase;
    use crate::phases::Phases;

    const NAMES: [&str; 9] = [
        "headers",
        "body_copy",
        "apply",
        "response",
        "parse",
        "hash",
        "lookup",
        "score",
        "record",
    ];

    thread_local! {
        static IDS: RefCell<Option<Vec<Option<u32>>>> = const { RefCell::new(None) };
    }

    fn record(slot: usize, ns: u64) {
        IDS.with(|ids| {
            let mut ids = ids.borrow_mut();
            let ids = ids.get_or_insert_with(|| {
                NAMES
                    .iter()
                    .map(|name| {
                        let name = format!("wasm_epp_phase_{name}_ns");
                        hostcalls::define_metric(MetricType::Histogram, &name).ok()
                    })
                    .collect()
            });
            if let Some(Some(id)) = ids.get(slot) {
                let _ = hostcalls::record_metric(*id, ns);
            }
        });
    }

    pub fn timed<T>(phase: ShimPhase, work: impl FnOnce() -> T) -> T {
        let started = crate::shim::shared::now_ns();
        let result = work();
        record(
            phase as usize,
            crate::shim::shared::now_ns().saturating_sub(started),
        );
        result
    }

    pub fn record_decision(phases: &Phases) {
        let values = [
            phases.parse_ns,
            phases.hash_ns,
            phases.lookup_ns,
            phases.score_ns,
            phases.record_ns,
        ];
        for (i, ns) in values.into_iter().enumerate() {
            record(4 + i, ns);
        }
    }

    pub fn clock() -> Option<fn() -> u64> {
        Some(crate::shim::shared::now_ns)
    }
}

/// Runs `work`, timing it as `phase` when the feature is on.
pub fn timed<T>(phase: ShimPhase, work: impl FnOnce() -> T) -> T {
    #[cfg(feature = "phase-timers")]
    return enabled::timed(phase, work);
    #[cfg(not(feature = "phase-timers"))]
    {
        let _ = phase;
        work()
    }
}

/// Records a decision's phases when the feature is on.
pub fn record_decision(phases: &Phases) {
    #[cfg(feature = "phase-timers")]
    enabled::record_decision(phases);
    #[cfg(not(feature = "phase-timers"))]
    let _ = phases;
}

/// The clock the director times its phases with, when the feature is on.
pub fn clock() -> Option<fn() -> u64> {
    #[cfg(feature = "phase-timers")]
    return enabled::clock();
    #[cfg(not(feature = "phase-timers"))]
    None
}
