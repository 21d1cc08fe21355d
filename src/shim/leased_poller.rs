//! Filter-side polling for deployments without a bootstrap poller (Envoy Gateway): each
//! worker's filter root context runs a [`Poller`], but only the worker holding the shared-data
//! lease lets it poll, so the controller sees one poller per Envoy process. The election itself
//! is plain Rust in [`crate::lease`]; this is its wiring to ticks and hostcalls.
//!
//! Every tick the contender renews (or competes for) the lease first, then the poller runs if
//! the lease is held. A worker that loses the lease starts no new poll; an answer still
//! outstanding is published (newer versions only, so harmlessly) and not followed up.

use super::poller::Poller;
use super::shared::{now_unix_ms, SharedHost};
use crate::lease::{self, Contender};
use crate::plugin_config::PollerConfig;

/// A poller that polls only while its worker holds the lease.
pub struct LeasedPoller {
    poller: Poller,
    contender: Contender,
}

impl LeasedPoller {
    /// A poller for `config`, not holding the lease yet.
    pub fn new(config: PollerConfig) -> LeasedPoller {
        let ttl = lease::ttl_ms(config.retry_ms.max(10));
        let mut poller = Poller::new(config);
        poller.set_active(false);
        LeasedPoller {
            poller,
            contender: Contender::new(ttl),
        }
    }

    /// Enters the election at once, so a lease created now can be confirmed, and the first
    /// poll sent, on the first tick. The filter root's ticker calls [`on_tick`](Self::on_tick)
    /// every [`retry_ms`](PollerConfig::retry_ms).
    pub fn start(&mut self) {
        self.contend();
    }

    /// The poller's settings.
    pub fn config(&self) -> &PollerConfig {
        self.poller.config()
    }

    /// Renews or competes for the lease, then polls if it is held.
    pub fn on_tick(&mut self) {
        if self.contend() {
            self.poller.on_tick();
        }
    }

    /// Takes what the workers enqueued to the record uplink; false when `queue` is another.
    pub fn on_queue_ready(&mut self, queue: u32) -> bool {
        self.poller.on_queue_ready(queue)
    }

    /// Hands the controller's answer to the poller.
    pub fn on_http_call_response(
        &mut self,
        token: u32,
        headers: usize,
        body: usize,
        trailers: usize,
    ) {
        self.poller
            .on_http_call_response(token, headers, body, trailers);
    }

    /// One election round; logs when this worker starts or stops being the poller.
    fn contend(&mut self) -> bool {
        let held = self.contender.holds();
        let holds = self.contender.tick(&SharedHost, now_unix_ms());
        if holds != held {
            let id = self.contender.id().map_or("?", |id| id.as_str());
            let cluster = &self.poller.config().controller_cluster;
            if holds {
                log::info!("wasm-epp: worker {id} holds the poller lease; polling {cluster}");
            } else {
                log::info!("wasm-epp: worker {id} lost the poller lease; stops polling");
            }
        }
        self.poller.set_active(holds);
        holds
    }
}
