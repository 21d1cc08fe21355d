//! End-to-end harness: the real Envoy (from the project's .venv), the real controller and
//! simulator binaries (from `make build`), all on 127.0.0.1 with free ports. Every process is
//! killed when its guard drops; every wait has a deadline.

#![allow(dead_code)] // each test binary uses a different part of the harness

pub mod http2;

use std::collections::HashMap;
use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Root of the repository.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn from_env(var: &str, default: &str) -> PathBuf {
    let path = std::env::var_os(var)
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(default));
    assert!(
        path.exists(),
        "{} not found ({var}); run `make build envoy` first",
        path.display()
    );
    path
}

/// A binary built by `make build`.
pub fn bin(name: &str) -> PathBuf {
    from_env("WASM_EPP_BIN_DIR", "target/release").join(name)
}

/// The default values of `envoy/<name>.template`'s placeholders (`envoy/template-defaults.json`),
/// with which the template renders to the shipped `envoy/<name>`.
pub fn template_defaults(name: &str) -> HashMap<String, String> {
    let path = repo().join("envoy/template-defaults.json");
    let all: HashMap<String, HashMap<String, String>> =
        serde_json::from_str(&fs::read_to_string(&path).expect("envoy/template-defaults.json"))
            .expect("envoy/template-defaults.json: {file: {NAME: value}}");
    all.get(name)
        .unwrap_or_else(|| panic!("envoy/template-defaults.json has no {name:?}"))
        .clone()
}

/// `envoy/<name>.template` with each `${NAME}` replaced by `vars[NAME]`; a placeholder without
/// a value panics, naming it.
pub fn render_template(name: &str, vars: &HashMap<String, String>) -> String {
    let path = repo().join("envoy").join(format!("{name}.template"));
    let template = fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut out = String::with_capacity(template.len());
    let mut rest = template.as_str();
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after
            .find('}')
            .unwrap_or_else(|| panic!("{}: unclosed ${{", path.display()));
        let key = &after[..end];
        let value = vars
            .get(key)
            .unwrap_or_else(|| panic!("{}: no value for ${{{key}}}", path.display()));
        out.push_str(value);
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// A port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind 127.0.0.1:0")
}

/// A scratch directory for one test, removed on drop.
pub struct Scratch(PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "wasm-epp-e2e-{}-{}-{name}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        fs::create_dir_all(&dir).expect("create scratch dir");
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.0.join(file)
    }
}

impl Drop for Scratch {
    /// Removes the directory; when the test is failing, prints the tail of each log first.
    fn drop(&mut self) {
        if std::thread::panicking() {
            for entry in fs::read_dir(&self.0).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.extension().is_some_and(|e| e == "log") {
                    let text = fs::read_to_string(&path).unwrap_or_default();
                    let tail: Vec<&str> = text.lines().rev().take(15).collect();
                    eprintln!("--- {}", path.display());
                    for line in tail.iter().rev() {
                        eprintln!("{line}");
                    }
                }
            }
        }
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A child process killed on drop.
pub struct Proc(Option<Child>);

impl Proc {
    /// Starts `command` with its output in `log`.
    pub fn spawn(command: &mut Command, log: &Path) -> Proc {
        let log = fs::File::create(log).expect("create log");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("clone log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {command:?}: {e}"));
        Proc(Some(child))
    }

    /// Kills the process now.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Polls `f` every 10 ms until it returns true or `limit` passes.
pub fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// How long one test request may take, connect to last byte.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);

fn agent() -> ureq::Agent {
    agent_within(REQUEST_TIMEOUT)
}

fn agent_within(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout))
        .build()
        .into()
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HashMap<String, String>,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(String::as_str)
    }

    /// The simulator instance that served the request.
    pub fn instance(&self) -> &str {
        self.header("x-sim-instance").unwrap_or("")
    }
}

fn reply(result: Result<ureq::http::Response<ureq::Body>, ureq::Error>) -> Reply {
    match result {
        Ok(mut response) => Reply {
            status: response.status().as_u16(),
            headers: response
                .headers()
                .iter()
                .map(|(k, v)| (k.as_str().to_string(), v.to_str().unwrap_or("").to_string()))
                .collect(),
            body: response.body_mut().read_to_string().unwrap_or_default(),
        },
        Err(e) => Reply {
            status: 0,
            headers: HashMap::new(),
            body: e.to_string(),
        },
    }
}

/// POSTs `body` to `url` with extra headers.
pub fn post(url: &str, body: &str, headers: &[(&str, &str)]) -> Reply {
    post_within(url, body, headers, REQUEST_TIMEOUT)
}

/// [`post`] for a request that may legitimately run longer than the usual limit (a long
/// generation on a real server), still bounded by `timeout`.
pub fn post_within(url: &str, body: &str, headers: &[(&str, &str)], timeout: Duration) -> Reply {
    let mut request = agent_within(timeout)
        .post(url)
        .header("content-type", "application/json");
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    reply(request.send(body))
}

/// POSTs raw bytes to `url` as `application/octet-stream`.
pub fn post_bytes(url: &str, body: &[u8]) -> Reply {
    reply(
        agent()
            .post(url)
            .header("content-type", "application/octet-stream")
            .send(body),
    )
}

/// GETs `url` with extra headers.
pub fn get(url: &str, headers: &[(&str, &str)]) -> Reply {
    let mut request = agent().get(url);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    reply(request.call())
}

/// PUTs a JSON body.
pub fn put(url: &str, body: &str) -> Reply {
    reply(
        agent()
            .put(url)
            .header("content-type", "application/json")
            .send(body),
    )
}

/// A completion request body.
pub fn completion(prompt: &str) -> String {
    serde_json::json!({"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": prompt, "max_tokens": 2})
        .to_string()
}

/// A running simulator.
pub struct Sim {
    pub name: String,
    pub port: u16,
    _proc: Proc,
}

impl Sim {
    pub fn start(scratch: &Scratch, name: &str, extra: &[&str]) -> Sim {
        let port = free_port();
        let proc = Proc::spawn(
            Command::new(bin("vllm-sim"))
                .args(["--port", &port.to_string(), "--instance-name", name])
                .args(extra),
            &scratch.path(&format!("{name}.log")),
        );
        let sim = Sim {
            name: name.to_string(),
            port,
            _proc: proc,
        };
        assert!(
            wait_until(Duration::from_secs(10), || get(&sim.url("/health"), &[])
                .status
                == 200),
            "simulator {name} did not become healthy"
        );
        sim
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// Kills the simulator (SIGKILL), as a crashed model server.
    pub fn kill(&mut self) {
        self._proc.kill();
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Pins the load this simulator reports on /metrics.
    pub fn report_load(&self, waiting: u64, kv_cache_usage: f64) {
        let body = serde_json::json!({"waiting": waiting, "kv_cache_usage": kv_cache_usage});
        assert_eq!(
            put(&self.url("/sim/metrics-override"), &body.to_string()).status,
            200
        );
    }

    /// Requests this simulator has served.
    pub fn requests_served(&self) -> u64 {
        let stats: serde_json::Value =
            serde_json::from_str(&get(&self.url("/sim/stats"), &[]).body).expect("stats JSON");
        stats["requests_total"].as_u64().expect("requests_total")
    }
}

/// Writes an upstream-format endpoints file listing the simulators.
pub fn endpoints_file(scratch: &Scratch, sims: &[&Sim]) -> PathBuf {
    let mut yaml = String::from("endpoints:\n");
    for sim in sims {
        yaml.push_str(&format!(
            "- name: {}\n  namespace: e2e\n  address: 127.0.0.1\n  port: {}\n",
            sim.name, sim.port
        ));
    }
    if sims.is_empty() {
        yaml = "endpoints: []\n".to_string();
    }
    let path = scratch.path("endpoints.yaml");
    fs::write(&path, yaml).expect("write endpoints file");
    path
}

/// A running controller.
pub struct Controller {
    pub port: u16,
    pub admin_port: u16,
    pub proc: Proc,
}

impl Controller {
    /// Starts the controller with `args` (discovery and config flags) and the given scrape
    /// interval; waits until it is ready.
    pub fn start(scratch: &Scratch, interval: &str, args: &[&str]) -> Controller {
        Controller::start_at(scratch, (free_port(), free_port()), interval, args)
    }

    /// Like [`Controller::start`], on the given snapshot API and admin ports (to replace a
    /// controller that Envoy already polls).
    pub fn start_at(
        scratch: &Scratch,
        (port, admin_port): (u16, u16),
        interval: &str,
        args: &[&str],
    ) -> Controller {
        let proc = Proc::spawn(
            Command::new(bin("wasm-epp-controller"))
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--metrics-listen", &format!("127.0.0.1:{admin_port}")])
                .args(["--refresh-metrics-interval", interval])
                .args(args),
            &scratch.path("controller.log"),
        );
        let controller = Controller {
            port,
            admin_port,
            proc,
        };
        let ready = format!("http://127.0.0.1:{admin_port}/readyz");
        assert!(
            wait_until(Duration::from_secs(10), || get(&ready, &[]).status == 200),
            "controller did not become ready"
        );
        controller
    }
}

/// How to run Envoy.
pub struct EnvoyOptions {
    pub concurrency: u32,
    pub controller_port: u16,
    pub fallback_port: u16,
    pub fail_open: bool,
    pub explain: bool,
    /// The shipped config under envoy/ to start from.
    pub config: &'static str,
}

impl EnvoyOptions {
    /// One worker, the given controller, fail-close, no explanations, envoy/envoy.yaml.
    pub fn with_controller(controller_port: u16) -> EnvoyOptions {
        EnvoyOptions {
            concurrency: 1,
            controller_port,
            fallback_port: free_port(),
            fail_open: false,
            explain: false,
            config: "envoy.yaml",
        }
    }
}

/// A running Envoy built from a shipped config under envoy/ with this test's ports.
pub struct Envoy {
    pub port: u16,
    pub admin_port: u16,
    _proc: Proc,
}

impl Envoy {
    pub fn start(scratch: &Scratch, options: EnvoyOptions) -> Envoy {
        let (port, admin_port) = (free_port(), free_port());
        let wasm = from_env("WASM_EPP_WASM", "target/wasm32-wasip1/wasm/wasm_epp.wasm");
        let mut vars = template_defaults(options.config);
        // The shipped filter configuration with this test's failOpen and explainDecisions.
        let mut filter: serde_json::Value =
            serde_json::from_str(&vars["FILTER_CONFIG"]).expect("FILTER_CONFIG is JSON");
        filter["failOpen"] = options.fail_open.into();
        filter["explainDecisions"] = options.explain.into();
        for (name, value) in [
            ("PORT", port.to_string()),
            ("ADMIN_PORT", admin_port.to_string()),
            ("CONTROLLER_PORT", options.controller_port.to_string()),
            ("FALLBACK_PORT", options.fallback_port.to_string()),
            ("WASM", wasm.display().to_string()),
            ("FILTER_CONFIG", filter.to_string()),
        ] {
            vars.insert(name.to_string(), value);
        }
        let config = render_template(options.config, &vars);
        let config_path = scratch.path("envoy.yaml");
        fs::write(&config_path, config).expect("write envoy config");
        let proc = Proc::spawn(
            Command::new(from_env("ENVOY_BIN", ".venv/envoy"))
                .arg("-c")
                .arg(&config_path)
                .args(["--concurrency", &options.concurrency.to_string()])
                .args(["--disable-hot-restart", "-l", "warning"]),
            &scratch.path("envoy.log"),
        );
        let envoy = Envoy {
            port,
            admin_port,
            _proc: proc,
        };
        let ready = format!("http://127.0.0.1:{admin_port}/ready");
        assert!(
            wait_until(Duration::from_secs(20), || get(&ready, &[]).status == 200),
            "envoy did not become ready"
        );
        envoy
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    /// POSTs a completion through Envoy.
    pub fn complete(&self, prompt: &str, headers: &[(&str, &str)]) -> Reply {
        post(&self.url("/v1/completions"), &completion(prompt), headers)
    }

    /// Waits until the filter has a snapshot (requests stop failing closed).
    pub fn wait_for_snapshot(&self) {
        assert!(
            wait_until(Duration::from_secs(10), || self
                .complete("warm-up", &[])
                .status
                == 200),
            "no request succeeded through Envoy"
        );
    }

    /// Envoy's `/stats/prometheus` page.
    pub fn prometheus(&self) -> String {
        get(
            &format!("http://127.0.0.1:{}/stats/prometheus", self.admin_port),
            &[],
        )
        .body
    }

    /// A counter or gauge from the admin stats.
    pub fn stat(&self, name: &str) -> u64 {
        let text = get(
            &format!("http://127.0.0.1:{}/stats?filter={name}", self.admin_port),
            &[],
        )
        .body;
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}: "))?.trim().parse().ok())
            .unwrap_or(0)
    }
}

/// The value of the one sample of `name` on a `/stats/prometheus` page whose labels include
/// every `label="value"` pair.
pub fn prometheus_sample(page: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    page.lines().find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix('{')?;
        let (set, value) = rest.split_once("} ")?;
        labels
            .iter()
            .all(|(k, v)| set.split(',').any(|pair| pair == format!("{k}=\"{v}\"")))
            .then(|| value.trim().parse().ok())
            .flatten()
    })
}

/// Scrape interval used by these tests (the controller's default is 50 ms).
pub const INTERVAL_MS: u64 = 100;

pub struct Fleet {
    pub sims: Vec<Sim>,
    pub controller: Controller,
    pub envoy: Envoy,
    pub scratch: Scratch,
}

/// What a [`Fleet`] runs.
#[derive(Default)]
pub struct FleetSpec<'a> {
    /// Simulator names with their extra flags.
    pub sims: &'a [(&'a str, &'a [&'a str])],
    /// An EndpointPickerConfig; `{ENDPOINTS}` is replaced by the endpoints file's path. Without
    /// one the controller gets `--endpoints-file`.
    pub config: Option<&'a str>,
    /// InferenceObjective / InferenceModelRewrite manifests (`--manifests`).
    pub manifests: Option<&'a str>,
    /// Envoy worker threads (0 → 1).
    pub concurrency: u32,
    /// Turn on the decision header.
    pub explain: bool,
    /// The shipped Envoy config (default envoy.yaml).
    pub envoy_config: Option<&'static str>,
}

/// Simulators, a controller discovering them from a file, and Envoy, as `spec` says.
pub fn fleet_from(name: &str, spec: FleetSpec<'_>) -> Fleet {
    let scratch = Scratch::new(name);
    let sims: Vec<Sim> = spec
        .sims
        .iter()
        .map(|(n, flags)| Sim::start(&scratch, n, flags))
        .collect();
    let file = endpoints_file(&scratch, &sims.iter().collect::<Vec<_>>());
    let mut args = Vec::new();
    match spec.config {
        Some(config) => {
            let path = scratch.path("config.yaml");
            fs::write(
                &path,
                config.replace("{ENDPOINTS}", &file.display().to_string()),
            )
            .expect("write config");
            args.extend(["--config-file".to_string(), path.display().to_string()]);
        }
        None => args.extend(["--endpoints-file".to_string(), file.display().to_string()]),
    }
    if let Some(manifests) = spec.manifests {
        let path = scratch.path("manifests.yaml");
        fs::write(&path, manifests).expect("write manifests");
        args.extend(["--manifests".to_string(), path.display().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let controller = Controller::start(&scratch, &format!("{INTERVAL_MS}ms"), &args);
    let envoy = Envoy::start(
        &scratch,
        EnvoyOptions {
            concurrency: spec.concurrency.max(1),
            explain: spec.explain,
            config: spec.envoy_config.unwrap_or("envoy.yaml"),
            ..EnvoyOptions::with_controller(controller.port)
        },
    );
    Fleet {
        sims,
        controller,
        envoy,
        scratch,
    }
}

/// A controller for the EndpointPickerConfig at `config` and an Envoy with `concurrency`
/// workers polling it, which has its first snapshot.
pub fn configured(scratch: &Scratch, config: &Path, concurrency: u32) -> (Controller, Envoy) {
    let controller = Controller::start(
        scratch,
        "100ms",
        &["--config-file", config.to_str().unwrap_or_default()],
    );
    let envoy = Envoy::start(
        scratch,
        EnvoyOptions {
            concurrency,
            ..EnvoyOptions::with_controller(controller.port)
        },
    );
    envoy.wait_for_snapshot();
    (controller, envoy)
}

/// Plain simulators `names` with the default profile.
pub fn fleet(name: &str, names: &[&str], concurrency: u32) -> Fleet {
    let sims: Vec<(&str, &[&str])> = names.iter().map(|n| (*n, &[][..])).collect();
    fleet_from(
        name,
        FleetSpec {
            sims: &sims,
            concurrency,
            ..FleetSpec::default()
        },
    )
}

/// A prompt no other request has used, so prefix affinity plays no part.
pub fn unique(tag: &str) -> String {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    format!(
        "{tag} {}",
        N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

/// The instance that serves `n` requests in a row, if it is always the same one.
pub fn sticky_instance(envoy: &Envoy, n: usize) -> Option<String> {
    let first = envoy.complete(&unique("which"), &[]).instance().to_string();
    (0..n)
        .all(|_| envoy.complete(&unique("which"), &[]).instance() == first)
        .then_some(first)
}
