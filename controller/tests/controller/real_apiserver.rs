//! A real Kubernetes API server for the tests: Debian's `etcd` and a `kube-apiserver` v1.20.2
//! built from Debian's source package, started and stopped by `scripts/kube-tools.sh` (which also
//! builds them, once per machine) on 127.0.0.1 with a generated service-account key, an admin
//! token (group `system:masters`), TLS and RBAC on.
//!
//! There is no kubelet, scheduler or controller-manager: pods are created and then made Ready
//! with a pod IP through the status subresource, as envtest-style tests do. Each test gets its own
//! etcd and API server (start-up takes about 5 s), so a test may restart or compact them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use serde::Deserialize;
use serde_json::{json, Value};

/// The repository's root.
fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `scripts/kube-tools.sh` with `args`; panics with its output if it fails.
fn kube_tools(args: &[&str]) {
    let output = Command::new("bash")
        .arg(repository().join("scripts/kube-tools.sh"))
        .args(args)
        .output()
        .expect("run scripts/kube-tools.sh");
    assert!(
        output.status.success(),
        "scripts/kube-tools.sh {args:?} failed ({}):\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// One etcd and one API server, stopped on drop.
pub struct RealApiServer {
    dir: PathBuf,
    etcd_port: u16,
    admin_token: String,
    runtime: tokio::runtime::Runtime,
    client: Option<Client>,
}

/// The resource of `kind` in `api_version`, and whether it is namespaced.
fn resource(api_version: &str, kind: &str) -> (ApiResource, bool) {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let lower = kind.to_ascii_lowercase();
    let plural = match lower.strip_suffix('y') {
        Some(stem) => format!("{stem}ies"),
        None => format!("{lower}s"),
    };
    let cluster_scoped = matches!(
        kind,
        "Namespace" | "ClusterRole" | "ClusterRoleBinding" | "CustomResourceDefinition"
    );
    (
        ApiResource {
            group: group.to_string(),
            version: version.to_string(),
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            plural,
        },
        !cluster_scoped,
    )
}

impl RealApiServer {
    /// Starts etcd and the API server for `test` with the API server's `extra` flags.
    pub fn start(test: &str, extra: &[&str]) -> RealApiServer {
        let dir = std::env::temp_dir().join(format!("wasm-epp-kube-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = vec!["start", dir.to_str().unwrap()];
        args.extend_from_slice(extra);
        kube_tools(&args);
        let env = std::fs::read_to_string(dir.join("env")).expect("the server's env file");
        let value = |key: &str| {
            env.lines()
                .find_map(|line| line.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("no {key} in {env}"))
                .to_string()
        };
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut server = RealApiServer {
            etcd_port: value("ETCD_PORT").parse().unwrap(),
            admin_token: value("ADMIN_TOKEN"),
            dir,
            runtime,
            client: None,
        };
        server.connect();
        server
    }

    /// A client for the administrator.
    fn connect(&mut self) {
        let text = std::fs::read_to_string(self.dir.join("kubeconfig")).unwrap();
        let client = self.runtime.block_on(async {
            let config = Kubeconfig::from_yaml(&text).expect("the script's kubeconfig");
            let config = Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
                .await
                .expect("a client configuration");
            Client::try_from(config).expect("a client")
        });
        self.client = Some(client);
    }

    /// Stops the API server (etcd keeps running) and starts it again on the same port.
    pub fn restart_apiserver(&mut self, down_for: Duration) {
        let dir = self.dir.to_str().unwrap().to_string();
        kube_tools(&["stop-apiserver", &dir]);
        thread::sleep(down_for);
        kube_tools(&["start-apiserver", &dir]);
        self.connect();
    }

    fn client(&self) -> Client {
        self.client.clone().expect("connected")
    }

    /// Writes a kubeconfig into `dir` for this server, authenticating with `token`, with
    /// `namespace` as the default.
    pub fn write_kubeconfig_with_token(&self, dir: &Path, namespace: &str, token: &str) -> PathBuf {
        let mut config: Value =
            serde_yaml::from_str(&std::fs::read_to_string(self.dir.join("kubeconfig")).unwrap())
                .unwrap();
        config["users"][0]["user"]["token"] = json!(token);
        config["contexts"][0]["context"]["namespace"] = json!(namespace);
        let path = dir.join(format!("kubeconfig-{}.yaml", &token[..token.len().min(12)]));
        std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
        path
    }

    /// A kubeconfig for the administrator (`system:masters`).
    pub fn admin_kubeconfig(&self, dir: &Path, namespace: &str) -> PathBuf {
        self.write_kubeconfig_with_token(dir, namespace, &self.admin_token)
    }

    fn api(&self, object: &Value) -> (Api<DynamicObject>, String) {
        let api_version = object["apiVersion"].as_str().expect("apiVersion");
        let kind = object["kind"].as_str().expect("kind");
        let name = object["metadata"]["name"].as_str().expect("metadata.name");
        let (resource, namespaced) = resource(api_version, kind);
        let api = if namespaced {
            let namespace = object["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default");
            Api::namespaced_with(self.client(), namespace, &resource)
        } else {
            Api::all_with(self.client(), &resource)
        };
        (api, name.to_string())
    }

    /// Creates or updates `object` (server-side apply, forced); returns it as stored.
    pub fn apply(&self, object: &Value) -> Value {
        let (api, name) = self.api(object);
        let params = PatchParams::apply("wasm-epp-tests").force();
        let stored = self
            .runtime
            .block_on(api.patch(&name, &params, &Patch::Apply(object)))
            .unwrap_or_else(|e| panic!("apply {name}: {e}"));
        serde_json::to_value(stored).unwrap()
    }

    /// Creates or updates `object` as the fixtures write it (as an API server would return it):
    /// the server-written `metadata.creationTimestamp` and the `status` are left out of the write,
    /// and a `status` given is then set through the status subresource.
    pub fn put(&self, object: &Value) -> Value {
        let mut spec = object.clone();
        let status = spec.as_object_mut().and_then(|o| o.remove("status"));
        if let Some(metadata) = spec["metadata"].as_object_mut() {
            metadata.remove("creationTimestamp");
        }
        let stored = self.apply(&spec);
        match status {
            Some(status) => self.patch_status(object, status),
            None => stored,
        }
    }

    /// Applies every document of the YAML file `path` (relative to the repository root); CRDs
    /// are waited for until established.
    pub fn apply_file(&self, path: &str) -> Vec<Value> {
        let full = repository().join(path);
        let text = std::fs::read_to_string(&full)
            .unwrap_or_else(|e| panic!("read {}: {e}", full.display()));
        serde_yaml::Deserializer::from_str(&text)
            .map(|document| Value::deserialize(document).expect("a YAML document"))
            .filter(|document| !document.is_null())
            .map(|document| {
                let stored = self.apply(&document);
                if document["kind"] == "CustomResourceDefinition" {
                    self.wait_established(&document);
                }
                stored
            })
            .collect()
    }

    /// The CRDs the controller watches, from `examples/crds/`.
    pub fn install_crds(&self) {
        for file in [
            "examples/crds/inference.networking.k8s.io_inferencepools.yaml",
            "examples/crds/llm-d.ai_inferenceobjectives.yaml",
            "examples/crds/llm-d.ai_inferencemodelrewrites.yaml",
        ] {
            self.apply_file(file);
        }
    }

    fn wait_established(&self, crd: &Value) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (api, name) = self.api(crd);
            let established = self
                .runtime
                .block_on(api.get(&name))
                .ok()
                .and_then(|o| serde_json::to_value(o).ok())
                .is_some_and(|o| {
                    o["status"]["conditions"].as_array().is_some_and(|c| {
                        c.iter()
                            .any(|c| c["type"] == "Established" && c["status"] == "True")
                    })
                });
            if established {
                return;
            }
            assert!(Instant::now() < deadline, "CRD {name} not established");
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// Merge-patches `object`'s status subresource with `status`.
    pub fn patch_status(&self, object: &Value, status: Value) -> Value {
        let (api, name) = self.api(object);
        let stored = self
            .runtime
            .block_on(api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": status })),
            ))
            .unwrap_or_else(|e| panic!("patch status of {name}: {e}"));
        serde_json::to_value(stored).unwrap()
    }

    /// Deletes `object` (it may stay while finalizers hold it).
    pub fn delete(&self, object: &Value) {
        let (api, name) = self.api(object);
        self.runtime
            .block_on(api.delete(&name, &DeleteParams::default()))
            .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    }

    /// POSTs `body` to `path` as the administrator; returns the reply.
    fn post(&self, path: &str, body: Value) -> Value {
        let request = http::Request::post(path)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body).unwrap())
            .unwrap();
        let text = self
            .runtime
            .block_on(self.client().request_text(request))
            .unwrap_or_else(|e| panic!("POST {path}: {e}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("POST {path}: {e}: {text}"))
    }

    /// A token for the service account `namespace/name` from the TokenRequest API, as a pod
    /// running under that account would get it.
    pub fn service_account_token(&self, namespace: &str, name: &str) -> String {
        let reply = self.post(
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"),
            json!({
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenRequest",
                "spec": {"expirationSeconds": 3600},
            }),
        );
        reply["status"]["token"]
            .as_str()
            .unwrap_or_else(|| panic!("no token in {reply}"))
            .to_string()
    }

    /// Whether the service account `namespace/name` may `verb` `resource` of `group` in
    /// `namespace`, as the API server's authorizer says now (a SubjectAccessReview).
    pub fn service_account_may(
        &self,
        (namespace, name): (&str, &str),
        verb: &str,
        group: &str,
        resource: &str,
    ) -> bool {
        let reply = self.post(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            json!({
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": format!("system:serviceaccount:{namespace}:{name}"),
                    "groups": [
                        "system:serviceaccounts",
                        format!("system:serviceaccounts:{namespace}"),
                        "system:authenticated",
                    ],
                    "resourceAttributes": {
                        "namespace": namespace, "verb": verb, "group": group, "resource": resource,
                    },
                },
            }),
        );
        reply["status"]["allowed"] == json!(true)
    }

    /// What a watch of the pods of `namespace` from `resource_version` gets first: the HTTP
    /// status code, or the code of the first event when it is an error.
    pub fn watch_pods_from(&self, namespace: &str, resource_version: &str) -> u16 {
        let request = http::Request::get(format!(
            "/api/v1/namespaces/{namespace}/pods?watch=1&resourceVersion={resource_version}&timeoutSeconds=1"
        ))
        .body(Vec::new())
        .unwrap();
        match self.runtime.block_on(self.client().request_text(request)) {
            Ok(text) => {
                let first: Value = text
                    .lines()
                    .next()
                    .and_then(|l| serde_json::from_str(l).ok())
                    .unwrap_or(Value::Null);
                if first["type"] == "ERROR" {
                    first["object"]["code"].as_u64().unwrap_or(0) as u16
                } else {
                    200
                }
            }
            Err(kube::Error::Api(status)) => status.code,
            Err(e) => panic!("watch: {e}"),
        }
    }

    /// Compacts etcd's history up to its current revision (so every older resource version is
    /// gone), after writing `writes` unrelated objects to move the revision on.
    pub fn compact_etcd(&self, writes: usize) {
        for i in 0..writes {
            self.apply(&json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": format!("filler-{i}"), "namespace": "default"},
                "data": {"i": i.to_string()},
            }));
        }
        // etcd's JSON gateway: the current revision from a range read, then a compaction to it.
        let base = format!("http://127.0.0.1:{}/v3", self.etcd_port);
        let agent = ureq::agent();
        let range: Value = agent
            .post(&format!("{base}/kv/range"))
            .send_json(json!({"key": "AA=="}))
            .and_then(|mut r| r.body_mut().read_json())
            .expect("etcd range");
        let revision = range["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse::<u64>().ok())
            .expect("etcd revision");
        agent
            .post(&format!("{base}/kv/compaction"))
            .send_json(json!({"revision": revision.to_string(), "physical": true}))
            .expect("etcd compaction");
    }
}

impl Drop for RealApiServer {
    fn drop(&mut self) {
        let dir = self.dir.to_str().unwrap().to_string();
        let _ = Command::new("bash")
            .arg(repository().join("scripts/kube-tools.sh"))
            .args(["stop", &dir])
            .status();
    }
}
