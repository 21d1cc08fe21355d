//! Controller replicas relaying prefix records to each other (`--peer`, `--peers-dns`), with
//! no leader: every batch an Envoy uploads to one controller is posted on to every peer as
//! `POST /v1/prefix-records?replica=R&relay=<origin instance>`, which the peer keeps for its
//! own Envoys and does not relay again (nor keep, if it is the origin itself: a peer list
//! from DNS includes the controller's own address). So an Envoy learns the records of every
//! replica whichever controller it polls.
//!
//! Each peer has a sender task reading a bounded broadcast channel: a peer that is slow or
//! away skips what it lagged behind on (counted, logged at most once a minute) instead of
//! growing memory. With `--peers-dns NAME:PORT` (in Kubernetes, the controller's headless
//! Service) the peer set is the name's addresses, resolved again every [`RESOLVE_EVERY`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::records::{Batch, PATH};

/// Batches waiting per peer; beyond it a slow peer skips the oldest.
pub const RELAY_QUEUE: usize = 1_024;
/// How often `--peers-dns` is resolved again.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(10);
/// A relay must be answered within this long.
const RELAY_TIMEOUT: Duration = Duration::from_secs(5);
/// A peer's failures are logged at most once per this period.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// Where the peers come from.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerSettings {
    /// Peer snapshot-API addresses (`host:port`), from `--peer`.
    pub fixed: Vec<String>,
    /// A name whose addresses are the peers (`name:port`), from `--peers-dns`.
    pub dns: Option<String>,
}

impl PeerSettings {
    /// Whether any peer is configured.
    pub fn any(&self) -> bool {
        !self.fixed.is_empty() || self.dns.is_some()
    }
}

type RelayClient = Client<HttpConnector, Full<Bytes>>;

/// Relays every batch sent on `batches` to the peers of `settings` forever; `instance` is this
/// controller's, sent as the batches' origin.
pub async fn run(settings: PeerSettings, instance: String, batches: broadcast::Sender<Batch>) {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(RELAY_TIMEOUT));
    let client: RelayClient = Client::builder(TokioExecutor::new()).build(connector);
    let mut senders: HashMap<String, JoinHandle<()>> = HashMap::new();
    let start = |peer: String, senders: &mut HashMap<String, JoinHandle<()>>| {
        let task = tokio::spawn(relay_to(
            client.clone(),
            peer.clone(),
            instance.clone(),
            batches.subscribe(),
        ));
        info!(%peer, "prefix records: relaying to peer controller {peer}");
        senders.insert(peer, task);
    };
    for peer in &settings.fixed {
        start(peer.clone(), &mut senders);
    }
    let Some(name) = settings.dns else {
        std::future::pending::<()>().await;
        return;
    };
    loop {
        match tokio::net::lookup_host(name.as_str()).await {
            Ok(addrs) => {
                let found: Vec<String> = addrs.map(|a: SocketAddr| a.to_string()).collect();
                senders.retain(|peer, task| {
                    let keep = settings.fixed.contains(peer) || found.contains(peer);
                    if !keep {
                        task.abort();
                        info!(%peer, dns = %name, "prefix records: peer controller {peer} is gone from {name}");
                    }
                    keep
                });
                for peer in found {
                    if !senders.contains_key(&peer) {
                        start(peer, &mut senders);
                    }
                }
            }
            Err(e) => {
                warn!(dns = %name, error = %e, "prefix records: cannot resolve --peers-dns {name}: {e}")
            }
        }
        tokio::time::sleep(RESOLVE_EVERY).await;
    }
}

/// Posts every batch received on `batches` to `peer` (`host:port`), in order.
async fn relay_to(
    client: RelayClient,
    peer: String,
    instance: String,
    mut batches: broadcast::Receiver<Batch>,
) {
    let mut skipped = 0u64;
    let mut failed = 0u64;
    let mut logged: Option<Instant> = None;
    loop {
        let batch = match batches.recv().await {
            Ok(batch) => batch,
            Err(broadcast::error::RecvError::Lagged(n)) => {
                skipped += n;
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        let uri = format!(
            "http://{peer}{PATH}?replica={}&relay={instance}",
            batch.replica
        );
        let request = Request::builder()
            .method(Method::POST)
            .uri(uri)
            .header("content-type", "application/octet-stream")
            .body(Full::new(batch.body));
        let outcome = match request {
            Ok(request) => {
                match tokio::time::timeout(RELAY_TIMEOUT, client.request(request)).await {
                    Ok(Ok(response)) => {
                        let status = response.status();
                        let _ = response.into_body().collect().await;
                        if status == StatusCode::NO_CONTENT {
                            Ok(())
                        } else {
                            Err(format!("answered {status}"))
                        }
                    }
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("timed out".to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = outcome {
            failed += 1;
            let due = logged.is_none_or(|at| at.elapsed() >= LOG_EVERY);
            if due {
                warn!(
                    %peer,
                    %error,
                    failed,
                    skipped,
                    "prefix records: relaying to peer {peer} failed ({error}); {failed} failed, {skipped} skipped so far"
                );
                logged = Some(Instant::now());
            }
        }
    }
}
