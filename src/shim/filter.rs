//! The filter's root context: its configuration, the per-worker state every HTTP context
//! of this worker shares (the decoded snapshot and the picker), and, when the configuration
//! names a controller cluster, this worker's leased poller.

use std::cell::RefCell;
use std::rc::Rc;

use proxy_wasm::hostcalls;
use proxy_wasm::types::MetricType;

use super::http::PickerHttp;
use super::leased_poller::LeasedPoller;
use super::shared::{self, now_ns, SharedPrefixStore};
use crate::picker::{Incoming, Outcome, Picker};
use crate::plugin_config::FilterConfig;
use crate::snapshot::Snapshot;

/// State of one worker's filter, shared by its HTTP contexts.
pub struct Worker {
    config: FilterConfig,
    picker: Picker,
    prefix_store: SharedPrefixStore,
    snapshot: Option<Rc<Snapshot>>,
    /// The published identity text `snapshot` was decoded for (or last failed to decode).
    snapshot_key: Option<Vec<u8>>,
    /// Envoy histogram `wasmcustom.wasm_epp_decision_ns`: time per decision.
    decision_ns: Option<u32>,
}

impl Worker {
    /// Decides one request with the newest snapshot.
    pub fn decide(&mut self, incoming: &Incoming<'_>) -> Outcome {
        let started = now_ns();
        let snapshot = self.snapshot();
        let outcome = self.picker.decide(
            snapshot.as_deref(),
            &self.config,
            incoming,
            |e| shared::in_flight(&e.host_port()),
            &self.prefix_store,
        );
        if let Some(id) = self.decision_ns {
            let _ = hostcalls::record_metric(id, now_ns().saturating_sub(started));
        }
        outcome
    }

    /// The published snapshot, decoded again only when its identity changed (whatever the
    /// poller published: it decides which snapshot replaces which).
    fn snapshot(&mut self) -> Option<Rc<Snapshot>> {
        let published = shared::snapshot_id_text();
        if published.is_some() && published != self.snapshot_key {
            match shared::snapshot_json().map(|json| Snapshot::from_json(&json)) {
                Some(Ok(snapshot)) => self.snapshot = Some(Rc::new(snapshot)),
                Some(Err(e)) => log::warn!("wasm-epp: keeping the previous snapshot: {e}"),
                None => return self.snapshot.clone(),
            }
            self.snapshot_key = published;
        }
        self.snapshot.clone()
    }
}

/// The filter's root context.
pub struct FilterRoot {
    worker: Rc<RefCell<Worker>>,
    /// Filter-side polling (`controllerCluster` configured); `None` with a bootstrap poller.
    poller: Option<LeasedPoller>,
}

impl FilterRoot {
    /// A root context with the given configuration; starts its leased poller, if any.
    pub fn new(config: FilterConfig) -> FilterRoot {
        let seed = now_ns();
        let poller = config.controller.clone().map(|controller| {
            let mut poller = LeasedPoller::new(controller);
            poller.start();
            poller
        });
        FilterRoot {
            poller,
            worker: Rc::new(RefCell::new(Worker {
                prefix_store: SharedPrefixStore::new(config.prefix_index_buckets),
                config,
                picker: Picker::new(seed),
                snapshot: None,
                snapshot_key: None,
                decision_ns: hostcalls::define_metric(
                    MetricType::Histogram,
                    "wasm_epp_decision_ns",
                )
                .ok(),
            })),
        }
    }

    /// A new HTTP context on this worker.
    pub fn new_http(&self) -> PickerHttp {
        PickerHttp::new(self.worker.clone())
    }

    /// The leased poller, if this filter polls the controller itself.
    pub fn poller(&mut self) -> Option<&mut LeasedPoller> {
        self.poller.as_mut()
    }
}
