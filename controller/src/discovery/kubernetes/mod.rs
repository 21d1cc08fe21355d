//! Kubernetes discovery: the InferencePool named by `--pool-name` in `--pool-namespace`, the
//! Pods of that namespace, and the InferenceObjectives and InferenceModelRewrites there.
//!
//! Every kind is watched (one LIST, then a WATCH that the kube watcher resumes), so a change
//! reaches the store as soon as its event arrives. The endpoints are recomputed from the pool
//! and the pods on each change that matters ([`pool::endpoints`]); the objectives and rewrites
//! go through the `--manifests` parser ([`objects`]). No watch error is fatal ([`retry`]).

pub mod listing;
pub mod objects;
pub mod pool;
pub mod retry;

use std::path::PathBuf;
use std::sync::Arc;

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::DynamicObject;
use kube::runtime::watcher::{self, watcher, Event};
use kube::{Api, Client, Config, ResourceExt};
use tokio::sync::oneshot;
use tracing::{error, info, warn};
use wasm_epp::snapshot::Endpoint;

use self::listing::Listing;
use self::objects::WATCHED;
use self::pool::{InferencePool, PodInfo, Pool};
use crate::manifests::{Document, PoolSelector};
use crate::store::Store;

/// Kubernetes discovery settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeSource {
    /// `--pool-name`.
    pub pool_name: String,
    /// `--pool-namespace`.
    pub namespace: String,
    /// `--kubeconfig`; without it the configuration is inferred (`KUBECONFIG`,
    /// `~/.kube/config`, then the in-cluster service account).
    pub kubeconfig: Option<PathBuf>,
}

/// A [`KubeSource`] with its API client.
pub struct Connected {
    source: KubeSource,
    client: Client,
    server: String,
}

impl KubeSource {
    /// `kubernetes inferencepool <namespace>/<name>`.
    pub fn describe(&self) -> String {
        format!(
            "kubernetes inferencepool {}/{}",
            self.namespace, self.pool_name
        )
    }

    /// Loads the client configuration and builds the client. It does not contact the API
    /// server: an unreachable server shows in the watches' log lines, not here.
    pub async fn connect(self) -> Result<Connected, String> {
        let config = match &self.kubeconfig {
            Some(path) => {
                let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
                let kubeconfig = Kubeconfig::read_from(path).map_err(|e| at(&e))?;
                Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                    .await
                    .map_err(|e| at(&e))?
            }
            None => Config::infer()
                .await
                .map_err(|e| format!("no Kubernetes client configuration (pass --kubeconfig, set KUBECONFIG, or run in a cluster): {e}"))?,
        };
        let server = config.cluster_url.to_string();
        let client = Client::try_from(config)
            .map_err(|e| format!("cannot build the Kubernetes client: {e}"))?;
        Ok(Connected {
            source: self,
            client,
            server,
        })
    }
}

/// One watch event, tagged with the watch it came from.
enum Update {
    Pool(Event<InferencePool>),
    /// Boxed: a Pod is far larger than the other events.
    Pod(Box<Event<Pod>>),
    /// An event of `WATCHED[i]`.
    Object(usize, Event<DynamicObject>),
}

impl Connected {
    /// The API server's URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Watches until the task is dropped, keeping the store's endpoints, objectives and
    /// rewrites current. `synced` is sent once the first complete list of the pool and of the
    /// pods is in the store.
    pub async fn run(self, store: Arc<Store>, synced: oneshot::Sender<()>) {
        let mut updates = futures::stream::select_all(self.watches());
        let mut state = State::new(&self.source);
        let mut synced = Some(synced);
        while let Some(update) = updates.next().await {
            state.apply(update, &store);
            if state.is_synced() {
                if let Some(synced) = synced.take() {
                    let _ = synced.send(());
                }
            }
        }
        error!("kubernetes: every watch ended; endpoints are no longer updated");
    }

    fn watches(&self) -> Vec<BoxStream<'static, Update>> {
        let namespace = &self.source.namespace;
        let config = watcher::Config::default();
        let pools: Api<InferencePool> = Api::namespaced(self.client.clone(), namespace);
        let pool_config = config
            .clone()
            .fields(&format!("metadata.name={}", self.source.pool_name));
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let mut watches = vec![
            retry::resilient(
                format!("inferencepools.inference.networking.k8s.io in {namespace}"),
                watcher(pools, pool_config),
            )
            .map(Update::Pool)
            .boxed(),
            retry::resilient(
                format!("pods in {namespace}"),
                watcher(pods, config.clone()),
            )
            .map(|event| Update::Pod(Box::new(event)))
            .boxed(),
        ];
        for (index, watched) in WATCHED.iter().enumerate() {
            let api: Api<DynamicObject> =
                Api::namespaced_with(self.client.clone(), namespace, &watched.resource());
            watches.push(
                retry::resilient(
                    format!("{} in {namespace}", watched.qualified_plural()),
                    watcher(api, config.clone()),
                )
                .map(move |event| Update::Object(index, event))
                .boxed(),
            );
        }
        watches
    }
}

/// What the watches have seen, and what was last logged about the pool.
struct State {
    namespace: String,
    pool_name: String,
    selector: PoolSelector,
    pools: Listing<Pool>,
    pods: Listing<PodInfo>,
    /// `objects[i]` holds the documents of `WATCHED[i]`.
    objects: Vec<Listing<Option<Document>>>,
    /// The pool as last logged: `None` before the first sync, `Some(None)` when missing.
    logged_pool: Option<Option<Pool>>,
}

impl State {
    fn new(source: &KubeSource) -> State {
        State {
            namespace: source.namespace.clone(),
            pool_name: source.pool_name.clone(),
            selector: PoolSelector {
                name: Some(source.pool_name.clone()),
                namespace: source.namespace.clone(),
            },
            pools: Listing::default(),
            pods: Listing::default(),
            objects: WATCHED.iter().map(|_| Listing::default()).collect(),
            logged_pool: None,
        }
    }

    fn is_synced(&self) -> bool {
        self.pools.is_synced() && self.pods.is_synced()
    }

    fn apply(&mut self, update: Update, store: &Store) {
        match update {
            Update::Pool(event) => {
                if self
                    .pools
                    .apply(event, ResourceExt::name_any, |p| Pool::of(&p))
                {
                    self.apply_endpoints(store);
                }
            }
            Update::Pod(event) => {
                if self
                    .pods
                    .apply(*event, ResourceExt::name_any, |p| PodInfo::of(&p))
                {
                    self.apply_endpoints(store);
                }
            }
            Update::Object(index, event) => {
                let (Some(watched), Some(listing)) =
                    (WATCHED.get(index), self.objects.get_mut(index))
                else {
                    return;
                };
                let selector = &self.selector;
                if listing.apply(event, ResourceExt::name_any, |o| {
                    objects::document(watched, o, selector)
                }) {
                    self.apply_objects(store);
                }
            }
        }
    }

    /// The pool's endpoints; `None` until the pool and the pods have been listed.
    fn endpoints(&self) -> Option<Vec<Endpoint>> {
        if !self.is_synced() {
            return None;
        }
        Some(match self.pools.objects().get(&self.pool_name) {
            Some(pool) => pool::endpoints(&self.namespace, pool, self.pods.objects().values()),
            None => Vec::new(),
        })
    }

    fn apply_endpoints(&mut self, store: &Store) {
        let Some(endpoints) = self.endpoints() else {
            return;
        };
        let pool = self.pools.objects().get(&self.pool_name).cloned();
        if self.logged_pool.as_ref() != Some(&pool) {
            let id = format!("{}/{}", self.namespace, self.pool_name);
            match &pool {
                Some(pool) => info!(
                    "kubernetes: inferencepool {id}: selector {}, target ports {:?}",
                    pool.selector_text(),
                    pool.ports()
                ),
                None => {
                    warn!("kubernetes: inferencepool {id} not found; no endpoints until it exists")
                }
            }
            self.logged_pool = Some(pool);
        }
        let count = endpoints.len();
        if store.set_endpoints(endpoints) {
            info!(
                "kubernetes: inferencepool {}/{}: applied {count} endpoints",
                self.namespace, self.pool_name
            );
        }
    }

    fn apply_objects(&self, store: &Store) {
        match objects::combine(&self.objects, &self.selector) {
            Ok(loaded) => {
                let summary = loaded.summary();
                if store.set_manifests(loaded.manifests) {
                    info!("kubernetes: applied {summary}");
                }
            }
            Err(e) => warn!("{e}; keeping the previous objectives and rewrites"),
        }
    }
}
