//! A small in-process fake of the Kubernetes API server, enough for the controller's watches.
//!
//! It speaks plain HTTP/1.1 on 127.0.0.1 (one thread per connection, keep-alive) and serves
//! namespaced collections of a fixed set of kinds ([`ALL`] by default):
//!
//! - **LIST** `GET /api/v1/namespaces/<ns>/pods`, `GET /apis/<group>/<version>/namespaces/<ns>/<plural>`:
//!   a `<Kind>List` with `metadata.resourceVersion` set to the current resource version. The
//!   query is read for `fieldSelector` (`metadata.name` and `metadata.namespace`, with `=`, `==`
//!   or `!=`); `limit`, `resourceVersion` and the like are accepted and ignored (everything fits
//!   one page, and every list is served from the latest state).
//! - **WATCH** the same paths with `watch=true`: a chunked stream of newline-delimited
//!   `{"type": "ADDED" | "MODIFIED" | "DELETED", "object": {...}}` events. Every event after the
//!   requested `resourceVersion` is sent (so a watcher that reconnects misses nothing), then
//!   events as the test makes them. The stream stays open until `timeoutSeconds` (the kube
//!   watcher asks for 290 s), [`FakeApiServer::end_watches`], [`FakeApiServer::reset_watches`]
//!   or the server is dropped. A watch from a resource version older than the last
//!   [`FakeApiServer::compact`] gets a `410 Expired` ERROR event, as from a real server whose
//!   history was compacted; the kube watcher then lists again. No BOOKMARKs are sent.
//! - Anything else (a kind that is not served, a single object, a cluster-wide list): `404` with
//!   a Kubernetes `Status`, as for a CRD that is not installed. A `labelSelector` or an
//!   unsupported field selector: `400`. While [`FakeApiServer::set_available`] is false, every
//!   request gets `503`.
//!
//! Objects are plain JSON. [`FakeApiServer::put`] creates or replaces one (an ADDED or MODIFIED
//! event) and [`FakeApiServer::delete`] removes one (DELETED); each change takes the next
//! resource version, which is written into the object's `metadata.resourceVersion`.
//!
//! The server threads never panic on bad input: a request they cannot serve gets an error
//! answer or a closed connection. The test-facing methods do panic on misuse (an object of a
//! kind that is not served, deleting an object that does not exist), failing the test.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// One kind the fake can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource {
    /// `group/version`, or `v1` for the core group.
    pub api_version: &'static str,
    /// The kind, e.g. `Pod`.
    pub kind: &'static str,
    /// Its plural resource name, e.g. `pods`.
    pub plural: &'static str,
}

impl Resource {
    /// The collection path in `namespace`.
    pub fn path(&self, namespace: &str) -> String {
        let prefix = if self.api_version.contains('/') {
            "apis"
        } else {
            "api"
        };
        format!(
            "/{prefix}/{}/namespaces/{namespace}/{}",
            self.api_version, self.plural
        )
    }
}

/// `v1` Pods.
pub const PODS: Resource = Resource {
    api_version: "v1",
    kind: "Pod",
    plural: "pods",
};

/// `inference.networking.k8s.io/v1` InferencePools.
pub const POOLS: Resource = Resource {
    api_version: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    plural: "inferencepools",
};

/// `llm-d.ai/v1alpha2` InferenceObjectives.
pub const OBJECTIVES: Resource = Resource {
    api_version: "llm-d.ai/v1alpha2",
    kind: "InferenceObjective",
    plural: "inferenceobjectives",
};

/// `llm-d.ai/v1alpha2` InferenceModelRewrites.
pub const REWRITES: Resource = Resource {
    api_version: "llm-d.ai/v1alpha2",
    kind: "InferenceModelRewrite",
    plural: "inferencemodelrewrites",
};

/// InferenceObjectives of the deprecated `inference.networking.x-k8s.io/v1alpha2` group.
pub const DEPRECATED_OBJECTIVES: Resource = Resource {
    api_version: "inference.networking.x-k8s.io/v1alpha2",
    kind: "InferenceObjective",
    plural: "inferenceobjectives",
};

/// InferenceModelRewrites of the deprecated `inference.networking.x-k8s.io/v1alpha2` group.
pub const DEPRECATED_REWRITES: Resource = Resource {
    api_version: "inference.networking.x-k8s.io/v1alpha2",
    kind: "InferenceModelRewrite",
    plural: "inferencemodelrewrites",
};

/// Every kind the controller watches.
pub const ALL: [Resource; 6] = [
    PODS,
    POOLS,
    OBJECTIVES,
    REWRITES,
    DEPRECATED_OBJECTIVES,
    DEPRECATED_REWRITES,
];

/// Longest a watch thread sleeps before looking again at the state (a change wakes it at once).
const WATCH_POLL: Duration = Duration::from_millis(200);

/// One request the fake answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    /// The path, without the query.
    pub path: String,
    /// The decoded query parameters.
    pub query: BTreeMap<String, String>,
    /// Whether it was a watch.
    pub watch: bool,
    /// The status code of the answer.
    pub status: u16,
}

impl Recorded {
    /// Whether this was a LIST of `resource` in `namespace`.
    pub fn is_list_of(&self, resource: &Resource, namespace: &str) -> bool {
        !self.watch && self.path == resource.path(namespace)
    }

    /// Whether this was a WATCH of `resource` in `namespace`.
    pub fn is_watch_of(&self, resource: &Resource, namespace: &str) -> bool {
        self.watch && self.path == resource.path(namespace)
    }
}

/// The fake API server; it stops serving when dropped.
pub struct FakeApiServer {
    /// Its port on 127.0.0.1.
    pub port: u16,
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    /// Notified on every change of `state` that a watch may care about.
    changed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A test that panicked while holding the lock leaves a usable state.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Where an object lives: its kind (an index into `State::resources`), namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Key {
    resource: usize,
    namespace: String,
    name: String,
}

struct StoredEvent {
    resource_version: u64,
    key: Key,
    kind: &'static str,
    object: Value,
}

struct State {
    resources: Vec<Resource>,
    /// The latest resource version handed out.
    resource_version: u64,
    objects: BTreeMap<Key, Value>,
    /// Every change since the last compaction, oldest first.
    events: Vec<StoredEvent>,
    /// A watch from a resource version below this gets `410 Expired`.
    compacted: u64,
    /// Bumped to close every open watch connection abruptly.
    resets: u64,
    /// Bumped to end every open watch cleanly (as its timeout would).
    ends: u64,
    available: bool,
    closed: bool,
    requests: Vec<Recorded>,
}

impl FakeApiServer {
    /// Starts a server for every kind of [`ALL`], with no objects.
    pub fn start() -> FakeApiServer {
        FakeApiServer::serving(&ALL)
    }

    /// Starts a server for `resources` only; the others get `404`.
    pub fn serving(resources: &[Resource]) -> FakeApiServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the fake API server");
        let port = listener
            .local_addr()
            .expect("the fake API server's address")
            .port();
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                resources: resources.to_vec(),
                resource_version: 1,
                objects: BTreeMap::new(),
                events: Vec::new(),
                compacted: 0,
                resets: 0,
                ends: 0,
                available: true,
                closed: false,
                requests: Vec::new(),
            }),
            changed: Condvar::new(),
        });
        let accepting = shared.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                if accepting.lock().closed {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let shared = accepting.clone();
                thread::spawn(move || serve_connection(stream, &shared));
            }
        });
        FakeApiServer { port, shared }
    }

    /// Writes a kubeconfig for this server into `dir` (with `namespace` as the context's
    /// namespace) and returns its path.
    pub fn write_kubeconfig(&self, dir: &Path, namespace: &str) -> PathBuf {
        let path = dir.join("kubeconfig.yaml");
        let text = format!(
            "apiVersion: v1\n\
             kind: Config\n\
             clusters:\n\
             - name: fake\n  cluster:\n    server: http://127.0.0.1:{}\n\
             users:\n\
             - name: fake\n  user: {{}}\n\
             contexts:\n\
             - name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: {namespace}\n\
             current-context: fake\n",
            self.port
        );
        std::fs::write(&path, text).expect("write the kubeconfig");
        path
    }

    /// Creates `object` (an ADDED event) or replaces the object of the same kind, namespace and
    /// name (MODIFIED). It needs `apiVersion`, `kind`, `metadata.name` and
    /// `metadata.namespace`. Returns its new resource version.
    pub fn put(&self, mut object: Value) -> u64 {
        let mut state = self.shared.lock();
        let key = state.key_of(&object);
        state.resource_version += 1;
        let resource_version = state.resource_version;
        let previous = state.objects.get(&key);
        let uid = previous
            .and_then(|p| p["metadata"]["uid"].as_str())
            .map_or_else(|| format!("uid-{resource_version}"), str::to_string);
        let kind = if previous.is_some() {
            "MODIFIED"
        } else {
            "ADDED"
        };
        object["metadata"]["resourceVersion"] = json!(resource_version.to_string());
        object["metadata"]["uid"] = json!(uid);
        state.objects.insert(key.clone(), object.clone());
        state.events.push(StoredEvent {
            resource_version,
            key,
            kind,
            object,
        });
        drop(state);
        self.shared.changed.notify_all();
        resource_version
    }

    /// Deletes the one object of `kind` named `name` (in any namespace and served group; a
    /// DELETED event). Panics unless exactly one such object exists.
    pub fn delete(&self, kind: &str, name: &str) {
        let state = self.shared.lock();
        let matching: Vec<Key> = state
            .objects
            .keys()
            .filter(|key| state.resources[key.resource].kind == kind && key.name == name)
            .cloned()
            .collect();
        drop(state);
        match matching.as_slice() {
            [key] => self.delete_key(key),
            [] => panic!("fake API server: no {kind} named {name} to delete"),
            _ => panic!("fake API server: several {kind} objects named {name}: {matching:?}"),
        }
    }

    fn delete_key(&self, key: &Key) {
        let mut state = self.shared.lock();
        let Some(mut object) = state.objects.remove(key) else {
            panic!("fake API server: no object {key:?} to delete");
        };
        state.resource_version += 1;
        let resource_version = state.resource_version;
        object["metadata"]["resourceVersion"] = json!(resource_version.to_string());
        state.events.push(StoredEvent {
            resource_version,
            key: key.clone(),
            kind: "DELETED",
            object,
        });
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Closes every open watch connection abruptly, mid-stream (no final chunk), as when a
    /// connection to the API server breaks.
    pub fn reset_watches(&self) {
        self.shared.lock().resets += 1;
        self.shared.changed.notify_all();
    }

    /// Ends every open watch cleanly (the final chunk, keeping the connection), as the API
    /// server does when a watch's `timeoutSeconds` is up.
    pub fn end_watches(&self) {
        self.shared.lock().ends += 1;
        self.shared.changed.notify_all();
    }

    /// Makes the server answer every request with `503` (closing the open watches) or, with
    /// `true`, serve again.
    pub fn set_available(&self, available: bool) {
        let mut state = self.shared.lock();
        state.available = available;
        if !available {
            state.resets += 1;
        }
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Forgets the event history, as etcd compaction does: a watch from any resource version
    /// handed out so far gets `410 Expired` (so the watcher lists again). Open watches are
    /// closed.
    pub fn compact(&self) {
        let mut state = self.shared.lock();
        state.resource_version += 1;
        state.compacted = state.resource_version;
        state.events.clear();
        state.resets += 1;
        drop(state);
        self.shared.changed.notify_all();
    }

    /// Every request answered so far, oldest first.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.changed.notify_all();
        // Wake the accept loop so that it sees `closed`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl State {
    /// The key of a test's object; panics (in the test) if it is not servable.
    fn key_of(&self, object: &Value) -> Key {
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let kind = object["kind"].as_str().unwrap_or_default();
        let resource = self
            .resources
            .iter()
            .position(|r| r.api_version == api_version && r.kind == kind)
            .unwrap_or_else(|| {
                panic!("fake API server: {api_version} {kind} is not served: {object}")
            });
        let field = |name: &str| {
            object["metadata"][name]
                .as_str()
                .filter(|value| !value.is_empty())
                .unwrap_or_else(|| panic!("fake API server: no metadata.{name}: {object}"))
                .to_string()
        };
        Key {
            resource,
            namespace: field("namespace"),
            name: field("name"),
        }
    }
}

/// What a request asks for, once its path and query are understood.
struct Query {
    resource: usize,
    namespace: String,
    selector: Vec<FieldTerm>,
    watch: bool,
    /// `resourceVersion`, if set and not `0`.
    resource_version: Option<u64>,
    timeout: Duration,
}

/// One term of a field selector.
struct FieldTerm {
    field: String,
    equal: bool,
    value: String,
}

impl FieldTerm {
    fn matches(&self, key: &Key) -> bool {
        let actual = match self.field.as_str() {
            "metadata.name" => &key.name,
            _ => &key.namespace,
        };
        (actual == &self.value) == self.equal
    }
}

/// An error answer: status code, reason and message.
type Failure = (u16, &'static str, String);

/// What to do with a connection after answering a request.
enum After {
    KeepAlive,
    Close,
}

fn serve_connection(stream: TcpStream, shared: &Shared) {
    let Ok(read_half) = stream.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(read_half);
    let mut writer = stream;
    while let Some(request_line) = read_request(&mut reader) {
        match answer(&request_line, &mut writer, shared) {
            After::KeepAlive => {}
            After::Close => break,
        }
    }
    let _ = writer.shutdown(Shutdown::Both);
}

/// Reads one request head (and skips its body, if any); returns the request line, or `None`
/// when the connection is closed or unreadable.
fn read_request(reader: &mut BufReader<TcpStream>) -> Option<String> {
    let mut request_line = String::new();
    let mut content_length = 0u64;
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line).ok()? == 0 {
            return None;
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            if request_line.is_empty() {
                continue;
            }
            break;
        }
        if request_line.is_empty() {
            request_line = trimmed.to_string();
        } else if let Some((name, value)) = trimmed.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                content_length = value.trim().parse().ok()?;
            }
        }
    }
    if content_length > 0 {
        std::io::copy(&mut reader.take(content_length), &mut std::io::sink()).ok()?;
    }
    Some(request_line)
}

fn answer(request_line: &str, writer: &mut TcpStream, shared: &Shared) -> After {
    let mut parts = request_line.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (path, query_text) = target.split_once('?').unwrap_or((target, ""));
    let params = parse_query(query_text);
    let watch = params.as_ref().is_ok_and(is_watch);
    let mut state = shared.lock();
    let parsed = if method != "GET" {
        Err((
            405,
            "MethodNotAllowed",
            format!("{method} is not supported"),
        ))
    } else if !state.available {
        Err((
            503,
            "ServiceUnavailable",
            "the fake API server is unavailable".to_string(),
        ))
    } else {
        params
            .as_ref()
            .map_err(|e| (400, "BadRequest", e.clone()))
            .and_then(|params| parse_request(&state, path, params))
    };
    state.requests.push(Recorded {
        path: path.to_string(),
        query: params.clone().unwrap_or_default(),
        watch,
        status: parsed.as_ref().map_or_else(|(code, _, _)| *code, |_| 200),
    });
    let query = match parsed {
        Ok(query) => query,
        Err((code, reason, message)) => {
            drop(state);
            return respond(writer, code, &status(code, reason, &message));
        }
    };
    if query.watch {
        drop(state);
        return stream_watch(writer, shared, &query);
    }
    let resource = state.resources[query.resource];
    let items: Vec<Value> = state
        .objects
        .iter()
        .filter(|(key, _)| selects(&query, key))
        .map(|(_, object)| object.clone())
        .collect();
    let list = json!({
        "apiVersion": resource.api_version,
        "kind": format!("{}List", resource.kind),
        "metadata": {"resourceVersion": state.resource_version.to_string()},
        "items": items,
    });
    drop(state);
    respond(writer, 200, &list)
}

/// Whether the object at `key` is in the collection `query` names and passes its selector.
fn selects(query: &Query, key: &Key) -> bool {
    key.resource == query.resource
        && key.namespace == query.namespace
        && query.selector.iter().all(|term| term.matches(key))
}

fn is_watch(params: &BTreeMap<String, String>) -> bool {
    params.get("watch").is_some_and(|w| w == "true" || w == "1")
}

/// Resolves the path to a served collection and reads the query parameters that matter.
fn parse_request(
    state: &State,
    path: &str,
    params: &BTreeMap<String, String>,
) -> Result<Query, Failure> {
    let not_found = || {
        (
            404,
            "NotFound",
            "the server could not find the requested resource".to_string(),
        )
    };
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (api_version, namespace, plural) = match segments.as_slice() {
        ["api", version, "namespaces", namespace, plural] => {
            (version.to_string(), *namespace, *plural)
        }
        ["apis", group, version, "namespaces", namespace, plural] => {
            (format!("{group}/{version}"), *namespace, *plural)
        }
        _ => return Err(not_found()),
    };
    let resource = state
        .resources
        .iter()
        .position(|r| r.api_version == api_version && r.plural == plural)
        .ok_or_else(not_found)?;
    if params.contains_key("labelSelector") {
        return Err((
            400,
            "BadRequest",
            "the fake API server does not support labelSelector".to_string(),
        ));
    }
    let mut selector = Vec::new();
    for term in params
        .get("fieldSelector")
        .map(String::as_str)
        .unwrap_or("")
        .split(',')
        .filter(|t| !t.is_empty())
    {
        let (field, equal, value) = if let Some((f, v)) = term.split_once("!=") {
            (f, false, v)
        } else if let Some((f, v)) = term.split_once("==") {
            (f, true, v)
        } else if let Some((f, v)) = term.split_once('=') {
            (f, true, v)
        } else {
            return Err((
                400,
                "BadRequest",
                format!("invalid field selector {term:?}"),
            ));
        };
        if field != "metadata.name" && field != "metadata.namespace" {
            return Err((
                400,
                "BadRequest",
                format!("field label not supported: {field}"),
            ));
        }
        selector.push(FieldTerm {
            field: field.to_string(),
            equal,
            value: value.to_string(),
        });
    }
    let resource_version = match params.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => None,
        Some(text) => Some(text.parse::<u64>().map_err(|_| {
            (
                400,
                "BadRequest",
                format!("invalid resourceVersion {text:?}"),
            )
        })?),
    };
    let timeout = params
        .get("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map_or(Duration::from_secs(1800), Duration::from_secs);
    Ok(Query {
        resource,
        namespace: namespace.to_string(),
        selector,
        watch: is_watch(params),
        resource_version,
        timeout,
    })
}

/// Streams the events of a watch until it ends (see the module docs).
fn stream_watch(writer: &mut TcpStream, shared: &Shared, query: &Query) -> After {
    let started = Instant::now();
    let head =
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
    if writer.write_all(head.as_bytes()).is_err() {
        return After::Close;
    }
    let mut state = shared.lock();
    let (resets, ends) = (state.resets, state.ends);
    // Events up to `sent` have been sent (or did not concern this watch).
    let mut sent = match query.resource_version {
        Some(version) if version < state.compacted => {
            let message = format!("too old resource version: {version} ({})", state.compacted);
            drop(state);
            let error = json!({"type": "ERROR", "object": status(410, "Expired", &message)});
            return end_stream(writer, &[error.to_string()]);
        }
        Some(version) => version,
        None => {
            // No version: the current objects as ADDED events, then changes.
            let added: Vec<String> = state
                .objects
                .iter()
                .filter(|(key, _)| selects(query, key))
                .map(|(_, object)| json!({"type": "ADDED", "object": object}).to_string())
                .collect();
            let current = state.resource_version;
            drop(state);
            if !write_events(writer, &added) {
                return After::Close;
            }
            state = shared.lock();
            current
        }
    };
    loop {
        if state.closed || state.resets != resets {
            // Abruptly: no final chunk.
            return After::Close;
        }
        if state.ends != ends || started.elapsed() >= query.timeout {
            drop(state);
            return end_stream(writer, &[]);
        }
        let lines: Vec<String> = state
            .events
            .iter()
            .filter(|event| event.resource_version > sent && selects(query, &event.key))
            .map(|event| json!({"type": event.kind, "object": event.object}).to_string())
            .collect();
        sent = sent.max(state.resource_version);
        if lines.is_empty() {
            state = shared
                .changed
                .wait_timeout(state, WATCH_POLL)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
            continue;
        }
        drop(state);
        if !write_events(writer, &lines) {
            return After::Close;
        }
        state = shared.lock();
    }
}

/// Writes each line (a JSON event) as one chunk; false if the connection failed.
fn write_events(writer: &mut TcpStream, lines: &[String]) -> bool {
    for line in lines {
        let chunk = format!("{:x}\r\n{line}\n\r\n", line.len() + 1);
        if writer.write_all(chunk.as_bytes()).is_err() {
            return false;
        }
    }
    writer.flush().is_ok()
}

/// Writes `lines`, then the final chunk.
fn end_stream(writer: &mut TcpStream, lines: &[String]) -> After {
    if write_events(writer, lines) && writer.write_all(b"0\r\n\r\n").is_ok() {
        After::KeepAlive
    } else {
        After::Close
    }
}

fn respond(writer: &mut TcpStream, code: u16, body: &Value) -> After {
    let reason = match code {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Error",
    };
    let body = body.to_string();
    let response = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    if writer.write_all(response.as_bytes()).is_ok() && writer.flush().is_ok() {
        After::KeepAlive
    } else {
        After::Close
    }
}

/// A Kubernetes `Status` for a failed request.
fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// Decodes `a=b&c=d%3De`; an invalid escape or non-UTF-8 text is an error.
fn parse_query(text: &str) -> Result<BTreeMap<String, String>, String> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((percent_decode(name)?, percent_decode(value)?))
        })
        .collect()
}

fn percent_decode(text: &str) -> Result<String, String> {
    let invalid = || format!("invalid query text {text:?}");
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = bytes.get(i + 1..i + 3).ok_or_else(invalid)?;
                let hex = std::str::from_utf8(hex).map_err(|_| invalid())?;
                decoded.push(u8::from_str_radix(hex, 16).map_err(|_| invalid())?);
                i += 3;
            }
            b'+' => {
                decoded.push(b' ');
                i += 1;
            }
            byte => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8(decoded).map_err(|_| invalid())
}
