//! The filter's root context: its configuration and the per-worker state every HTTP context
//! of this worker shares (the decoded snapshot and the picker).

use std::cell::RefCell;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

use proxy_wasm::hostcalls;

use super::http::PickerHttp;
use super::shared;
use crate::picker::Picker;
use crate::plugin_config::FilterConfig;
use crate::snapshot::Snapshot;

/// State of one worker's filter, shared by its HTTP contexts.
pub struct Worker {
    /// The filter's configuration.
    pub config: FilterConfig,
    /// The picker (prefix index, random state).
    pub picker: Picker,
    snapshot: Option<Rc<Snapshot>>,
}

impl Worker {
    /// The newest published snapshot, decoded again only when its version changed.
    pub fn snapshot(&mut self) -> Option<Rc<Snapshot>> {
        let published = shared::snapshot_version();
        let cached = self.snapshot.as_ref().map(|s| s.version);
        if published.is_some() && published != cached {
            match shared::snapshot_json().map(|json| Snapshot::from_json(&json)) {
                Some(Ok(snapshot)) => self.snapshot = Some(Rc::new(snapshot)),
                Some(Err(e)) => log::warn!("wasm-epp: keeping the previous snapshot: {e}"),
                None => {}
            }
        }
        self.snapshot.clone()
    }
}

/// The filter's root context.
pub struct FilterRoot {
    worker: Rc<RefCell<Worker>>,
}

impl FilterRoot {
    /// A root context with the given configuration.
    pub fn new(config: FilterConfig) -> FilterRoot {
        let seed = hostcalls::get_current_time()
            .ok()
            .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        FilterRoot {
            worker: Rc::new(RefCell::new(Worker {
                config,
                picker: Picker::new(seed),
                snapshot: None,
            })),
        }
    }

    /// A new HTTP context on this worker.
    pub fn new_http(&self) -> PickerHttp {
        PickerHttp::new(self.worker.clone())
    }
}
