//! Endpoint discovery: where the pool's endpoints come from.
//!
//! A file source loads a complete endpoint list at startup (an error there stops the
//! controller) and may then keep the store's list current. A Kubernetes source starts empty and
//! fills the store from its watches; scraping (and so readiness) waits for its first complete
//! list.

pub mod file;
pub mod kubernetes;

use std::sync::Arc;

use tokio::sync::oneshot;
use wasm_epp::snapshot::Endpoint;

use crate::store::Store;

/// A configured discovery source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Upstream `file-discovery`: a YAML/JSON endpoints file.
    File(file::FileSource),
    /// An InferencePool and its Pods, watched through the Kubernetes API.
    Kubernetes(kubernetes::KubeSource),
}

/// A source ready to run: [`Source::connect`] has built what it needs.
pub enum Discovery {
    /// File discovery.
    File(file::FileSource),
    /// Kubernetes discovery, with its API client.
    Kubernetes(kubernetes::Connected),
}

impl Source {
    /// Loads the endpoint list known at startup (with empty metrics): the file's, or none for
    /// Kubernetes, whose watches list the endpoints once running.
    pub fn load(&self) -> Result<Vec<Endpoint>, file::EndpointsFileError> {
        match self {
            Source::File(source) => source.load(),
            Source::Kubernetes(_) => Ok(Vec::new()),
        }
    }

    /// Prepares the source to run: builds the Kubernetes client from its configuration.
    pub async fn connect(self) -> Result<Discovery, String> {
        match self {
            Source::File(source) => Ok(Discovery::File(source)),
            Source::Kubernetes(source) => source.connect().await.map(Discovery::Kubernetes),
        }
    }

    /// The file (or other origin) errors about this source should name.
    pub fn origin(&self) -> String {
        match self {
            Source::File(source) => source.path.display().to_string(),
            Source::Kubernetes(source) => source.describe(),
        }
    }

    /// A short description for the startup log line.
    pub fn describe(&self) -> String {
        match self {
            Source::File(source) => format!(
                "file {}{}",
                source.path.display(),
                if source.watch { " (watched)" } else { "" }
            ),
            Source::Kubernetes(source) => source.describe(),
        }
    }
}

impl Discovery {
    /// Keeps the store's endpoint list current until the task is dropped. `synced` is sent
    /// once the store holds a complete list: at once for a file, after the first LIST for
    /// Kubernetes.
    pub async fn run(self, store: Arc<Store>, synced: oneshot::Sender<()>) {
        match self {
            Discovery::File(source) => {
                let _ = synced.send(());
                source.watch(store).await
            }
            Discovery::Kubernetes(source) => source.run(store, synced).await,
        }
    }
}
