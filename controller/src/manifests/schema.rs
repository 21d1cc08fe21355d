//! The typed shape of InferenceObjective and InferenceModelRewrite objects, as files and the
//! Kubernetes API carry them. Unknown fields are errors; the standard server-written fields are
//! accepted and ignored.

use serde::de::IgnoredAny;
use serde::Deserialize;

/// An object: `apiVersion` and `kind` are checked before it is deserialized; `spec` is typed.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct Object<S> {
    #[allow(dead_code)]
    pub(super) api_version: String,
    #[allow(dead_code)]
    pub(super) kind: String,
    pub(super) metadata: Metadata,
    pub(super) spec: S,
    /// Written by Kubernetes; ignored.
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) status: Option<IgnoredAny>,
}

/// `metadata`: name, namespace and creationTimestamp are used; the other standard ObjectMeta
/// fields (as `kubectl get -o yaml` prints them) are accepted and ignored; anything else is an
/// error.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
#[allow(dead_code)]
pub(super) struct Metadata {
    pub(super) name: String,
    #[serde(default)]
    pub(super) namespace: Option<String>,
    #[serde(default)]
    pub(super) creation_timestamp: Option<String>,
    #[serde(default)]
    pub(super) labels: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) annotations: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) uid: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) resource_version: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) generation: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) generate_name: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) managed_fields: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) finalizers: Option<IgnoredAny>,
    #[serde(default)]
    pub(super) owner_references: Option<IgnoredAny>,
}

/// `spec.poolRef`: only the name is used.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct PoolRef {
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) group: Option<String>,
    #[serde(default)]
    #[allow(dead_code)]
    pub(super) kind: Option<String>,
    pub(super) name: String,
}

/// An InferenceObjective's `spec`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct ObjectiveSpec {
    #[serde(default)]
    pub(super) priority: Option<i32>,
    pub(super) pool_ref: PoolRef,
}

/// An InferenceModelRewrite's `spec`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RewriteSpec {
    pub(super) pool_ref: PoolRef,
    #[serde(default)]
    pub(super) rules: Vec<RawRule>,
}

/// One rewrite rule as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    #[serde(default)]
    pub(super) matches: Vec<RawMatch>,
    pub(super) targets: Vec<RawTarget>,
}

/// One `matches` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    pub(super) model: RawModelMatch,
}

/// `matches[].model`: only exact matches exist.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModelMatch {
    #[serde(default, rename = "type")]
    pub(super) match_type: Option<String>,
    pub(super) value: String,
}

/// One `targets` entry.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(super) struct RawTarget {
    pub(super) model_rewrite: String,
    #[serde(default)]
    pub(super) weight: Option<i64>,
}
