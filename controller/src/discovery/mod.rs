//! Endpoint discovery: where the pool's endpoints come from.
//!
//! Every source loads a complete endpoint list once at startup (an error there stops the
//! controller) and may then keep the store's list current. Only file discovery exists so far;
//! a Kubernetes InferencePool source becomes another [`Source`] variant.

pub mod file;

use std::sync::Arc;

use wasm_epp::snapshot::Endpoint;

use crate::store::Store;

/// A configured discovery source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// Upstream `file-discovery`: a YAML/JSON endpoints file.
    File(file::FileSource),
}

impl Source {
    /// Loads the current endpoint list (with empty metrics).
    pub fn load(&self) -> Result<Vec<Endpoint>, String> {
        match self {
            Source::File(source) => source.load(),
        }
    }

    /// Keeps the store's endpoint list current until the task is dropped; returns at once for
    /// sources that do not watch.
    pub async fn watch(self, store: Arc<Store>) {
        match self {
            Source::File(source) => source.watch(store).await,
        }
    }

    /// The file (or other origin) errors about this source should name.
    pub fn origin(&self) -> String {
        match self {
            Source::File(source) => source.path.display().to_string(),
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
        }
    }
}
