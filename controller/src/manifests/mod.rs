//! InferenceObjective and InferenceModelRewrite objects from a manifests file (`--manifests`).
//!
//! Without Kubernetes, the objects an upstream EPP would watch are read from a multi-document
//! YAML file, or from every `*.yaml` / `*.yml` file of a directory (sorted by file name), and
//! re-read when they change:
//!
//! ```yaml
//! apiVersion: llm-d.ai/v1alpha2
//! kind: InferenceObjective
//! metadata: {name: batch, namespace: llm}
//! spec:
//!   priority: -1                # optional, default 0; negative = sheddable
//!   poolRef: {name: my-pool}    # group and kind optional
//! ---
//! apiVersion: llm-d.ai/v1alpha2
//! kind: InferenceModelRewrite
//! metadata: {name: canary, creationTimestamp: "2026-01-02T03:04:05Z"}
//! spec:
//!   poolRef: {name: my-pool}
//!   rules:
//!   - matches: [{model: {value: llama}}]      # type: Exact (the default and only type)
//!     targets:
//!     - {modelRewrite: llama-v2, weight: 90}
//!     - {modelRewrite: llama-v3, weight: 10}
//! ```
//!
//! Objectives become `snapshot.objectives` (priority by object name); rewrites become
//! `snapshot.rewrites`, oldest `creationTimestamp` first (objects without one after those with
//! one, in file order), named `namespace/name`. With a pool name, only objects whose
//! `spec.poolRef.name` is the pool and whose namespace is the pool's are kept; without one every
//! object is kept whatever its `poolRef`.
//!
//! Jobs: [`source`] reads (and watches) the files and splits them into documents; [`compile`]
//! validates documents, from files or from the Kubernetes API, into [`Manifests`]; [`schema`] is
//! the objects' typed shape.

use std::fmt;

mod compile;
mod schema;
mod source;

pub use compile::{compile, parse_timestamp, Document};
pub use source::{parse, ManifestSource, RawFiles, Startup};

/// The current `apiVersion` of both kinds.
pub const API_VERSION: &str = "llm-d.ai/v1alpha2";

/// The deprecated `apiVersion`, still accepted with a warning.
pub const DEPRECATED_API_VERSION: &str = "inference.networking.x-k8s.io/v1alpha2";

/// The kind carrying a priority.
pub const OBJECTIVE_KIND: &str = "InferenceObjective";

/// The kind carrying model rewrite rules.
pub const REWRITE_KIND: &str = "InferenceModelRewrite";

/// Namespace of the pool (and of objects without one) unless `--pool-namespace` says otherwise.
pub const DEFAULT_POOL_NAMESPACE: &str = "default";

/// Largest target weight.
pub const MAX_WEIGHT: i64 = 1_000_000;

pub use crate::store::Manifests;

/// Which objects are used: the pool this controller serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSelector {
    /// `--pool-name`; `None` keeps every object whatever its `poolRef`.
    pub name: Option<String>,
    /// `--pool-namespace`: the pool's namespace, also assumed for objects without one.
    pub namespace: String,
}

impl Default for PoolSelector {
    fn default() -> Self {
        PoolSelector {
            name: None,
            namespace: DEFAULT_POOL_NAMESPACE.to_string(),
        }
    }
}

/// A parsed set of manifests.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Loaded {
    /// What goes into the snapshot.
    pub manifests: Manifests,
    /// Objects skipped because their `poolRef` names another pool (or namespace).
    pub ignored: usize,
    /// Accepted but worth telling (deprecated apiVersion), one line each.
    pub warnings: Vec<String>,
}

impl Loaded {
    /// `2 objectives, 1 rewrite (3 for other pools ignored)`.
    pub fn summary(&self) -> String {
        let plural = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
        let mut text = format!(
            "{}, {}",
            plural(self.manifests.objectives.len(), "objective"),
            plural(self.manifests.rewrites.len(), "rewrite")
        );
        if self.ignored > 0 {
            text.push_str(&format!(" ({} for other pools ignored)", self.ignored));
        }
        text
    }
}

/// A bad manifests file: one line, `<file>: <message>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestError {
    /// The file (or directory) the message is about.
    pub file: String,
    /// What is wrong, e.g. `document 2 (InferenceObjective "x"): spec.priority: ...`.
    pub message: String,
}

impl ManifestError {
    fn new(file: impl fmt::Display, message: impl Into<String>) -> ManifestError {
        ManifestError {
            file: file.to_string(),
            message: message.into(),
        }
    }
}

impl fmt::Display for ManifestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file, self.message.replace('\n', " "))
    }
}

impl std::error::Error for ManifestError {}

#[cfg(test)]
mod tests;
