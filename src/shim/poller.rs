//! The snapshot poller: one per Envoy process, either a bootstrap `envoy.bootstrap.wasm`
//! singleton with the filter's `vm_id`, or the filter root context of whichever worker holds
//! the poller lease ([`super::leased_poller`]). It long-polls the controller and publishes
//! each snapshot that replaces the published one ([`SnapshotId::replaces`]: newer within one
//! controller instance, any from another instance, or the controller's correction of what
//! was asked for) to shared data; any failure is retried on a later tick.

use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType};

use super::records_channel::RecordsChannel;
use super::shared::{self, QueueHost, SharedHost};
use crate::exchange;
use crate::plugin_config::PollerConfig;
use crate::snapshot::{Snapshot, SnapshotId};

/// Extra time the HTTP call may take beyond the long-poll hold.
const CALL_MARGIN: Duration = Duration::from_secs(5);

/// Poller state.
pub struct Poller {
    config: PollerConfig,
    in_flight: bool,
    retry_after_ticks: u32,
    /// Whether new polls may start (an outstanding one is still answered and published).
    active: bool,
    /// What was published when the outstanding poll was sent.
    asked: Option<SnapshotId>,
    /// The workers' inboxes, told of each snapshot published.
    queues: QueueHost,
    /// The outstanding snapshot poll's token.
    snapshot_call: Option<u32>,
    /// Prefix records to and from the other Envoy replicas (`sharePrefixRecords`).
    records: Option<RecordsChannel>,
}

impl Poller {
    /// An active poller that has not polled yet.
    pub fn new(config: PollerConfig) -> Poller {
        let records = config.share_prefix_records.then(|| {
            RecordsChannel::new(QueueHost {
                vm_id: shared::vm_id(),
            })
        });
        Poller {
            snapshot_call: None,
            records,
            config,
            in_flight: false,
            retry_after_ticks: 0,
            active: true,
            asked: None,
            queues: QueueHost {
                vm_id: shared::vm_id(),
            },
        }
    }

    /// The poller's settings.
    pub fn config(&self) -> &PollerConfig {
        &self.config
    }

    /// Allows or stops new polls.
    pub fn set_active(&mut self, active: bool) {
        self.active = active;
    }

    /// Starts the retry ticker; the first poll goes out on the first tick.
    pub fn start(&mut self) {
        let period = Duration::from_millis(self.config.retry_ms.max(10));
        if let Err(status) = hostcalls::set_tick_period(period) {
            log::error!("wasm-epp poller: cannot set tick period: {status:?}");
        }
    }

    /// Polls again unless a call is outstanding; the record channel's turn.
    pub fn on_tick(&mut self) {
        if let (Some(records), true) = (self.records.as_mut(), self.active) {
            records.on_tick(&self.config);
        }
        if self.retry_after_ticks > 0 {
            self.retry_after_ticks -= 1;
            return;
        }
        if !self.in_flight {
            self.poll();
        }
    }

    fn poll(&mut self) {
        if !self.active {
            return;
        }
        let held = shared::snapshot_id();
        let (since, instance) = held.as_ref().map_or((0, String::new()), |id| {
            (id.version, query_safe(&id.instance))
        });
        let path = format!(
            "{}?since={since}&instance={instance}&wait_ms={}",
            self.config.snapshot_path, self.config.long_poll_ms
        );
        let headers = vec![
            (":method", "GET"),
            (":path", path.as_str()),
            (":authority", self.config.controller_authority.as_str()),
        ];
        let timeout = Duration::from_millis(self.config.long_poll_ms) + CALL_MARGIN;
        match hostcalls::dispatch_http_call(
            &self.config.controller_cluster,
            headers,
            None,
            vec![],
            timeout,
        ) {
            Ok(token) => {
                self.snapshot_call = Some(token);
                self.in_flight = true;
                self.asked = held;
            }
            Err(status) => log::warn!("wasm-epp poller: dispatch failed: {status:?}"),
        }
    }

    /// Takes what the workers enqueued to the record uplink; false when `queue` is another.
    pub fn on_queue_ready(&mut self, queue: u32) -> bool {
        let active = self.active;
        self.records
            .as_mut()
            .is_some_and(|records| records.on_queue_ready(queue, &self.config, active))
    }

    /// Handles the controller's answer: to a record call, the record channel's; to the
    /// snapshot poll, 200 publishes a newer snapshot, 304 polls again, and anything else
    /// waits a tick.
    pub fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        if let Some(records) = self.records.as_mut() {
            if records.on_http_call_response(token, body_size, &self.config, self.active) {
                return;
            }
        }
        if self.snapshot_call != Some(token) {
            return;
        }
        self.snapshot_call = None;
        self.in_flight = false;
        let status = hostcalls::get_map_value(MapType::HttpCallResponseHeaders, ":status")
            .ok()
            .flatten()
            .unwrap_or_default();
        match status.as_str() {
            "200" => {
                let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
                    .ok()
                    .flatten()
                    .unwrap_or_default();
                if self.publish(&body) {
                    self.poll();
                } else {
                    self.retry_after_ticks = 1;
                }
            }
            "304" => self.poll(),
            other => {
                log::warn!("wasm-epp poller: controller answered {other:?}; retrying");
                self.retry_after_ticks = 1;
            }
        }
    }

    /// Publishes `body` if it is a valid snapshot that replaces the published one, and tells
    /// the workers.
    fn publish(&self, body: &[u8]) -> bool {
        let snapshot = match Snapshot::from_json(body) {
            Ok(s) => s,
            Err(e) => {
                log::warn!("wasm-epp poller: {e}");
                return false;
            }
        };
        let id = snapshot.id();
        if !id.replaces(shared::snapshot_id().as_ref(), self.asked.as_ref()) {
            return true;
        }
        match shared::publish_snapshot(&id, body) {
            Ok(()) => {
                exchange::notify_snapshot(&SharedHost, &self.queues, shared::now_unix_ms());
                true
            }
            Err(status) => {
                log::warn!("wasm-epp poller: cannot publish: {status:?}");
                false
            }
        }
    }
}

/// `text` with every character outside `[A-Za-z0-9._-]` replaced by `_`, safe in a query
/// string. Controller ids are hex; anything else cannot match one, so the controller answers
/// at once with its own snapshot.
fn query_safe(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect()
}
