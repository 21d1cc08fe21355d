//! The current set of objects of one watch, kept from the watcher's events.
//!
//! A (re)list arrives as `Init`, `InitApply`… and `InitDone`; the listed objects are buffered and
//! replace the set at `InitDone`, so a relist never shows a half-listed set. `Apply` and
//! `Delete` change the set at once.

use std::collections::BTreeMap;

use kube::runtime::watcher::Event;

/// Objects by name, as last listed and watched.
#[derive(Debug)]
pub struct Listing<T> {
    current: BTreeMap<String, T>,
    /// Objects of a list in progress.
    pending: Option<BTreeMap<String, T>>,
    synced: bool,
}

impl<T> Default for Listing<T> {
    fn default() -> Self {
        Listing {
            current: BTreeMap::new(),
            pending: None,
            synced: false,
        }
    }
}

impl<T: PartialEq> Listing<T> {
    /// Applies one event. `name` gives an object's key, `value` what is kept of it (called for
    /// listed and applied objects only, not for deleted ones). Returns whether the set changed;
    /// the first completed list always counts as a change.
    pub fn apply<K>(
        &mut self,
        event: Event<K>,
        name: impl Fn(&K) -> String,
        mut value: impl FnMut(K) -> T,
    ) -> bool {
        match event {
            Event::Init => {
                self.pending = Some(BTreeMap::new());
                false
            }
            Event::InitApply(object) => {
                let key = name(&object);
                self.pending
                    .get_or_insert_with(BTreeMap::new)
                    .insert(key, value(object));
                false
            }
            Event::InitDone => {
                let listed = self.pending.take().unwrap_or_default();
                let changed = !self.synced || listed != self.current;
                self.current = listed;
                self.synced = true;
                changed
            }
            Event::Apply(object) => {
                let key = name(&object);
                let object = value(object);
                if self.current.get(&key) == Some(&object) {
                    return false;
                }
                self.current.insert(key, object);
                true
            }
            Event::Delete(object) => self.current.remove(&name(&object)).is_some(),
        }
    }
}

impl<T> Listing<T> {
    /// Whether a first list has completed.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The objects, by name.
    pub fn objects(&self) -> &BTreeMap<String, T> {
        &self.current
    }
}

/// `event` with its object (if any) replaced by `f(object)`.
pub fn map_event<K, T>(event: Event<K>, f: impl FnOnce(K) -> T) -> Event<T> {
    match event {
        Event::Apply(object) => Event::Apply(f(object)),
        Event::Delete(object) => Event::Delete(f(object)),
        Event::Init => Event::Init,
        Event::InitApply(object) => Event::InitApply(f(object)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(listing: &mut Listing<u32>, event: Event<(&str, u32)>) -> bool {
        listing.apply(event, |(name, _)| name.to_string(), |(_, value)| value)
    }

    fn contents(listing: &Listing<u32>) -> Vec<(String, u32)> {
        listing
            .objects()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    }

    #[test]
    fn a_list_replaces_the_set_only_when_complete() {
        let mut listing = Listing::default();
        assert!(!listing.is_synced());
        assert!(!apply(&mut listing, Event::Init));
        assert!(!apply(&mut listing, Event::InitApply(("a", 1))));
        assert!(contents(&listing).is_empty(), "not visible before InitDone");
        assert!(apply(&mut listing, Event::InitDone));
        assert!(listing.is_synced());
        assert_eq!(contents(&listing), [("a".to_string(), 1)]);

        // A relist with the same objects is no change; one without `a` removes it.
        apply(&mut listing, Event::Init);
        apply(&mut listing, Event::InitApply(("a", 1)));
        assert!(!apply(&mut listing, Event::InitDone));
        apply(&mut listing, Event::Init);
        apply(&mut listing, Event::InitApply(("b", 2)));
        assert_eq!(
            contents(&listing),
            [("a".to_string(), 1)],
            "old set kept while listing"
        );
        assert!(apply(&mut listing, Event::InitDone));
        assert_eq!(contents(&listing), [("b".to_string(), 2)]);
    }

    #[test]
    fn an_empty_first_list_is_a_change() {
        let mut listing = Listing::default();
        apply(&mut listing, Event::Init);
        assert!(apply(&mut listing, Event::InitDone));
        assert!(listing.is_synced() && contents(&listing).is_empty());
    }

    #[test]
    fn applies_and_deletes_report_real_changes_only() {
        let mut listing = Listing::default();
        assert!(apply(&mut listing, Event::Apply(("a", 1))));
        assert!(!apply(&mut listing, Event::Apply(("a", 1))));
        assert!(apply(&mut listing, Event::Apply(("a", 2))));
        assert!(apply(&mut listing, Event::Delete(("a", 0))));
        assert!(!apply(&mut listing, Event::Delete(("a", 0))));
        assert!(contents(&listing).is_empty());
    }

    #[test]
    fn mapping_keeps_the_event_kind() {
        assert!(matches!(
            map_event(Event::Apply(2), |n| n * 10),
            Event::Apply(20)
        ));
        assert!(matches!(
            map_event(Event::Delete(2), |n| n + 1),
            Event::Delete(3)
        ));
        assert!(matches!(
            map_event(Event::InitApply(1), |n| n),
            Event::InitApply(1)
        ));
        assert!(matches!(
            map_event::<u8, u8>(Event::Init, |n| n),
            Event::Init
        ));
        assert!(matches!(
            map_event::<u8, u8>(Event::InitDone, |n| n),
            Event::InitDone
        ));
    }
}
