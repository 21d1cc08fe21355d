//! The poller's channel for prefix records between Envoy replicas (see
//! [`crate::replica_records`]): a long-polled download of the other replicas' records, handed
//! to every worker, and uploads of this Envoy's, gathered from the uplink queue. Both are HTTP
//! calls to the controller cluster, one of each outstanding at a time, off the request path.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::time::Duration;

use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType};

use super::shared::{now_unix_ms, QueueHost, SharedHost};
use crate::exchange::{self, SHARE_KEY, UPLINK_QUEUE};
use crate::plugin_config::PollerConfig;
use crate::replica_records::{self, Uplink, MAX_BATCH_WORDS};
use crate::shared_data::{SharedQueues, SharedStore};

/// Extra time a call may take beyond the long-poll hold.
const CALL_MARGIN: Duration = Duration::from_secs(5);
/// An upload must be answered within this long.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Ticks to wait after the controller did not take a call (it may predate the exchange).
const BACKOFF_TICKS: u32 = 8;
/// Controller replicas whose cursors are kept.
const MAX_CONTROLLERS: usize = 8;
/// Most words accepted in one download (the controller sends at most 256 KiB).
const MAX_DOWNLOAD_WORDS: usize = MAX_BATCH_WORDS;

/// One Envoy's side of the exchange; see the module docs.
pub struct RecordsChannel {
    /// This Envoy's id at the controller: random, drawn when the channel is made.
    replica: String,
    uplink_queue: Option<u32>,
    uplink: Uplink,
    upload: Option<u32>,
    download: Option<u32>,
    /// The cursor held for each controller instance heard from, most recent first (behind a
    /// Service, a download may reach any controller replica).
    cursors: Vec<(String, u64)>,
    /// Whether replicas share, as last written to [`SHARE_KEY`] (`None`: not yet).
    share: Option<bool>,
    wait_ticks: u32,
    queues: QueueHost,
    /// Gauge `wasm_epp_replicas_sharing` (Envoy: `wasmcustom.…`): 1 while records are shared.
    sharing_gauge: Option<u32>,
}

impl RecordsChannel {
    /// A channel that has not registered its queue yet.
    pub fn new(queues: QueueHost) -> RecordsChannel {
        let random = RandomState::new().hash_one(now_unix_ms());
        RecordsChannel {
            replica: format!("{random:016x}"),
            uplink_queue: None,
            uplink: Uplink::new(),
            upload: None,
            download: None,
            cursors: Vec::new(),
            share: None,
            wait_ticks: 0,
            queues,
            sharing_gauge: hostcalls::define_metric(MetricType::Gauge, "wasm_epp_replicas_sharing")
                .ok(),
        }
    }

    /// One turn of the poller (its retry period): registers the uplink queue (so this
    /// worker's thread takes the records; a poller taking over from another one takes its
    /// queue over) and starts a download if none is outstanding.
    pub fn on_tick(&mut self, config: &PollerConfig) {
        if self.uplink_queue.is_none() {
            self.uplink_queue = self.queues.register(UPLINK_QUEUE);
        }
        if self.wait_ticks > 0 {
            self.wait_ticks -= 1;
            return;
        }
        if self.download.is_none() {
            self.start_download(config);
        }
        self.start_upload(config);
    }

    /// Takes what the workers enqueued to the uplink; false when `queue` is not the uplink.
    /// Dropped unless replicas share and this worker polls (`active`).
    pub fn on_queue_ready(&mut self, queue: u32, config: &PollerConfig, active: bool) -> bool {
        if self.uplink_queue != Some(queue) {
            return false;
        }
        while let Some(message) = self.queues.dequeue(queue) {
            if self.share == Some(true) && active {
                self.uplink.add(&message);
            }
        }
        if active {
            self.start_upload(config);
        }
        true
    }

    /// Handles an answer to one of this channel's calls; false when `token` is not one. An
    /// answered download is followed by the next one at once, an accepted upload by the next
    /// batch, so a record waits for no tick on its way.
    pub fn on_http_call_response(
        &mut self,
        token: u32,
        body_size: usize,
        config: &PollerConfig,
        active: bool,
    ) -> bool {
        if self.download == Some(token) {
            self.download = None;
            // After records, more may be on the way: poll again at once. After a 304 (the
            // hold ran out, or news about sharing) the next tick will do.
            if self.downloaded(body_size) && active && self.wait_ticks == 0 {
                self.start_download(config);
            }
            true
        } else if self.upload == Some(token) {
            self.upload = None;
            match response_header(":status").as_deref() {
                Some("204") if active => self.start_upload(config),
                Some("204") => {}
                Some("429") => self.wait_ticks = 1,
                other => {
                    log::warn!("wasm-epp records: the controller refused an upload ({other:?})");
                    self.wait_ticks = BACKOFF_TICKS;
                }
            }
            true
        } else {
            false
        }
    }

    /// Takes a download's answer; whether it brought records.
    fn downloaded(&mut self, body_size: usize) -> bool {
        let status = response_header(":status");
        match status.as_deref() {
            Some("200") | Some("304") => {}
            other => {
                if self.wait_ticks == 0 {
                    log::warn!(
                        "wasm-epp records: the controller answered {other:?}; sharing paused"
                    );
                }
                self.wait_ticks = BACKOFF_TICKS;
                self.set_share(false);
                return false;
            }
        }
        let cursor = response_header("x-records-cursor").and_then(|c| c.parse::<u64>().ok());
        let instance = response_header("x-snapshot-instance")
            .filter(|i| i.bytes().all(|b| b.is_ascii_alphanumeric()));
        if let (Some(cursor), Some(instance)) = (cursor, instance) {
            self.cursors.retain(|(i, _)| *i != instance);
            self.cursors.insert(0, (instance, cursor));
            self.cursors.truncate(MAX_CONTROLLERS);
        }
        self.set_share(response_header("x-records-share").as_deref() == Some("1"));
        if status.as_deref() != Some("200") {
            return false;
        }
        let body = hostcalls::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        match replica_records::words(&body, MAX_DOWNLOAD_WORDS) {
            Some(records) => {
                exchange::deliver_replica_records(
                    &SharedHost,
                    &self.queues,
                    now_unix_ms(),
                    &records,
                );
                true
            }
            None => {
                log::warn!("wasm-epp records: ignored a malformed download");
                false
            }
        }
    }

    /// Notes whether replicas share, telling the workers (one host call) when it changes.
    fn set_share(&mut self, share: bool) {
        if self.share != Some(share) {
            SharedHost.set(SHARE_KEY, if share { b"1" } else { b"0" }, None);
            if let Some(gauge) = self.sharing_gauge {
                let _ = hostcalls::record_metric(gauge, u64::from(share));
            }
            self.share = Some(share);
        }
        if !share {
            self.uplink.clear();
        }
    }

    fn start_download(&mut self, config: &PollerConfig) {
        let share = match self.share {
            Some(true) => "&share=1",
            Some(false) => "&share=0",
            None => "",
        };
        let cursors: Vec<String> = self
            .cursors
            .iter()
            .map(|(instance, cursor)| format!("{instance}:{cursor}"))
            .collect();
        let path = format!(
            "{}?replica={}&cursors={}{share}&wait_ms={}",
            config.records_path,
            self.replica,
            cursors.join(","),
            config.long_poll_ms
        );
        let timeout = Duration::from_millis(config.long_poll_ms) + CALL_MARGIN;
        self.download = dispatch(config, "GET", &path, None, timeout);
    }

    fn start_upload(&mut self, config: &PollerConfig) {
        if self.upload.is_some() || self.wait_ticks > 0 || self.uplink.is_empty() {
            return;
        }
        let batch = self.uplink.take_batch();
        let path = format!("{}?replica={}", config.records_path, self.replica);
        self.upload = dispatch(config, "POST", &path, Some(&batch), UPLOAD_TIMEOUT);
    }
}

/// Sends one call to the controller; its token, `None` (logged) if the host refused it.
fn dispatch(
    config: &PollerConfig,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Option<u32> {
    let headers = vec![
        (":method", method),
        (":path", path),
        (":authority", config.controller_authority.as_str()),
        ("content-type", "application/octet-stream"),
    ];
    match hostcalls::dispatch_http_call(&config.controller_cluster, headers, body, vec![], timeout)
    {
        Ok(token) => Some(token),
        Err(status) => {
            log::warn!("wasm-epp records: dispatch failed: {status:?}");
            None
        }
    }
}

/// A header of the answer being handled.
fn response_header(name: &str) -> Option<String> {
    hostcalls::get_map_value(MapType::HttpCallResponseHeaders, name)
        .ok()
        .flatten()
}
