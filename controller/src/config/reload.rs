//! The EndpointPickerConfig file, reloaded while the controller runs.
//!
//! The file is re-read every [`POLL_INTERVAL`](crate::discovery::file::POLL_INTERVAL); a new
//! content that compiles replaces the scheduling profile (the next snapshot carries it, and every
//! Envoy follows) and the engines' metric names (the next scrapes use them). A file that does not
//! compile, or cannot be read, is logged once and the running config kept. Endpoint discovery is
//! chosen at start-up: a changed `dataLayer.discovery` is logged as needing a restart, and the
//! rest of the new file still applies.

use std::path::PathBuf;
use std::sync::Arc;

use thiserror::Error;
use tracing::{info, warn};

use super::ConfigError;
use crate::discovery::file::{poll_for_changes, read_limited, ReadError};
use crate::discovery::Source;
use crate::store::Store;

/// Why a changed file is not applied (logged, and the running config kept).
#[derive(Debug, Error)]
enum ReloadError {
    /// The file cannot be read.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// The file is not UTF-8 text.
    #[error("not UTF-8")]
    NotUtf8,
    /// The file does not compile.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

/// Watches `path` forever; `discovery` is the config's discovery at start-up.
pub async fn watch(path: PathBuf, discovery: Option<Source>, store: Arc<Store>) {
    let initial = Some(read_limited(&path));
    let file = path.clone();
    poll_for_changes(
        initial,
        move || read_limited(&file),
        |read: &Result<Vec<u8>, ReadError>| {
            let shown = path.display();
            let compiled = read
                .clone()
                .map_err(ReloadError::Read)
                .and_then(|bytes| {
                    let text = String::from_utf8(bytes).map_err(|_| ReloadError::NotUtf8)?;
                    Ok(super::parse(&text)?)
                });
            match compiled {
                Ok(config) => {
                    if config.discovery != discovery {
                        warn!("{shown}: dataLayer.discovery changed; restart the controller to apply it (the rest of the file is applied)");
                    }
                    for warning in &config.warnings {
                        warn!("{shown}: {warning}");
                    }
                    let summary = super::profile_summary(&config.profile);
                    store.set_config(config.profile, config.engines);
                    info!("{shown}: reloaded; {summary}");
                }
                Err(e) => warn!("{shown}: {e}; keeping the running config"),
            }
        },
    )
    .await
}
