//! Electing one snapshot poller among the workers of an Envoy process, through shared data.
//!
//! Envoy Gateway gives the filter no bootstrap singleton, so every worker's filter root context
//! (each in its own VM clone, all with the same `vm_id` and thus the same shared data) could
//! poll the controller. To keep the controller's load at one poller per Envoy process, they
//! compete for a *lease*: the shared-data key [`LEASE_KEY`] holding `"<holder> <expiry>"`, the
//! holder's id and the Unix millisecond after which it is void. On every tick each contender
//! reads the lease and [`step`] decides:
//!
//! - no lease yet → create it naming itself;
//! - its own lease → renew it (a new expiry);
//! - someone else's live lease → keep off;
//! - someone else's expired (or unreadable) lease → take it over.
//!
//! Renewals and takeovers are written with compare-and-swap against the token of the value just
//! read, so of several contenders acting on the same value exactly one succeeds. The host
//! ignores the token when the key does not exist yet, so two contenders can both *create* the
//! lease, the later write silently replacing the earlier one. Creating therefore never grants
//! the lease: the creator polls only after a later tick renews it with compare-and-swap, by
//! which time every competing creation has landed and only the surviving name can renew. A
//! contender holds the lease exactly while its last compare-and-swap write succeeded.
//!
//! The holder renews on every tick and the lease lives [`ttl_ms`] (a few seconds, several
//! ticks), so a holder that stops ticking — its VM died, was replaced or its worker is stuck —
//! costs at most that long without polling before another worker takes over; the published
//! snapshot stays in shared data meanwhile, so routing continues on it. Expiry is wall-clock
//! time, which every worker of a process reads from the same host clock.
//!
//! Holder ids must differ between worker VMs, which are clones with identical memory, so no
//! in-VM counter distinguishes them: each contender draws one from the shared counter
//! [`SEQUENCE_KEY`] (see [`claim_id`]).

use crate::shared_data::SharedStore;

/// Shared-data key of the lease.
pub const LEASE_KEY: &str = "wasm-epp.poller.lease";
/// Shared-data key of the holder-id sequence counter.
pub const SEQUENCE_KEY: &str = "wasm-epp.poller.sequence";
/// The shortest lease lifetime.
pub const MIN_TTL_MS: u64 = 3_000;
/// Attempts at claiming an id before giving up until the next tick.
const CLAIM_ATTEMPTS: usize = 16;

/// Lease lifetime for a contender ticking every `tick_ms`: at least [`MIN_TTL_MS`] and four
/// ticks, so a holder's renewal is never due after its lease ended.
pub fn ttl_ms(tick_ms: u64) -> u64 {
    MIN_TTL_MS.max(tick_ms.saturating_mul(4))
}

/// A contender's identity, unique among the VMs of one Envoy process.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HolderId(String);

impl HolderId {
    /// The id claimed by raising the sequence counter to `sequence` with a compare-and-swap
    /// write against `token`.
    pub fn new(sequence: u64, token: u32) -> HolderId {
        HolderId(format!("{sequence}.{token}"))
    }

    /// The id as written into the lease.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A lease as stored under [`LEASE_KEY`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The holder's id.
    pub holder: String,
    /// Unix milliseconds after which the lease is void.
    pub expires_unix_ms: u64,
}

impl Lease {
    /// Parses `"<holder> <expires_unix_ms>"`; `None` for anything else.
    pub fn parse(bytes: &[u8]) -> Option<Lease> {
        let text = std::str::from_utf8(bytes).ok()?;
        let (holder, expiry) = text.split_once(' ')?;
        if holder.is_empty() {
            return None;
        }
        Some(Lease {
            holder: holder.to_string(),
            expires_unix_ms: expiry.parse().ok()?,
        })
    }

    /// The stored form.
    pub fn encode(&self) -> String {
        format!("{} {}", self.holder, self.expires_unix_ms)
    }
}

/// What a contender does with the lease on one tick; the writes carry the contender's new
/// lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// There is no lease: write one (no compare-and-swap possible; grants nothing yet).
    Create(String),
    /// The lease is this contender's: extend it (compare-and-swap).
    Renew(String),
    /// The lease is someone else's and expired or unreadable: take it (compare-and-swap).
    TakeOver(String),
    /// Someone else holds a live lease.
    KeepOff,
}

/// The decision for contender `me` at `now_unix_ms`, given the stored lease (`None`: no key).
pub fn step(current: Option<&[u8]>, me: &HolderId, now_unix_ms: u64, ttl_ms: u64) -> Step {
    let mine = Lease {
        holder: me.as_str().to_string(),
        expires_unix_ms: now_unix_ms.saturating_add(ttl_ms),
    }
    .encode();
    let Some(bytes) = current else {
        return Step::Create(mine);
    };
    match Lease::parse(bytes) {
        Some(lease) if lease.holder == me.as_str() => Step::Renew(mine),
        Some(lease) if lease.expires_unix_ms > now_unix_ms => Step::KeepOff,
        _ => Step::TakeOver(mine),
    }
}

/// Claims a holder id from the shared counter [`SEQUENCE_KEY`]; see [`claim_id_at`].
pub fn claim_id(store: &impl SharedStore) -> Option<HolderId> {
    claim_id_at(store, SEQUENCE_KEY)
}

/// Claims an id, unique among the VMs of one Envoy process, from the shared counter under
/// `counter_key`; `None` if shared data fails or stays contended.
///
/// The counter is raised by compare-and-swap, and the id is the new count together with the
/// token the successful write was checked against. A token names one write to shared data,
/// and only one compare-and-swap against it can succeed, so no two claims share it; should a
/// late creation of the counter (the same unguarded-creation race as the lease's) reset the
/// count, the tokens still differ. The count keeps ids apart should the host's 32-bit token
/// wrap around in a long-lived process.
pub fn claim_id_at(store: &impl SharedStore, counter_key: &str) -> Option<HolderId> {
    for _ in 0..CLAIM_ATTEMPTS {
        match store.get(counter_key)? {
            (Some(bytes), Some(token)) => {
                let sequence = next_sequence(&bytes);
                if store.set(counter_key, sequence.to_string().as_bytes(), Some(token)) {
                    return Some(HolderId::new(sequence, token));
                }
            }
            // Absent: create it, then claim against the created value on the next attempt.
            _ => {
                store.set(counter_key, b"0", None);
            }
        }
    }
    None
}

/// The count after `current` (an unreadable counter restarts at 1).
pub fn next_sequence(current: &[u8]) -> u64 {
    std::str::from_utf8(current)
        .ok()
        .and_then(|text| text.parse::<u64>().ok())
        .map_or(1, |n| n.saturating_add(1))
}

/// One worker's side of the election.
#[derive(Debug)]
pub struct Contender {
    id: Option<HolderId>,
    holds: bool,
    ttl_ms: u64,
}

impl Contender {
    /// A contender whose lease lasts `ttl_ms`; it claims its id on its first tick.
    pub fn new(ttl_ms: u64) -> Contender {
        Contender {
            id: None,
            holds: false,
            ttl_ms,
        }
    }

    /// This contender's id, once claimed.
    pub fn id(&self) -> Option<&HolderId> {
        self.id.as_ref()
    }

    /// Whether this contender held the lease after its last tick.
    pub fn holds(&self) -> bool {
        self.holds
    }

    /// One round of the election at `now_unix_ms`; returns whether this contender holds the
    /// lease (and may poll) until its next tick. Any shared-data failure means not holding.
    pub fn tick(&mut self, store: &impl SharedStore, now_unix_ms: u64) -> bool {
        if self.id.is_none() {
            self.id = claim_id(store);
        }
        self.holds = match (&self.id, store.get(LEASE_KEY)) {
            (Some(id), Some((current, token))) => {
                match step(current.as_deref(), id, now_unix_ms, self.ttl_ms) {
                    Step::KeepOff => false,
                    Step::Create(mine) => {
                        store.set(LEASE_KEY, mine.as_bytes(), None);
                        false
                    }
                    Step::Renew(mine) | Step::TakeOver(mine) => {
                        token.is_some() && store.set(LEASE_KEY, mine.as_bytes(), token)
                    }
                }
            }
            _ => false,
        };
        self.holds
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shared_data::fake::Host;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Shared data that always fails.
    struct Broken;

    impl SharedStore for Broken {
        fn get(&self, _key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
            None
        }

        fn set(&self, _key: &str, _value: &[u8], _token: Option<u32>) -> bool {
            false
        }
    }

    fn id(n: u64) -> HolderId {
        HolderId::new(n, 7)
    }

    #[test]
    fn step_creates_renews_keeps_off_and_takes_over() {
        let me = id(1);
        assert_eq!(
            step(None, &me, 1_000, 3_000),
            Step::Create("1.7 4000".into())
        );
        assert_eq!(
            step(Some(b"1.7 1500"), &me, 1_000, 3_000),
            Step::Renew("1.7 4000".into())
        );
        // My own lease is renewed even after it expired: nobody took it.
        assert_eq!(
            step(Some(b"1.7 10"), &me, 1_000, 3_000),
            Step::Renew("1.7 4000".into())
        );
        assert_eq!(step(Some(b"2.9 1001"), &me, 1_000, 3_000), Step::KeepOff);
        // Expired at its expiry millisecond, and an unreadable lease is nobody's.
        for other in [
            &b"2.9 1000"[..],
            b"2.9 999",
            b"garbage",
            b" 5000",
            b"2.9 soon",
            b"",
        ] {
            assert_eq!(
                step(Some(other), &me, 1_000, 3_000),
                Step::TakeOver("1.7 4000".into()),
                "{other:?}"
            );
        }
    }

    #[test]
    fn lease_round_trips_and_ttl_covers_several_ticks() {
        let lease = Lease {
            holder: "3.41".into(),
            expires_unix_ms: 123,
        };
        assert_eq!(Lease::parse(lease.encode().as_bytes()), Some(lease));
        assert_eq!(Lease::parse(&[0xff, b' ', b'1']), None);
        assert_eq!(ttl_ms(250), MIN_TTL_MS);
        assert_eq!(ttl_ms(2_000), 8_000);
        assert_eq!(ttl_ms(u64::MAX), u64::MAX);
        assert_eq!(
            step(None, &id(1), u64::MAX - 1, 10),
            Step::Create(format!("1.7 {}", u64::MAX))
        );
    }

    #[test]
    fn sequence_counts_up_and_restarts_when_unreadable() {
        assert_eq!(next_sequence(b"0"), 1);
        assert_eq!(next_sequence(b"41"), 42);
        assert_eq!(next_sequence(b"x"), 1);
        assert_eq!(next_sequence(u64::MAX.to_string().as_bytes()), u64::MAX);
    }

    #[test]
    fn claimed_ids_differ_even_when_the_counter_is_recreated() {
        let host = Host::default();
        let a = claim_id(&host).unwrap();
        let b = claim_id(&host).unwrap();
        assert_ne!(a, b);
        assert!(
            a.as_str().starts_with("1.") && b.as_str().starts_with("2."),
            "{a:?} {b:?}"
        );
        // A late creator resets the count: the next id has the same count as `a`, another token.
        host.remove(SEQUENCE_KEY);
        let c = claim_id(&host).unwrap();
        assert!(c.as_str().starts_with("1."), "{c:?}");
        assert_ne!(c, a);
        assert_eq!(claim_id(&Broken), None);
    }

    #[test]
    fn exactly_one_of_many_contenders_holds_and_keeps_the_lease() {
        let host = Host::default();
        let mut workers: Vec<Contender> = (0..5).map(|_| Contender::new(3_000)).collect();
        let mut now = 1_000;
        // First round: someone creates the lease, nobody holds it yet.
        assert!(workers.iter_mut().all(|w| !w.tick(&host, now)));
        let mut holder = None;
        for _ in 0..100 {
            now += 250;
            let holding: Vec<usize> = (0..workers.len())
                .filter(|&i| workers[i].tick(&host, now))
                .collect();
            assert_eq!(holding.len(), 1, "{holding:?}");
            assert!(holder.is_none() || holder == Some(holding[0]));
            holder = Some(holding[0]);
        }
        let ids: std::collections::HashSet<_> =
            workers.iter().filter_map(|w| w.id().cloned()).collect();
        assert_eq!(ids.len(), workers.len());
    }

    #[test]
    fn a_silent_holder_is_replaced_after_the_lease_expires() {
        let host = Host::default();
        let mut workers: Vec<Contender> = (0..3).map(|_| Contender::new(3_000)).collect();
        let mut now = 1_000;
        for _ in 0..2 {
            for w in workers.iter_mut() {
                w.tick(&host, now);
            }
            now += 250;
        }
        let dead = (0..3).find(|&i| workers[i].holds()).unwrap();
        let stopped = now;
        let mut taken = None;
        while now < stopped + 10_000 && taken.is_none() {
            now += 250;
            for i in (0..3).filter(|&i| i != dead) {
                if workers[i].tick(&host, now) {
                    taken = Some(now);
                }
            }
        }
        let taken = taken.expect("nobody took over");
        // Not before the lease ran out, and within a tick after it did.
        assert!(
            taken >= stopped + 3_000 - 250 && taken <= stopped + 3_000 + 250,
            "{taken}"
        );
        // The old holder comes back: it sees the new holder and keeps off.
        assert!(!workers[dead].tick(&host, now + 250));
        let holding = (0..3)
            .filter(|&i| workers[i].tick(&host, now + 500))
            .count();
        assert_eq!(holding, 1);
    }

    #[test]
    fn a_racing_creation_never_gives_two_holders() {
        let host = Host::default();
        let (mut a, mut b) = (Contender::new(3_000), Contender::new(3_000));
        // Both saw no lease; a's creation lands first, then b's replaces it unguarded (modelled
        // by removing the key before b's tick).
        assert!(!a.tick(&host, 1_000));
        host.remove(LEASE_KEY);
        assert!(!b.tick(&host, 1_000));
        // Next ticks: only the surviving creation renews.
        assert!(!a.tick(&host, 1_250));
        assert!(b.tick(&host, 1_250));
        assert!(!a.tick(&host, 1_500));
        assert!(b.tick(&host, 1_500));
    }

    #[test]
    fn a_renewal_loses_to_a_concurrent_write() {
        let host = Host::default();
        let mut a = Contender::new(3_000);
        a.tick(&host, 1_000);
        assert!(a.tick(&host, 1_250));
        // Someone else writes between a's read and a's write: a's CAS fails, a does not hold.
        struct Interfering<'a>(&'a Host);
        impl SharedStore for Interfering<'_> {
            fn get(&self, key: &str) -> Option<(Option<Vec<u8>>, Option<u32>)> {
                let read = self.0.get(key);
                if key == LEASE_KEY {
                    self.0.set(key, b"9.9 99999", None);
                }
                read
            }
            fn set(&self, key: &str, value: &[u8], token: Option<u32>) -> bool {
                self.0.set(key, value, token)
            }
        }
        assert!(!a.tick(&Interfering(&host), 1_500));
        assert!(!a.tick(&host, 1_750));
        assert!(!Contender::new(3_000).tick(&Broken, 1_000));
    }
}
