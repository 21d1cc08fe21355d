//! The `--manifests` files: read (one file, or a directory's YAML files), split into
//! documents, compiled, and watched for changes.

use std::path::PathBuf;
use std::sync::Arc;

use serde::Deserialize;
use serde_yaml::Value;
use tracing::{info, warn};

use super::compile::{compile, Document};
use super::{Loaded, ManifestError, PoolSelector};
use crate::discovery::file::{poll_for_changes, read_limited};
use crate::store::Store;

/// The files' contents, in the order they are parsed.
pub type RawFiles = Vec<(PathBuf, Vec<u8>)>;

/// The `--manifests` source: a file or a directory, always watched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestSource {
    /// The file or directory.
    pub path: PathBuf,
    /// Which objects are kept.
    pub pool: PoolSelector,
}

/// The manifests as loaded at startup, with the contents the watcher starts from.
#[derive(Debug, Clone, PartialEq)]
pub struct Startup {
    /// Where they come from.
    pub source: ManifestSource,
    /// The contents that were parsed.
    pub files: RawFiles,
    /// The result.
    pub loaded: Loaded,
}

impl Startup {
    /// A short description for the startup log.
    pub fn describe(&self) -> String {
        let pool = match &self.source.pool.name {
            Some(name) => format!("pool {}/{name}", self.source.pool.namespace),
            None => "any pool".to_string(),
        };
        format!(
            "{} (watched, {pool}): {}",
            self.source.path.display(),
            self.loaded.summary()
        )
    }
}

impl ManifestSource {
    /// Reads the file, or every `*.yaml`/`*.yml` file of the directory (sorted by name; hidden
    /// files skipped). Each file is limited to 1 MiB.
    pub fn read(&self) -> Result<RawFiles, ManifestError> {
        let metadata = std::fs::metadata(&self.path)
            .map_err(|e| ManifestError::new(self.path.display(), format!("cannot open: {e}")))?;
        if !metadata.is_dir() {
            let bytes = read_limited(&self.path)
                .map_err(|e| ManifestError::new(self.path.display(), e.to_string()))?;
            return Ok(vec![(self.path.clone(), bytes)]);
        }
        let listing = std::fs::read_dir(&self.path).map_err(|e| {
            ManifestError::new(self.path.display(), format!("cannot list directory: {e}"))
        })?;
        let mut paths = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| {
                ManifestError::new(self.path.display(), format!("cannot list directory: {e}"))
            })?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            // Follows symlinks (a mounted ConfigMap's files are links); skips directories.
            if !name.starts_with('.')
                && (name.ends_with(".yaml") || name.ends_with(".yml"))
                && path.is_file()
            {
                paths.push((name, path));
            }
        }
        paths.sort();
        paths
            .into_iter()
            .map(|(_, path)| {
                let bytes = read_limited(&path)
                    .map_err(|e| ManifestError::new(path.display(), e.to_string()))?;
                Ok((path, bytes))
            })
            .collect()
    }

    /// Reads and parses the manifests.
    pub fn load(self) -> Result<Startup, ManifestError> {
        let files = self.read()?;
        let loaded = parse(&files, &self.pool)?;
        Ok(Startup {
            source: self,
            files,
            loaded,
        })
    }

    /// Re-reads the manifests every 250 ms; each new, valid content is applied to the store
    /// (publishing a snapshot when objectives or rewrites change). A bad or unreadable file is
    /// logged once and the last good manifests kept. `initial` is the content loaded at startup.
    pub async fn watch(self, store: Arc<Store>, initial: RawFiles) {
        let source = self.clone();
        poll_for_changes(
            Some(Ok(initial)),
            move || source.read(),
            |read: &Result<RawFiles, ManifestError>| {
                let parsed = match read {
                    Ok(files) => parse(files, &self.pool),
                    Err(e) => Err(e.clone()),
                };
                match parsed {
                    Ok(loaded) => {
                        for warning in &loaded.warnings {
                            warn!("{warning}");
                        }
                        let summary = loaded.summary();
                        if store.set_manifests(loaded.manifests) {
                            info!("{}: applied {summary}", self.path.display());
                        }
                    }
                    Err(e) => warn!("{e}; keeping the previous manifests"),
                }
            },
        )
        .await
    }
}

/// Parses and validates the manifests (files in the given order, documents in file order).
/// Errors name the file, the document (counting from 1, empty documents included) and the
/// field.
pub fn parse(files: &[(PathBuf, Vec<u8>)], pool: &PoolSelector) -> Result<Loaded, ManifestError> {
    let mut documents = Vec::new();
    for (file, bytes) in files {
        let origin = file.display().to_string();
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ManifestError::new(&origin, format!("not UTF-8: {e}")))?;
        for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
            let number = index + 1;
            let value = Value::deserialize(document)
                .map_err(|e| ManifestError::new(&origin, format!("document {number}: {e}")))?;
            documents.push(Document {
                origin: origin.clone(),
                number,
                value,
            });
        }
    }
    compile(&documents, pool)
}
