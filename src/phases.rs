//! Where one decision's time goes, phase by phase: the benchmark's "where a request's time
//! goes" table reads these from a filter built with the `phase-timers` feature. Without a
//! clock (every other build) each mark is a branch and nothing else.

/// Nanoseconds per phase of the last decision.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Phases {
    /// Candidates, body parsing, model rewrite and admission.
    pub parse_ns: u64,
    /// Hashing the prompt's blocks.
    pub hash_ns: u64,
    /// Matching the blocks against the prefix index.
    pub lookup_ns: u64,
    /// Filters, scorers, the picker and building the route.
    pub score_ns: u64,
    /// Recording the decision in the prefix index.
    pub record_ns: u64,
}

/// One phase of a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// See [`Phases::parse_ns`].
    Parse,
    /// See [`Phases::hash_ns`].
    Hash,
    /// See [`Phases::lookup_ns`].
    Lookup,
    /// See [`Phases::score_ns`].
    Score,
    /// See [`Phases::record_ns`].
    Record,
}

/// Splits a decision's time into [`Phases`] with a clock, or does nothing without one.
#[derive(Debug, Clone, Copy, Default)]
pub struct PhaseTimer {
    clock: Option<fn() -> u64>,
    last: u64,
    phases: Phases,
}

impl PhaseTimer {
    /// A timer that measures nothing.
    pub fn off() -> PhaseTimer {
        PhaseTimer::default()
    }

    /// A timer reading `clock` (nanoseconds) at every mark.
    pub fn with_clock(clock: fn() -> u64) -> PhaseTimer {
        PhaseTimer {
            clock: Some(clock),
            ..PhaseTimer::default()
        }
    }

    /// Starts a new decision.
    pub fn start(&mut self) {
        if let Some(clock) = self.clock {
            self.phases = Phases::default();
            self.last = clock();
        }
    }

    /// Adds the time since the previous mark to `phase`.
    pub fn mark(&mut self, phase: Phase) {
        let Some(clock) = self.clock else {
            return;
        };
        let now = clock();
        let spent = now.saturating_sub(self.last);
        self.last = now;
        let slot = match phase {
            Phase::Parse => &mut self.phases.parse_ns,
            Phase::Hash => &mut self.phases.hash_ns,
            Phase::Lookup => &mut self.phases.lookup_ns,
            Phase::Score => &mut self.phases.score_ns,
            Phase::Record => &mut self.phases.record_ns,
        };
        *slot += spent;
    }

    /// The last decision's phases (all zero without a clock).
    pub fn phases(&self) -> Phases {
        self.phases
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    static NOW: AtomicU64 = AtomicU64::new(0);

    fn fake_clock() -> u64 {
        NOW.fetch_add(10, Ordering::SeqCst) + 10
    }

    #[test]
    fn marks_add_the_time_since_the_previous_one() {
        let mut off = PhaseTimer::off();
        off.start();
        off.mark(Phase::Parse);
        assert_eq!(off.phases(), Phases::default());
        let mut timer = PhaseTimer::with_clock(fake_clock);
        timer.start();
        timer.mark(Phase::Parse);
        timer.mark(Phase::Score);
        timer.mark(Phase::Score);
        let phases = timer.phases();
        assert_eq!(
            (phases.parse_ns, phases.score_ns, phases.hash_ns),
            (10, 20, 0)
        );
        timer.start();
        assert_eq!(timer.phases(), Phases::default());
    }
}
