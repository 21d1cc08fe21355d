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

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_yaml::Value;
use wasm_epp::snapshot::{ModelRewrite, RewriteRule, RewriteTarget};

use crate::discovery::file::{poll_for_changes, read_limited};
use crate::log;
use crate::store::Store;

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

/// The files' contents, in the order they are parsed.
pub type RawFiles = Vec<(PathBuf, Vec<u8>)>;

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
    fn new(file: &Path, message: impl Into<String>) -> ManifestError {
        ManifestError {
            file: file.display().to_string(),
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
            .map_err(|e| ManifestError::new(&self.path, format!("cannot open: {e}")))?;
        if !metadata.is_dir() {
            let bytes = read_limited(&self.path).map_err(|e| ManifestError::new(&self.path, e))?;
            return Ok(vec![(self.path.clone(), bytes)]);
        }
        let listing = std::fs::read_dir(&self.path)
            .map_err(|e| ManifestError::new(&self.path, format!("cannot list directory: {e}")))?;
        let mut paths = Vec::new();
        for entry in listing {
            let entry = entry.map_err(|e| {
                ManifestError::new(&self.path, format!("cannot list directory: {e}"))
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
                let bytes = read_limited(&path).map_err(|e| ManifestError::new(&path, e))?;
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
                            log!("{warning}");
                        }
                        let summary = loaded.summary();
                        if store.set_manifests(loaded.manifests) {
                            log!("{}: applied {summary}", self.path.display());
                        }
                    }
                    Err(e) => log!("{e}; keeping the previous manifests"),
                }
            },
        )
        .await
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Object<S> {
    #[allow(dead_code)]
    api_version: String,
    #[allow(dead_code)]
    kind: String,
    metadata: Metadata,
    spec: S,
    /// Written by Kubernetes; ignored.
    #[serde(default)]
    #[allow(dead_code)]
    status: Option<IgnoredAny>,
}

/// `metadata`: name, namespace and creationTimestamp are used; the other standard ObjectMeta
/// fields (as `kubectl get -o yaml` prints them) are accepted and ignored; anything else is an
/// error.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
struct Metadata {
    name: String,
    #[serde(default)]
    namespace: Option<String>,
    #[serde(default)]
    creation_timestamp: Option<String>,
    #[serde(default)]
    labels: Option<IgnoredAny>,
    #[serde(default)]
    annotations: Option<IgnoredAny>,
    #[serde(default)]
    uid: Option<IgnoredAny>,
    #[serde(default)]
    resource_version: Option<IgnoredAny>,
    #[serde(default)]
    generation: Option<IgnoredAny>,
    #[serde(default)]
    generate_name: Option<IgnoredAny>,
    #[serde(default)]
    managed_fields: Option<IgnoredAny>,
    #[serde(default)]
    finalizers: Option<IgnoredAny>,
    #[serde(default)]
    owner_references: Option<IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct PoolRef {
    #[serde(default)]
    #[allow(dead_code)]
    group: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    kind: Option<String>,
    name: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ObjectiveSpec {
    #[serde(default)]
    priority: Option<i32>,
    pool_ref: PoolRef,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RewriteSpec {
    pool_ref: PoolRef,
    #[serde(default)]
    rules: Vec<RawRule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    #[serde(default)]
    matches: Vec<RawMatch>,
    targets: Vec<RawTarget>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMatch {
    model: RawModelMatch,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModelMatch {
    #[serde(default, rename = "type")]
    match_type: Option<String>,
    value: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawTarget {
    model_rewrite: String,
    #[serde(default)]
    weight: Option<i64>,
}

/// Where an object came from, for error messages and ordering.
struct Origin<'a> {
    file: &'a Path,
    /// 1-based document number within the file.
    document: usize,
    label: String,
}

impl Origin<'_> {
    fn error(&self, message: impl fmt::Display) -> ManifestError {
        ManifestError::new(self.file, format!("{}: {message}", self.label))
    }
}

/// A kept rewrite, before sorting.
struct PendingRewrite {
    created: Option<(i64, u32)>,
    sequence: usize,
    rewrite: ModelRewrite,
}

/// Parses and validates the manifests (files in the given order, documents in file order).
/// Errors name the file, the document (counting from 1, empty documents included) and the
/// field.
pub fn parse(files: &[(PathBuf, Vec<u8>)], pool: &PoolSelector) -> Result<Loaded, ManifestError> {
    let mut loaded = Loaded::default();
    // Objective name → where it was defined, for duplicate errors.
    let mut objective_origins: BTreeMap<String, String> = BTreeMap::new();
    let mut rewrite_origins: BTreeMap<String, String> = BTreeMap::new();
    let mut rewrites = Vec::new();
    let mut sequence = 0usize;
    for (file, bytes) in files {
        let text = std::str::from_utf8(bytes)
            .map_err(|e| ManifestError::new(file, format!("not UTF-8: {e}")))?;
        // Two passes over the same text: a loose one to learn each document's kind and name
        // (for messages), and a typed one whose errors carry the field path.
        let loose = serde_yaml::Deserializer::from_str(text);
        let typed = serde_yaml::Deserializer::from_str(text);
        for (index, (loose, typed)) in loose.zip(typed).enumerate() {
            let document = index + 1;
            let value = Value::deserialize(loose)
                .map_err(|e| ManifestError::new(file, format!("document {document}: {e}")))?;
            if value.is_null() {
                continue;
            }
            let kind = value
                .get("kind")
                .and_then(Value::as_str)
                .map(str::to_string);
            let name = value
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str);
            let label = match (&kind, name) {
                (Some(kind), Some(name)) => format!("document {document} ({kind} {name:?})"),
                (Some(kind), None) => format!("document {document} ({kind})"),
                _ => format!("document {document}"),
            };
            let origin = Origin {
                file,
                document,
                label,
            };
            if !value.is_mapping() {
                return Err(origin.error("not a Kubernetes object (expected a mapping)"));
            }
            let kind = match kind.as_deref() {
                Some(kind @ (OBJECTIVE_KIND | REWRITE_KIND)) => kind,
                Some(other) => {
                    return Err(origin.error(format!(
                        "kind: unsupported {other:?} (expected {OBJECTIVE_KIND} or {REWRITE_KIND})"
                    )))
                }
                None if value.get("kind").is_some() => {
                    return Err(origin.error("kind: must be a string"))
                }
                None => return Err(origin.error("kind: missing")),
            };
            match value.get("apiVersion") {
                None => return Err(origin.error("apiVersion: missing")),
                Some(v) => match v.as_str() {
                    Some(API_VERSION) => {}
                    Some(DEPRECATED_API_VERSION) => loaded.warnings.push(format!(
                        "{}: {}: apiVersion {DEPRECATED_API_VERSION:?} is deprecated; use {API_VERSION:?}",
                        file.display(),
                        origin.label
                    )),
                    Some(other) => {
                        return Err(origin.error(format!(
                            "apiVersion: unsupported {other:?} (expected {API_VERSION:?})"
                        )))
                    }
                    None => return Err(origin.error("apiVersion: must be a string")),
                },
            }
            sequence += 1;
            if kind == OBJECTIVE_KIND {
                let object: Object<ObjectiveSpec> =
                    Object::deserialize(typed).map_err(|e| origin.error(e))?;
                let (namespace, name) = identity(&origin, &object.metadata, pool)?;
                validate_pool_ref(&origin, &object.spec.pool_ref)?;
                if let Some(created) = &object.metadata.creation_timestamp {
                    parse_timestamp(created)
                        .map_err(|e| origin.error(format!("metadata.creationTimestamp: {e}")))?;
                }
                if !pool.keeps(&namespace, &object.spec.pool_ref) {
                    loaded.ignored += 1;
                    continue;
                }
                let here = format!("{} document {}", file.display(), origin.document);
                if let Some(first) = objective_origins.insert(name.clone(), here) {
                    return Err(origin.error(format!(
                        "metadata.name: duplicate InferenceObjective {name:?} (first in {first}); objectives are looked up by name, so names must be unique across namespaces"
                    )));
                }
                let priority = object.spec.priority.unwrap_or(0);
                loaded.manifests.objectives.insert(name, priority);
            } else {
                let object: Object<RewriteSpec> =
                    Object::deserialize(typed).map_err(|e| origin.error(e))?;
                let (namespace, name) = identity(&origin, &object.metadata, pool)?;
                validate_pool_ref(&origin, &object.spec.pool_ref)?;
                let created =
                    match &object.metadata.creation_timestamp {
                        Some(text) => Some(parse_timestamp(text).map_err(|e| {
                            origin.error(format!("metadata.creationTimestamp: {e}"))
                        })?),
                        None => None,
                    };
                let rules = object
                    .spec
                    .rules
                    .into_iter()
                    .enumerate()
                    .map(|(i, rule)| convert_rule(&origin, i, rule))
                    .collect::<Result<Vec<_>, _>>()?;
                if !pool.keeps(&namespace, &object.spec.pool_ref) {
                    loaded.ignored += 1;
                    continue;
                }
                let full_name = format!("{namespace}/{name}");
                let here = format!("{} document {}", file.display(), origin.document);
                if let Some(first) = rewrite_origins.insert(full_name.clone(), here) {
                    return Err(origin.error(format!(
                        "metadata.name: duplicate InferenceModelRewrite {full_name:?} (first in {first})"
                    )));
                }
                rewrites.push(PendingRewrite {
                    created,
                    sequence,
                    rewrite: ModelRewrite {
                        name: full_name,
                        rules,
                    },
                });
            }
        }
    }
    rewrites.sort_by(oldest_first);
    loaded.manifests.rewrites = rewrites.into_iter().map(|p| p.rewrite).collect();
    Ok(loaded)
}

/// Objects with a creationTimestamp first, oldest first; then the rest; ties in file order.
fn oldest_first(a: &PendingRewrite, b: &PendingRewrite) -> Ordering {
    let key = |p: &PendingRewrite| (p.created.is_none(), p.created, p.sequence);
    key(a).cmp(&key(b))
}

impl PoolSelector {
    /// Whether an object in `namespace` referencing `pool_ref` belongs to this pool.
    fn keeps(&self, namespace: &str, pool_ref: &PoolRef) -> bool {
        match &self.name {
            None => true,
            Some(name) => pool_ref.name == *name && namespace == self.namespace,
        }
    }
}

/// The object's (namespace, name); a missing namespace is the pool's.
fn identity(
    origin: &Origin<'_>,
    metadata: &Metadata,
    pool: &PoolSelector,
) -> Result<(String, String), ManifestError> {
    if metadata.name.trim().is_empty() {
        return Err(origin.error("metadata.name: must not be empty"));
    }
    let namespace = match metadata.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => ns.to_string(),
        _ => pool.namespace.clone(),
    };
    Ok((namespace, metadata.name.clone()))
}

fn validate_pool_ref(origin: &Origin<'_>, pool_ref: &PoolRef) -> Result<(), ManifestError> {
    if pool_ref.name.trim().is_empty() {
        return Err(origin.error("spec.poolRef.name: must not be empty"));
    }
    Ok(())
}

fn convert_rule(
    origin: &Origin<'_>,
    index: usize,
    rule: RawRule,
) -> Result<RewriteRule, ManifestError> {
    let at = format!("spec.rules[{index}]");
    let mut matches = Vec::with_capacity(rule.matches.len());
    for (j, m) in rule.matches.into_iter().enumerate() {
        let at = format!("{at}.matches[{j}].model");
        match m.model.match_type.as_deref() {
            None | Some("Exact") => {}
            Some(other) => {
                return Err(origin.error(format!(
                    "{at}.type: unsupported {other:?} (only \"Exact\" is supported)"
                )))
            }
        }
        if m.model.value.is_empty() {
            return Err(origin.error(format!("{at}.value: must not be empty")));
        }
        matches.push(m.model.value);
    }
    if rule.targets.is_empty() {
        return Err(origin.error(format!("{at}.targets: must list at least one target")));
    }
    let weighted = rule.targets.iter().filter(|t| t.weight.is_some()).count();
    if weighted != 0 && weighted != rule.targets.len() {
        return Err(origin.error(format!(
            "{at}.targets: either every target or none must have a weight"
        )));
    }
    let mut targets = Vec::with_capacity(rule.targets.len());
    for (j, target) in rule.targets.into_iter().enumerate() {
        let at = format!("{at}.targets[{j}]");
        if target.model_rewrite.is_empty() {
            return Err(origin.error(format!("{at}.modelRewrite: must not be empty")));
        }
        let weight = match target.weight {
            None => None,
            Some(w) if (1..=MAX_WEIGHT).contains(&w) => u32::try_from(w).ok(),
            Some(w) => {
                return Err(origin.error(format!("{at}.weight: {w} is outside 1..{MAX_WEIGHT}")))
            }
        };
        targets.push(RewriteTarget {
            model: target.model_rewrite,
            weight,
        });
    }
    Ok(RewriteRule { matches, targets })
}

/// Parses an RFC 3339 time (`2026-01-02T03:04:05Z`, `2026-01-02T03:04:05.5+02:00`) into
/// (seconds, nanoseconds) since the Unix epoch.
pub fn parse_timestamp(text: &str) -> Result<(i64, u32), String> {
    let time: jiff::Timestamp = text
        .parse()
        .map_err(|_| format!("{text:?} is not an RFC 3339 time (e.g. 2026-01-02T03:04:05Z)"))?;
    // Before the epoch jiff's sub-second part is negative; the pair here counts it forwards.
    let (seconds, nanos) = (time.as_second(), time.subsec_nanosecond());
    let (seconds, nanos) = if nanos < 0 {
        (seconds - 1, nanos + 1_000_000_000)
    } else {
        (seconds, nanos)
    };
    Ok((seconds, u32::try_from(nanos).unwrap_or(0)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "apiVersion: llm-d.ai/v1alpha2\n";

    fn parse_one(text: &str, pool: &PoolSelector) -> Result<Loaded, ManifestError> {
        parse(
            &[(PathBuf::from("manifests.yaml"), text.as_bytes().to_vec())],
            pool,
        )
    }

    fn any_pool() -> PoolSelector {
        PoolSelector::default()
    }

    fn pool(name: &str, namespace: &str) -> PoolSelector {
        PoolSelector {
            name: Some(name.to_string()),
            namespace: namespace.to_string(),
        }
    }

    fn objective(name: &str, extra: &str) -> String {
        format!("{HEADER}kind: InferenceObjective\nmetadata:\n  name: {name}\n{extra}")
    }

    fn rewrite(name: &str, metadata: &str, rules: &str) -> String {
        format!(
            "{HEADER}kind: InferenceModelRewrite\nmetadata:\n  name: {name}\n{metadata}spec:\n  poolRef: {{name: pool}}\n  rules:\n{rules}"
        )
    }

    fn error(text: &str) -> String {
        parse_one(text, &any_pool()).unwrap_err().to_string()
    }

    #[test]
    fn parses_objectives_and_rewrites() {
        let text = format!(
            "{}\n---\n{}\n---\n{}",
            objective(
                "batch",
                "  namespace: llm\nspec:\n  priority: -1\n  poolRef: {group: inference.networking.k8s.io, kind: InferencePool, name: pool}\nstatus:\n  conditions: [{type: Accepted}]\n"
            ),
            objective("plain", "spec:\n  poolRef: {name: pool}\n"),
            rewrite(
                "canary",
                "  namespace: llm\n  labels: {a: b}\n  uid: 1234\n",
                "  - matches:\n    - model: {type: Exact, value: llama}\n    - model: {value: llama-alias}\n    targets:\n    - {modelRewrite: llama-v2, weight: 90}\n    - {modelRewrite: llama-v3, weight: 10}\n  - targets:\n    - modelRewrite: fallback\n"
            ),
        );
        let loaded = parse_one(&text, &any_pool()).unwrap();
        assert!(loaded.warnings.is_empty());
        assert_eq!(loaded.ignored, 0);
        let objectives: Vec<_> = loaded.manifests.objectives.into_iter().collect();
        assert_eq!(
            objectives,
            [("batch".to_string(), -1), ("plain".to_string(), 0)]
        );
        assert_eq!(
            loaded.manifests.rewrites,
            [ModelRewrite {
                name: "llm/canary".to_string(),
                rules: vec![
                    RewriteRule {
                        matches: vec!["llama".to_string(), "llama-alias".to_string()],
                        targets: vec![
                            RewriteTarget {
                                model: "llama-v2".to_string(),
                                weight: Some(90)
                            },
                            RewriteTarget {
                                model: "llama-v3".to_string(),
                                weight: Some(10)
                            },
                        ],
                    },
                    RewriteRule {
                        matches: vec![],
                        targets: vec![RewriteTarget {
                            model: "fallback".to_string(),
                            weight: None
                        }],
                    },
                ],
            }]
        );
    }

    #[test]
    fn empty_documents_and_files_are_skipped() {
        let loaded = parse_one("", &any_pool()).unwrap();
        assert_eq!(loaded.manifests, Manifests::default());
        let loaded = parse_one("# nothing\n---\n---\n", &any_pool()).unwrap();
        assert_eq!(loaded.manifests, Manifests::default());
        let text = format!(
            "---\n# comment only\n---\n{}",
            objective("x", "spec:\n  poolRef: {name: p}\n  priority: 3\n")
        );
        assert_eq!(
            parse_one(&text, &any_pool()).unwrap().manifests.objectives["x"],
            3
        );
    }

    #[test]
    fn the_deprecated_api_version_is_accepted_with_a_warning() {
        let text = objective("x", "spec:\n  poolRef: {name: p}\n").replace(
            "llm-d.ai/v1alpha2",
            "inference.networking.x-k8s.io/v1alpha2",
        );
        let loaded = parse_one(&text, &any_pool()).unwrap();
        assert_eq!(loaded.manifests.objectives["x"], 0);
        assert_eq!(
            loaded.warnings,
            ["manifests.yaml: document 1 (InferenceObjective \"x\"): apiVersion \"inference.networking.x-k8s.io/v1alpha2\" is deprecated; use \"llm-d.ai/v1alpha2\""]
        );
    }

    #[test]
    fn errors_name_file_document_and_field() {
        let ok = objective("ok", "spec:\n  poolRef: {name: p}\n");
        let with_ok = |bad: &str| format!("{ok}---\n{bad}");
        for (text, expected) in [
            (
                with_ok(&objective("x", "spec:\n  priority: high\n  poolRef: {name: p}\n")),
                "manifests.yaml: document 2 (InferenceObjective \"x\"): spec.priority: invalid type: string \"high\", expected i32",
            ),
            (
                objective("x", "spec:\n  priority: 3000000000\n  poolRef: {name: p}\n"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): spec.priority: invalid value: integer `3000000000`, expected i32",
            ),
            (
                objective("x", "spec:\n  priority: 1\n  poolRef: {name: p}\n  criticality: Critical\n"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): spec: unknown field `criticality`",
            ),
            (
                objective("x", "spec:\n  priority: 1\n"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): spec: missing field `poolRef`",
            ),
            (
                objective("x", "spec:\n  poolRef: {name: ''}\n"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): spec.poolRef.name: must not be empty",
            ),
            (
                objective("x", "  bogus: 1\nspec:\n  poolRef: {name: p}\n"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): metadata: unknown field `bogus`",
            ),
            (
                objective("x", "  creationTimestamp: yesterday\nspec:\n  poolRef: {name: p}\n"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): metadata.creationTimestamp: \"yesterday\" is not an RFC 3339 time",
            ),
            (
                format!("{HEADER}kind: InferenceObjective\nspec:\n  poolRef: {{name: p}}\n"),
                "manifests.yaml: document 1 (InferenceObjective): missing field `metadata`",
            ),
            (
                with_ok(&format!("{HEADER}kind: InferencePool\nmetadata: {{name: p}}\n")),
                "manifests.yaml: document 2 (InferencePool \"p\"): kind: unsupported \"InferencePool\" (expected InferenceObjective or InferenceModelRewrite)",
            ),
            (
                format!("{HEADER}metadata: {{name: p}}\n"),
                "manifests.yaml: document 1: kind: missing",
            ),
            (
                objective("x", "spec:\n  poolRef: {name: p}\n").replace("llm-d.ai/v1alpha2", "v1"),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): apiVersion: unsupported \"v1\" (expected \"llm-d.ai/v1alpha2\")",
            ),
            (
                "kind: InferenceObjective\nmetadata: {name: x}\nspec: {poolRef: {name: p}}\n".to_string(),
                "manifests.yaml: document 1 (InferenceObjective \"x\"): apiVersion: missing",
            ),
            (
                "- a\n- b\n".to_string(),
                "manifests.yaml: document 1: not a Kubernetes object",
            ),
            (
                with_ok("kind: [unclosed\n"),
                "manifests.yaml: document 2: ",
            ),
            (
                format!(
                    "{}---\n{}",
                    objective("dup", "  namespace: a\nspec:\n  poolRef: {name: p}\n"),
                    objective("dup", "  namespace: b\nspec:\n  poolRef: {name: p}\n")
                ),
                "manifests.yaml: document 2 (InferenceObjective \"dup\"): metadata.name: duplicate InferenceObjective \"dup\" (first in manifests.yaml document 1)",
            ),
        ] {
            let got = error(&text);
            assert!(got.starts_with(expected), "{text:?}\n got: {got}\nwant: {expected}");
            assert!(!got.contains('\n'), "{got:?}");
        }
    }

    #[test]
    fn rewrite_validation() {
        let targets = "    targets: [{modelRewrite: t}]\n";
        for (rules, expected) in [
            (
                format!("  - matches: [{{model: {{type: RegularExpression, value: 'l.*'}}}}]\n{targets}"),
                "spec.rules[0].matches[0].model.type: unsupported \"RegularExpression\" (only \"Exact\" is supported)",
            ),
            (
                format!("  - matches: [{{model: {{value: ''}}}}]\n{targets}"),
                "spec.rules[0].matches[0].model.value: must not be empty",
            ),
            (
                "  - matches: [{model: {value: m}}]\n".to_string(),
                "spec.rules[0]: missing field `targets`",
            ),
            (
                format!("{targets}  - targets: []\n").replacen("    targets", "  - targets", 1),
                "spec.rules[1].targets: must list at least one target",
            ),
            (
                "  - targets: [{modelRewrite: a, weight: 1}, {modelRewrite: b}]\n".to_string(),
                "spec.rules[0].targets: either every target or none must have a weight",
            ),
            (
                "  - targets: [{modelRewrite: a, weight: 0}]\n".to_string(),
                "spec.rules[0].targets[0].weight: 0 is outside 1..1000000",
            ),
            (
                "  - targets: [{modelRewrite: a, weight: 1000001}]\n".to_string(),
                "spec.rules[0].targets[0].weight: 1000001 is outside 1..1000000",
            ),
            (
                "  - targets: [{modelRewrite: ''}]\n".to_string(),
                "spec.rules[0].targets[0].modelRewrite: must not be empty",
            ),
            (
                "  - targets: [{model: a}]\n".to_string(),
                "spec.rules[0].targets[0]: unknown field `model`",
            ),
            (
                "  - targets: [{modelRewrite: a, weight: heavy}]\n".to_string(),
                "spec.rules[0].targets[0].weight: invalid type",
            ),
        ] {
            let got = error(&rewrite("r", "", &rules));
            let expected =
                format!("manifests.yaml: document 1 (InferenceModelRewrite \"r\"): {expected}");
            assert!(got.starts_with(&expected), "{rules:?}\n got: {got}\nwant: {expected}");
        }
        // Both weight limits are accepted.
        let loaded = parse_one(
            &rewrite(
                "r",
                "",
                "  - targets: [{modelRewrite: a, weight: 1}, {modelRewrite: b, weight: 1000000}]\n",
            ),
            &any_pool(),
        )
        .unwrap();
        let weights: Vec<_> = loaded.manifests.rewrites[0].rules[0]
            .targets
            .iter()
            .map(|t| t.weight)
            .collect();
        assert_eq!(weights, [Some(1), Some(1_000_000)]);
    }

    #[test]
    fn rewrites_are_sorted_oldest_first_then_in_file_order() {
        let rules = "  - targets: [{modelRewrite: t}]\n";
        let docs = [
            rewrite("no-ts-1", "", rules),
            rewrite(
                "new",
                "  creationTimestamp: \"2026-03-01T00:00:00Z\"\n",
                rules,
            ),
            rewrite("old", "  creationTimestamp: 2025-01-01T00:00:00Z\n", rules),
            rewrite("no-ts-2", "", rules),
            // The same instant as "new", written with an offset: file order breaks the tie.
            rewrite(
                "same-as-new",
                "  creationTimestamp: \"2026-03-01T02:00:00+02:00\"\n",
                rules,
            ),
            rewrite(
                "middle",
                "  creationTimestamp: \"2025-06-01T12:00:00.5Z\"\n",
                rules,
            ),
        ];
        let loaded = parse_one(&docs.join("---\n"), &any_pool()).unwrap();
        let names: Vec<_> = loaded
            .manifests
            .rewrites
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(
            names,
            [
                "default/old",
                "default/middle",
                "default/new",
                "default/same-as-new",
                "default/no-ts-1",
                "default/no-ts-2"
            ]
        );
    }

    #[test]
    fn file_order_spans_files() {
        let rules = "  - targets: [{modelRewrite: t}]\n";
        let files = vec![
            (
                PathBuf::from("a.yaml"),
                rewrite("first", "", rules).into_bytes(),
            ),
            (
                PathBuf::from("b.yaml"),
                rewrite("second", "", rules).into_bytes(),
            ),
        ];
        let loaded = parse(&files, &any_pool()).unwrap();
        let names: Vec<_> = loaded
            .manifests
            .rewrites
            .iter()
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(names, ["default/first", "default/second"]);
        // Errors name the file they are in.
        let files = vec![
            files[0].clone(),
            (PathBuf::from("b.yaml"), b"kind: Pod\n".to_vec()),
        ];
        let err = parse(&files, &any_pool()).unwrap_err();
        assert_eq!(err.file, "b.yaml");
        assert!(
            err.message
                .starts_with("document 1 (Pod): kind: unsupported"),
            "{err}"
        );
    }

    #[test]
    fn pool_ref_filtering() {
        let objectives = [
            objective("mine", "spec:\n  poolRef: {name: pool}\n  priority: 1\n"),
            objective(
                "mine-explicit-ns",
                "  namespace: llm\nspec:\n  poolRef: {name: pool}\n",
            ),
            objective("other-pool", "spec:\n  poolRef: {name: other}\n"),
            objective(
                "other-ns",
                "  namespace: elsewhere\nspec:\n  poolRef: {name: pool}\n",
            ),
        ]
        .join("---\n");
        let rewrites = [
            rewrite("r-mine", "", "  - targets: [{modelRewrite: t}]\n"),
            rewrite("r-other", "", "  - targets: [{modelRewrite: t}]\n")
                .replace("poolRef: {name: pool}", "poolRef: {name: other}"),
        ]
        .join("---\n");
        let text = format!("{objectives}---\n{rewrites}");

        // Without a pool name everything is kept.
        let loaded = parse_one(&text, &any_pool()).unwrap();
        assert_eq!(loaded.manifests.objectives.len(), 4);
        assert_eq!(loaded.manifests.rewrites.len(), 2);
        assert_eq!(loaded.ignored, 0);

        // A pool in `llm`: objects without a namespace are taken to be in the pool's.
        let loaded = parse_one(&text, &pool("pool", "llm")).unwrap();
        let names: Vec<_> = loaded.manifests.objectives.keys().cloned().collect();
        assert_eq!(names, ["mine", "mine-explicit-ns"]);
        let names: Vec<_> = loaded
            .manifests
            .rewrites
            .iter()
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(names, ["llm/r-mine"]);
        assert_eq!(loaded.ignored, 3);
        assert_eq!(
            loaded.summary(),
            "2 objectives, 1 rewrite (3 for other pools ignored)"
        );

        // Duplicates in other pools are not an error once filtered out.
        let text = format!(
            "{}---\n{}",
            objective("dup", "spec:\n  poolRef: {name: pool}\n"),
            objective("dup", "  namespace: b\nspec:\n  poolRef: {name: pool}\n")
        );
        assert!(parse_one(&text, &any_pool()).is_err());
        let loaded = parse_one(&text, &pool("pool", "default")).unwrap();
        assert_eq!(loaded.manifests.objectives.len(), 1);
        // Objects for other pools are still validated.
        let text = objective("x", "spec:\n  poolRef: {name: other}\n  priority: high\n");
        assert!(parse_one(&text, &pool("pool", "default")).is_err());
    }

    #[test]
    fn duplicate_rewrites_are_errors() {
        let rules = "  - targets: [{modelRewrite: t}]\n";
        let text = format!(
            "{}---\n{}",
            rewrite("r", "", rules),
            rewrite("r", "", rules)
        );
        assert!(error(&text).contains("duplicate InferenceModelRewrite \"default/r\""));
        let text = format!(
            "{}---\n{}",
            rewrite("r", "", rules),
            rewrite("r", "  namespace: other\n", rules)
        );
        assert_eq!(
            parse_one(&text, &any_pool())
                .unwrap()
                .manifests
                .rewrites
                .len(),
            2
        );
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Ok((0, 0)));
        assert_eq!(
            parse_timestamp("2000-02-29T12:34:56.789Z"),
            Ok((951_827_696, 789_000_000))
        );
        assert_eq!(
            parse_timestamp("2000-02-29T14:34:56+02:00"),
            Ok((951_827_696, 0))
        );
        assert_eq!(
            parse_timestamp("2000-02-29T11:34:56.123456789-01:00"),
            Ok((951_827_696, 123_456_789))
        );
        assert_eq!(parse_timestamp("1969-12-31T23:59:59z"), Ok((-1, 0)));
        // RFC 3339 allows a space for the T; ISO 8601's basic offset is taken too.
        assert_eq!(parse_timestamp("1970-01-01 00:00:01Z"), Ok((1, 0)));
        assert_eq!(parse_timestamp("1970-01-01T01:00:00+0100"), Ok((0, 0)));
        assert_eq!(
            parse_timestamp("1969-12-31T23:59:59.25Z"),
            Ok((-1, 250_000_000))
        );
        for bad in [
            "",
            "2024-01-01",
            "2024-01-01T00:00:00",
            "2024-13-01T00:00:00Z",
            "2023-02-29T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-01-01T00:00:00.Z",
            "2024-01-01T00:00:00Zjunk",
            "2024-1-01T00:00:00Z",
        ] {
            assert!(parse_timestamp(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn reads_a_directory_sorted_and_skips_other_files() {
        let dir = std::env::temp_dir().join(format!("wasm-epp-manifests-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("sub.yaml")).unwrap();
        let rules = "  - targets: [{modelRewrite: t}]\n";
        std::fs::write(dir.join("b.yml"), rewrite("b", "", rules)).unwrap();
        std::fs::write(dir.join("a.yaml"), rewrite("a", "", rules)).unwrap();
        std::fs::write(dir.join("c.json"), "not yaml: [").unwrap();
        std::fs::write(dir.join(".hidden.yaml"), "kind: Pod\n").unwrap();
        let source = ManifestSource {
            path: dir.clone(),
            pool: any_pool(),
        };
        let startup = source.clone().load().unwrap();
        let files: Vec<_> = startup.files.iter().map(|(p, _)| p.clone()).collect();
        assert_eq!(files, [dir.join("a.yaml"), dir.join("b.yml")]);
        let names: Vec<_> = startup
            .loaded
            .manifests
            .rewrites
            .iter()
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(names, ["default/a", "default/b"]);
        assert!(startup.describe().contains("0 objectives, 2 rewrites"));

        // A single file works too; a missing path is an error naming it.
        let single = ManifestSource {
            path: dir.join("a.yaml"),
            pool: any_pool(),
        };
        assert_eq!(single.load().unwrap().loaded.manifests.rewrites.len(), 1);
        let missing = ManifestSource {
            path: dir.join("missing.yaml"),
            pool: any_pool(),
        };
        let err = missing.load().unwrap_err();
        assert!(
            err.to_string().contains("missing.yaml: cannot open"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
