//! Documents → [`Manifests`]: validation, `spec.poolRef` filtering and rewrite ordering, the
//! same for files and for objects from the Kubernetes API.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use serde::Deserialize;
use serde_yaml::Value;
use wasm_epp::snapshot::{ModelRewrite, RewriteRule, RewriteTarget};

use super::schema::{Metadata, Object, ObjectiveSpec, PoolRef, RawRule, RewriteSpec};
use super::{
    Loaded, ManifestError, PoolSelector, API_VERSION, DEPRECATED_API_VERSION, MAX_WEIGHT,
    OBJECTIVE_KIND, REWRITE_KIND,
};

/// One object to compile and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    /// What errors name as the file: a path, or `kubernetes <kind> <namespace>/<name> (…)`.
    pub origin: String,
    /// 1-based number within its origin, empty documents counted.
    pub number: usize,
    /// The object; `Null` (an empty document) is skipped.
    pub value: Value,
}

/// Where an object came from, for error messages.
struct Origin<'a> {
    document: &'a Document,
    label: String,
}

impl Origin<'_> {
    fn error(&self, message: impl fmt::Display) -> ManifestError {
        ManifestError::new(&self.document.origin, format!("{}: {message}", self.label))
    }

    /// `<origin> document <n>`, for duplicate errors.
    fn place(&self) -> String {
        format!("{} document {}", self.document.origin, self.document.number)
    }
}

/// Deserializes `value` as `T`; an error names the field path (`spec.priority: …`). An
/// unknown field is reported at the object that holds it (`spec: unknown field …`).
fn typed<'v, T: Deserialize<'v>>(
    origin: &Origin<'_>,
    value: &'v Value,
) -> Result<T, ManifestError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let mut path = e.path().to_string();
        let message = e.into_inner().to_string();
        if message.starts_with("unknown field") {
            path.truncate(path.rfind('.').unwrap_or(0));
        }
        if path.is_empty() || path == "." {
            origin.error(message)
        } else {
            origin.error(format!("{path}: {message}"))
        }
    })
}

/// A kept rewrite, before sorting.
struct PendingRewrite {
    created: Option<(i64, u32)>,
    sequence: usize,
    rewrite: ModelRewrite,
}

/// Validates `documents` (in order) and keeps the objects of `pool`. Errors name the origin,
/// the document and the field.
pub fn compile<'d>(
    documents: impl IntoIterator<Item = &'d Document>,
    pool: &PoolSelector,
) -> Result<Loaded, ManifestError> {
    let mut loaded = Loaded::default();
    // Objective name → where it was defined, for duplicate errors.
    let mut objective_origins: BTreeMap<String, String> = BTreeMap::new();
    let mut rewrite_origins: BTreeMap<String, String> = BTreeMap::new();
    let mut rewrites = Vec::new();
    let mut sequence = 0usize;
    for document in documents {
        let value = &document.value;
        let number = document.number;
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
            (Some(kind), Some(name)) => format!("document {number} ({kind} {name:?})"),
            (Some(kind), None) => format!("document {number} ({kind})"),
            _ => format!("document {number}"),
        };
        let origin = Origin { document, label };
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
                        document.origin,
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
            let object: Object<ObjectiveSpec> = typed(&origin, value)?;
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
            let here = origin.place();
            if let Some(first) = objective_origins.insert(name.clone(), here) {
                return Err(origin.error(format!(
                        "metadata.name: duplicate InferenceObjective {name:?} (first in {first}); objectives are looked up by name, so names must be unique across namespaces"
                    )));
            }
            let priority = object.spec.priority.unwrap_or(0);
            loaded.manifests.objectives.insert(name, priority);
        } else {
            let object: Object<RewriteSpec> = typed(&origin, value)?;
            let (namespace, name) = identity(&origin, &object.metadata, pool)?;
            validate_pool_ref(&origin, &object.spec.pool_ref)?;
            let created = match &object.metadata.creation_timestamp {
                Some(text) => Some(
                    parse_timestamp(text)
                        .map_err(|e| origin.error(format!("metadata.creationTimestamp: {e}")))?,
                ),
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
            let here = origin.place();
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
