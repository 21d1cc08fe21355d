//! EDS over Envoy's REST-JSON xDS protocol (`POST /v3/discovery:endpoints` on `--listen`).
//!
//! Envoy's `envoy.load_balancing_policies.override_host` policy walks the hosts listed in
//! `x-gateway-destination-endpoint` (primary, then fallbacks on retry), but only accepts hosts
//! that are members of the cluster. This module gives an `EDS` cluster (`api_type: REST`) its
//! membership: every endpoint of the current snapshot, as one `ClusterLoadAssignment` per
//! requested resource name (default [`DEFAULT_CLUSTER`]).
//!
//! Envoy's REST subscription POSTs a JSON `DiscoveryRequest` every `refresh_delay` (plus
//! jitter) and expects 200 with a JSON `DiscoveryResponse`, or 304 for "nothing new"
//! (Envoy's `RestApiFetcher` treats 304 as a completed fetch without an update; any other
//! status counts as a failure). The `version_info` is a hash of the sorted `ip:port` list and
//! the requested names, so scrapes that only change metrics do not touch Envoy's membership;
//! a request whose `version_info` equals the current one gets 304 with an empty body.

use bytes::Bytes;
use hyper::header::{HeaderValue, CACHE_CONTROL};
use hyper::StatusCode;
use serde::Deserialize;
use serde_json::{json, Value};
use wasm_epp::snapshot::Snapshot;

use crate::http::{self, Reply};

/// The path Envoy's REST EDS subscription POSTs to.
pub const PATH: &str = "/v3/discovery:endpoints";
/// The resource type served.
pub const TYPE_URL: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// The cluster name answered for a request that names no resources.
pub const DEFAULT_CLUSTER: &str = "inference_pool";
/// The largest `DiscoveryRequest` body accepted (Envoy's carries its node, a few KiB).
pub const MAX_REQUEST_BYTES: usize = 1 << 20;

/// The parts of a `DiscoveryRequest` the answer depends on. Unknown fields (`node`,
/// `response_nonce`, `error_detail`, …) are ignored; proto-JSON camelCase names are accepted
/// too.
#[derive(Debug, Default, Clone, PartialEq, Deserialize)]
#[serde(default)]
pub struct DiscoveryRequest {
    /// The version the client last accepted (`""` on the first request).
    #[serde(alias = "versionInfo")]
    pub version_info: String,
    /// The cluster names wanted (EDS `service_name`s).
    #[serde(alias = "resourceNames")]
    pub resource_names: Vec<String>,
    /// The resource type; empty or [`TYPE_URL`].
    #[serde(alias = "typeUrl")]
    pub type_url: String,
}

impl DiscoveryRequest {
    /// Decodes a request body; an empty body is an empty request.
    pub fn from_json(body: &[u8]) -> Result<DiscoveryRequest, String> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(DiscoveryRequest::default());
        }
        let request: DiscoveryRequest =
            serde_json::from_slice(body).map_err(|e| format!("bad DiscoveryRequest: {e}"))?;
        if !request.type_url.is_empty() && request.type_url != TYPE_URL {
            return Err(format!(
                "type_url {:?} is not served here (only {TYPE_URL})",
                request.type_url
            ));
        }
        Ok(request)
    }

    /// The requested names, sorted and deduplicated; [`DEFAULT_CLUSTER`] when none.
    pub fn cluster_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .resource_names
            .iter()
            .filter(|name| !name.is_empty())
            .cloned()
            .collect();
        names.sort();
        names.dedup();
        if names.is_empty() {
            names.push(DEFAULT_CLUSTER.to_string());
        }
        names
    }
}

/// The cluster membership of `snapshot`: every endpoint's `(address, port)`, sorted, without
/// duplicates.
pub fn members(snapshot: &Snapshot) -> Vec<(String, u16)> {
    let mut members: Vec<(String, u16)> = snapshot
        .endpoints
        .iter()
        .map(|endpoint| (endpoint.address.clone(), endpoint.port))
        .collect();
    members.sort();
    members.dedup();
    members
}

/// The `version_info` for `members` served under `names`: 16 hex digits of a 64-bit FNV-1a
/// hash, the same in every process for the same input.
pub fn version(members: &[(String, u16)], names: &[String]) -> String {
    let mut hash = Fnv1a::new();
    for (address, port) in members {
        hash.write(address.as_bytes());
        hash.write(b":");
        hash.write(port.to_string().as_bytes());
        hash.write(b"\n");
    }
    hash.write(b"\0");
    for name in names {
        hash.write(name.as_bytes());
        hash.write(b"\n");
    }
    format!("{:016x}", hash.0)
}

/// The `DiscoveryResponse` for `request` from `snapshot`, with its version.
pub fn response(snapshot: &Snapshot, request: &DiscoveryRequest) -> (String, Value) {
    let members = members(snapshot);
    let names = request.cluster_names();
    let version = version(&members, &names);
    let lb_endpoints: Vec<Value> = members
        .iter()
        .map(|(address, port)| {
            json!({"endpoint": {"address": {"socket_address": {
                "address": address,
                "port_value": port,
            }}}})
        })
        .collect();
    let endpoints = if lb_endpoints.is_empty() {
        json!([])
    } else {
        json!([{ "lb_endpoints": lb_endpoints }])
    };
    let resources: Vec<Value> = names
        .iter()
        .map(|name| {
            json!({
                "@type": TYPE_URL,
                "cluster_name": name,
                "endpoints": endpoints,
            })
        })
        .collect();
    let body = json!({
        "version_info": version,
        "type_url": TYPE_URL,
        "resources": resources,
    });
    (version, body)
}

/// Answers one `POST` [`PATH`] with `body` from `snapshot`: 200 with the `DiscoveryResponse`,
/// 304 when the request's `version_info` is already current, 400 for a bad request.
pub fn reply(snapshot: &Snapshot, body: &[u8]) -> Reply {
    let request = match DiscoveryRequest::from_json(body) {
        Ok(request) => request,
        Err(e) => return http::reply(StatusCode::BAD_REQUEST, http::TEXT, format!("{e}\n")),
    };
    let (version, response) = response(snapshot, &request);
    let mut reply = if request.version_info == version {
        http::empty(StatusCode::NOT_MODIFIED)
    } else {
        http::reply(
            StatusCode::OK,
            http::JSON,
            Bytes::from(response.to_string()),
        )
    };
    reply
        .headers_mut()
        .insert(CACHE_CONTROL, HeaderValue::from_static("no-store"));
    reply
}

/// 64-bit FNV-1a: tiny and stable across processes and Rust releases (unlike `DefaultHasher`).
struct Fnv1a(u64);

impl Fnv1a {
    fn new() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use wasm_epp::scheduler::profile::Profile;
    use wasm_epp::snapshot::Endpoint;

    fn endpoint(name: &str, address: &str, port: u16) -> Endpoint {
        Endpoint {
            name: name.into(),
            address: address.into(),
            port,
            ready: true,
            key_cache: Default::default(),
            labels: Default::default(),
            metrics: Default::default(),
        }
    }

    fn snapshot(version: u64, endpoints: Vec<Endpoint>) -> Snapshot {
        Snapshot {
            instance: String::new(),
            version,
            generated_unix_ms: version,
            profile: Profile::default(),
            endpoints,
            objectives: Default::default(),
            rewrites: Default::default(),
            vouched_ms: 0,
            scoring_cache: Default::default(),
        }
    }

    fn two() -> Snapshot {
        snapshot(
            7,
            vec![
                endpoint("b", "10.0.0.2", 8000),
                endpoint("a", "10.0.0.1", 8001),
            ],
        )
    }

    fn request(json: &str) -> DiscoveryRequest {
        DiscoveryRequest::from_json(json.as_bytes()).unwrap()
    }

    #[test]
    fn the_response_has_the_cluster_load_assignment_shape() {
        let (version, body) = response(
            &two(),
            &request(r#"{"resource_names": ["inference_pool"]}"#),
        );
        assert_eq!(
            body,
            json!({
                "version_info": version,
                "type_url": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                "resources": [{
                    "@type": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
                    "cluster_name": "inference_pool",
                    "endpoints": [{"lb_endpoints": [
                        {"endpoint": {"address": {"socket_address":
                            {"address": "10.0.0.1", "port_value": 8001}}}},
                        {"endpoint": {"address": {"socket_address":
                            {"address": "10.0.0.2", "port_value": 8000}}}},
                    ]}],
                }],
            })
        );
        assert_eq!(version.len(), 16);
        assert!(version.chars().all(|c| c.is_ascii_hexdigit()));
    }

    #[test]
    fn one_resource_per_requested_name_and_a_default_without_names() {
        let (_, body) = response(
            &two(),
            &request(r#"{"resource_names": ["pool-b", "pool-a", "pool-b", ""]}"#),
        );
        let names: Vec<&str> = body["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["cluster_name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["pool-a", "pool-b"]);
        for (body_text, expected) in [("", DEFAULT_CLUSTER), ("{}", DEFAULT_CLUSTER)] {
            let (_, body) = response(&two(), &request(body_text));
            assert_eq!(body["resources"][0]["cluster_name"], expected);
            assert_eq!(body["resources"].as_array().unwrap().len(), 1);
        }
    }

    #[test]
    fn the_version_follows_membership_only() {
        let names = [DEFAULT_CLUSTER.to_string()];
        let base = version(&members(&two()), &names);
        // Another snapshot version, other order, other names, metrics: same membership.
        let mut later = snapshot(
            99,
            vec![
                endpoint("a2", "10.0.0.1", 8001),
                endpoint("b", "10.0.0.2", 8000),
                endpoint("b-again", "10.0.0.2", 8000),
            ],
        );
        later.endpoints[0].metrics.waiting_queue_size = 42;
        assert_eq!(version(&members(&later), &names), base);
        assert_eq!(members(&later).len(), 2);
        // Membership or the requested names change it.
        let moved = snapshot(
            7,
            vec![
                endpoint("b", "10.0.0.2", 8000),
                endpoint("a", "10.0.0.1", 8002),
            ],
        );
        assert_ne!(version(&members(&moved), &names), base);
        assert_ne!(version(&members(&two()), &["other".to_string()]), base);
        assert_ne!(version(&[], &names), base);
        // Fixed across processes and releases (FNV-1a, not a seeded hasher).
        assert_eq!(
            version(&[], &[]),
            format!("{:016x}", 0xaf63_bd4c_8601_b7dfu64)
        );
    }

    #[test]
    fn an_empty_pool_is_a_load_assignment_without_endpoints() {
        let (_, body) = response(&snapshot(1, vec![]), &request("{}"));
        assert_eq!(body["resources"][0]["endpoints"], json!([]));
        assert_eq!(body["resources"][0]["cluster_name"], DEFAULT_CLUSTER);
    }

    #[test]
    fn accepts_envoys_request_with_unknown_fields_and_camel_case() {
        let envoy = r#"{
            "version_info": "abc",
            "node": {"id": "n", "cluster": "c", "user_agent_name": "envoy",
                     "extensions": [{"name": "x"}], "metadata": {"k": 1}},
            "resource_names": ["inference_pool"],
            "type_url": "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment",
            "response_nonce": ""
        }"#;
        let parsed = request(envoy);
        assert_eq!(parsed.version_info, "abc");
        assert_eq!(parsed.resource_names, ["inference_pool"]);
        let camel = request(r#"{"versionInfo": "v", "resourceNames": ["p"], "typeUrl": ""}"#);
        assert_eq!(
            (camel.version_info.as_str(), camel.cluster_names()),
            ("v", vec!["p".to_string()])
        );
        assert!(DiscoveryRequest::from_json(b"{not json").is_err());
        let wrong = DiscoveryRequest::from_json(
            br#"{"type_url": "type.googleapis.com/envoy.config.cluster.v3.Cluster"}"#,
        );
        assert!(wrong.unwrap_err().contains("type_url"));
    }

    async fn body_of(reply: Reply) -> String {
        let bytes = reply.into_body().collect().await.unwrap().to_bytes();
        String::from_utf8(bytes.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn replies_200_then_304_for_the_current_version_and_400_for_garbage() {
        let snapshot = two();
        let first = reply(&snapshot, br#"{"resource_names": ["inference_pool"]}"#);
        assert_eq!(first.status(), StatusCode::OK);
        assert_eq!(
            first.headers().get("content-type").unwrap(),
            "application/json"
        );
        let body: Value = serde_json::from_str(&body_of(first).await).unwrap();
        let version = body["version_info"].as_str().unwrap().to_string();

        let again =
            format!(r#"{{"version_info": "{version}", "resource_names": ["inference_pool"]}}"#);
        let second = reply(&snapshot, again.as_bytes());
        assert_eq!(second.status(), StatusCode::NOT_MODIFIED);
        assert!(body_of(second).await.is_empty());

        let stale = reply(&snapshot, br#"{"version_info": "0000000000000000"}"#);
        assert_eq!(stale.status(), StatusCode::OK);

        let bad = reply(&snapshot, b"[1, 2");
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert!(body_of(bad).await.contains("DiscoveryRequest"));
    }
}
