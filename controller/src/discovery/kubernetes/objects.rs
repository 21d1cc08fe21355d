//! InferenceObjective and InferenceModelRewrite objects watched in the pool's namespace.
//!
//! Each object becomes one [`Document`] for [`manifests::compile`], the compiler the
//! `--manifests` files use, so API objects and files are validated, filtered by `spec.poolRef`
//! and ordered by the same code.
//! Only `apiVersion`, `kind`, `metadata.{name, namespace, creationTimestamp}` and `spec` are
//! passed on: the server-written metadata and `status` mean nothing to the snapshot. An object
//! the parser rejects is logged and left out; the others still apply.
//!
//! Both API groups are watched. An object of the deprecated group with the same kind and name
//! as one of the current group is left out, so migrating objects to the new group (both
//! present for a while) is not an error.

use std::collections::BTreeSet;

use kube::core::{ApiResource, DynamicObject};
use serde_json::{Map, Value};
use tracing::warn;

use super::listing::Listing;
use crate::manifests::{self, Document, Loaded, ManifestError, PoolSelector};

/// One watched kind in one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watched {
    /// `group/version`.
    pub api_version: &'static str,
    /// The kind.
    pub kind: &'static str,
    /// Its plural resource name.
    pub plural: &'static str,
    /// Whether this is the deprecated group.
    pub deprecated: bool,
}

/// Every watched kind, the current group first.
pub const WATCHED: [Watched; 4] = [
    Watched {
        api_version: manifests::API_VERSION,
        kind: manifests::OBJECTIVE_KIND,
        plural: "inferenceobjectives",
        deprecated: false,
    },
    Watched {
        api_version: manifests::API_VERSION,
        kind: manifests::REWRITE_KIND,
        plural: "inferencemodelrewrites",
        deprecated: false,
    },
    Watched {
        api_version: manifests::DEPRECATED_API_VERSION,
        kind: manifests::OBJECTIVE_KIND,
        plural: "inferenceobjectives",
        deprecated: true,
    },
    Watched {
        api_version: manifests::DEPRECATED_API_VERSION,
        kind: manifests::REWRITE_KIND,
        plural: "inferencemodelrewrites",
        deprecated: true,
    },
];

impl Watched {
    /// The resource for a dynamic `Api`.
    pub fn resource(&self) -> ApiResource {
        let (group, version) = self
            .api_version
            .split_once('/')
            .unwrap_or(("", self.api_version));
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: self.api_version.to_string(),
            kind: self.kind.to_string(),
            plural: self.plural.to_string(),
        }
    }

    /// `inferenceobjectives.llm-d.ai`, as RBAC rules and `kubectl` name it.
    pub fn qualified_plural(&self) -> String {
        let group = self.api_version.split_once('/').map_or("", |(g, _)| g);
        format!("{}.{group}", self.plural)
    }
}

/// The document compiled for `object` (a `kind` object listed from `watched`), or `None`
/// (logged) if it does not compile. `pool` is the pool the objects are filtered for; an object
/// for another pool is valid and is filtered out later.
pub fn document(watched: &Watched, object: DynamicObject, pool: &PoolSelector) -> Option<Document> {
    let name = object.metadata.name.clone().unwrap_or_default();
    let namespace = object
        .metadata
        .namespace
        .clone()
        .unwrap_or_else(|| pool.namespace.clone());
    let mut metadata = Map::new();
    metadata.insert("name".into(), Value::String(name.clone()));
    metadata.insert("namespace".into(), Value::String(namespace.clone()));
    if let Some(created) = &object.metadata.creation_timestamp {
        if let Ok(created) = serde_json::to_value(created) {
            metadata.insert("creationTimestamp".into(), created);
        }
    }
    let mut fields = Map::new();
    fields.insert("apiVersion".into(), watched.api_version.into());
    fields.insert("kind".into(), watched.kind.into());
    fields.insert("metadata".into(), Value::Object(metadata));
    if let Some(spec) = object.data.get("spec") {
        fields.insert("spec".into(), spec.clone());
    }
    let origin = format!(
        "kubernetes {} {namespace}/{name} ({})",
        watched.kind, watched.api_version
    );
    // JSON → YAML value, structurally (every JSON value is a YAML value).
    let value = match serde_yaml::to_value(Value::Object(fields)) {
        Ok(value) => value,
        Err(e) => {
            warn!("{origin}: {e}; ignored");
            return None;
        }
    };
    let document = Document {
        origin,
        number: 1,
        value,
    };
    match manifests::compile([&document], pool) {
        Ok(loaded) => {
            for warning in &loaded.warnings {
                warn!("{warning}");
            }
            Some(document)
        }
        Err(e) => {
            warn!("{e}; ignored");
            None
        }
    }
}

/// The objectives and rewrites of the watched objects: `listings[i]` holds the documents of
/// `WATCHED[i]` by object name (`None` for rejected objects).
pub fn combine(
    listings: &[Listing<Option<Document>>],
    pool: &PoolSelector,
) -> Result<Loaded, ManifestError> {
    let current: BTreeSet<(&str, &str)> = WATCHED
        .iter()
        .zip(listings)
        .filter(|(watched, _)| !watched.deprecated)
        .flat_map(|(watched, listing)| {
            listing
                .objects()
                .keys()
                .map(move |name| (watched.kind, name.as_str()))
        })
        .collect();
    let documents = WATCHED.iter().zip(listings).flat_map(|(watched, listing)| {
        let current = &current;
        listing
            .objects()
            .iter()
            .filter(move |(name, _)| {
                !(watched.deprecated && current.contains(&(watched.kind, name.as_str())))
            })
            .filter_map(|(_, document)| document.as_ref())
    });
    manifests::compile(documents, pool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn pool() -> PoolSelector {
        PoolSelector {
            name: Some("pool".to_string()),
            namespace: "llm".to_string(),
        }
    }

    fn object(name: &str, created: Option<&str>, spec: Value) -> DynamicObject {
        let mut metadata = json!({
            "name": name,
            "namespace": "llm",
            "uid": "0f9c",
            "resourceVersion": "17",
            "generation": 2,
            "managedFields": [{"manager": "kubectl"}],
            "selfLink": "/apis/x",
            "deletionGracePeriodSeconds": 30,
        });
        if let Some(created) = created {
            metadata["creationTimestamp"] = json!(created);
        }
        serde_json::from_value(json!({
            "apiVersion": "llm-d.ai/v1alpha2",
            "kind": "InferenceObjective",
            "metadata": metadata,
            "spec": spec,
            "status": {"conditions": [{"type": "Accepted", "status": "True"}]},
        }))
        .unwrap()
    }

    fn listing(watched: &Watched, objects: Vec<DynamicObject>) -> Listing<Option<Document>> {
        let mut listing = Listing::default();
        listing.apply(Event::Init, |_: &DynamicObject| String::new(), |_| None);
        for object in objects {
            listing.apply(
                Event::InitApply(object),
                |o| o.metadata.name.clone().unwrap_or_default(),
                |o| document(watched, o, &pool()),
            );
        }
        listing.apply(Event::InitDone, |_: &DynamicObject| String::new(), |_| None);
        listing
    }

    #[test]
    fn server_fields_are_dropped_and_objects_for_this_pool_kept() {
        let [objectives, rewrites, old_objectives, old_rewrites] = WATCHED;
        let listings = [
            listing(
                &objectives,
                vec![
                    object(
                        "batch",
                        None,
                        json!({"priority": -1, "poolRef": {"name": "pool"}}),
                    ),
                    object("elsewhere", None, json!({"poolRef": {"name": "other"}})),
                    object(
                        "bad",
                        None,
                        json!({"priority": "high", "poolRef": {"name": "pool"}}),
                    ),
                ],
            ),
            listing(
                &rewrites,
                vec![
                    object(
                        "newer",
                        Some("2026-02-01T00:00:00Z"),
                        json!({"poolRef": {"name": "pool"}, "rules": [{"targets": [{"modelRewrite": "b"}]}]}),
                    ),
                    object(
                        "older",
                        Some("2026-01-01T00:00:00Z"),
                        json!({"poolRef": {"name": "pool"}, "rules": [{"targets": [{"modelRewrite": "a"}]}]}),
                    ),
                ],
            ),
            listing(
                &old_objectives,
                vec![
                    // Shadowed by the current group's object of the same name.
                    object(
                        "batch",
                        None,
                        json!({"priority": 7, "poolRef": {"name": "pool"}}),
                    ),
                    object(
                        "legacy",
                        None,
                        json!({"priority": 3, "poolRef": {"name": "pool"}}),
                    ),
                ],
            ),
            listing(&old_rewrites, vec![]),
        ];
        assert_eq!(listings[0].objects()["bad"], None, "rejected alone");
        let loaded = combine(&listings, &pool()).unwrap();
        let objectives: Vec<_> = loaded
            .manifests
            .objectives
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(objectives, [("batch", -1), ("legacy", 3)]);
        let rewrites: Vec<_> = loaded
            .manifests
            .rewrites
            .iter()
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(rewrites, ["llm/older", "llm/newer"], "oldest first");
        assert_eq!(loaded.ignored, 1, "the object for another pool");
    }

    #[test]
    fn nothing_watched_is_nothing_to_apply() {
        let listings: Vec<Listing<Option<Document>>> =
            WATCHED.iter().map(|_| Listing::default()).collect();
        assert_eq!(combine(&listings, &pool()).unwrap(), Loaded::default());
    }

    #[test]
    fn resources_name_both_groups() {
        let resource = WATCHED[3].resource();
        assert_eq!(resource.group, "inference.networking.x-k8s.io");
        assert_eq!(resource.version, "v1alpha2");
        assert_eq!(resource.kind, "InferenceModelRewrite");
        assert_eq!(
            WATCHED[0].qualified_plural(),
            "inferenceobjectives.llm-d.ai"
        );
    }
}
