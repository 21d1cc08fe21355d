//! End to end against two real vLLM servers (CPU build, a tiny local model with two LoRA
//! adapters): the real controller scraping their real `/metrics`, the real Envoy with the filter.
//!
//! `make test-vllm` installs vLLM, starts the servers (one pinned per core), and runs these with
//! `--ignored --test-threads 1` and `WASM_EPP_VLLM=host:port,host:port`: they share the two
//! servers, so they run one at a time, and each uses prompts no other test sent (a random tag at
//! the start), so what one test leaves in the servers' prefix caches does not help another.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::collections::HashMap;
use std::fs;
use std::thread;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// The model name the servers serve (`--served-model-name`).
const MODEL: &str = "tiny";

/// How long a test waits for the controller to see a server-side change.
const SEE: Duration = Duration::from_secs(20);

/// The most a long background generation may take on a CPU (1,500 tokens, or 600 queued behind
/// 19 others on one server).
const LONG_REQUEST_TIMEOUT: Duration = Duration::from_secs(120);

/// The two servers, from `WASM_EPP_VLLM`.
fn servers() -> Vec<String> {
    let list = std::env::var("WASM_EPP_VLLM")
        .expect("WASM_EPP_VLLM is not set: run these tests with `make test-vllm`");
    let servers: Vec<String> = list.split(',').map(str::to_string).collect();
    assert_eq!(servers.len(), 2, "WASM_EPP_VLLM={list}");
    servers
}

/// A tag no earlier request used, so prompts built on it start cold in every prefix cache.
fn fresh_tag() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    format!("{} {}", unique("run"), nanos)
}

/// About `tokens` tokens of English-like text after `tag` (the repository's README).
fn long_text(tag: &str, tokens: usize) -> String {
    let readme = fs::read_to_string(repo().join("README.md")).expect("README.md");
    // The tiny model's tokenizer was trained on this repository's text: about 3 characters per
    // token.
    let chars: String = readme.chars().take(tokens * 3).collect();
    format!("{tag}\n{chars}")
}

/// The servers as an endpoints file, named `vllm-0` and `vllm-1`.
fn endpoints(scratch: &Scratch) -> std::path::PathBuf {
    let mut yaml = String::from("endpoints:\n");
    for (i, server) in servers().iter().enumerate() {
        let (address, port) = server.split_once(':').expect("host:port");
        yaml.push_str(&format!(
            "- name: vllm-{i}\n  namespace: e2e\n  address: {address}\n  port: {port}\n"
        ));
    }
    let path = scratch.path("endpoints.yaml");
    fs::write(&path, yaml).expect("write the endpoints file");
    path
}

/// The controller and Envoy in front of the two servers.
struct Front {
    controller: Controller,
    envoy: Envoy,
    _scratch: Scratch,
}

impl Front {
    /// With the upstream default profile, or `config` (an EndpointPickerConfig whose
    /// `{ENDPOINTS}` is the endpoints file), and `manifests` if given.
    fn start(name: &str, config: Option<&str>, manifests: Option<&str>) -> Front {
        let scratch = Scratch::new(name);
        let file = endpoints(&scratch);
        let mut args: Vec<String> = Vec::new();
        match config {
            Some(config) => {
                let path = scratch.path("config.yaml");
                fs::write(
                    &path,
                    config.replace("{ENDPOINTS}", &file.display().to_string()),
                )
                .expect("write the config");
                args.extend(["--config-file".into(), path.display().to_string()]);
            }
            None => args.extend(["--endpoints-file".into(), file.display().to_string()]),
        }
        if let Some(manifests) = manifests {
            let path = scratch.path("manifests.yaml");
            fs::write(&path, manifests).expect("write the manifests");
            args.extend(["--manifests".into(), path.display().to_string()]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let controller = Controller::start(&scratch, "50ms", &args);
        let envoy = Envoy::start(
            &scratch,
            EnvoyOptions {
                explain: true,
                ..EnvoyOptions::with_controller(controller.port)
            },
        );
        let front = Front {
            controller,
            envoy,
            _scratch: scratch,
        };
        assert!(
            wait_until(SEE, || front
                .post("/v1/completions", &completion_body(MODEL, "warm-up", 1))
                .status
                != 503),
            "the filter never got a snapshot"
        );
        assert!(
            wait_until(SEE, || front
                .endpoints()
                .iter()
                .all(|e| e["scrapes_ok"].as_u64().unwrap_or(0) > 0)),
            "the controller never scraped both servers: {:?}",
            front.endpoints()
        );
        front
    }

    /// The controller's `/debug/endpoints`.
    fn endpoints(&self) -> Vec<Value> {
        let reply = get(
            &format!(
                "http://127.0.0.1:{}/debug/endpoints",
                self.controller.admin_port
            ),
            &[],
        );
        serde_json::from_str(&reply.body).unwrap_or_default()
    }

    /// The metrics the controller holds for `server` (`host:port`).
    fn metrics_of(&self, server: &str) -> Value {
        self.endpoints()
            .into_iter()
            .find(|e| format!("{}:{}", e["address"].as_str().unwrap_or(""), e["port"]) == server)
            .map(|e| e["metrics"].clone())
            .unwrap_or(Value::Null)
    }

    /// POSTs `body` to `path` through Envoy.
    fn post(&self, path: &str, body: &Value) -> Reply {
        post(&self.envoy.url(path), &body.to_string(), &[])
    }
}

/// The server (`host:port`) the filter picked for `reply`, from its decision header.
fn picked(reply: &Reply) -> String {
    reply
        .header("x-wasm-epp-decision")
        .and_then(|d| d.strip_prefix("picked="))
        .and_then(|d| d.split([';', ',']).next())
        .unwrap_or_else(|| panic!("no decision header: {reply:?}"))
        .trim()
        .to_string()
}

/// A completion request for `model`.
fn completion_body(model: &str, prompt: &str, max_tokens: u32) -> Value {
    json!({
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": true,
    })
}

/// One sample of `name` (labels ignored, summed) from `server`'s own `/metrics`.
fn server_metric(server: &str, name: &str) -> f64 {
    let text = get(&format!("http://{server}/metrics"), &[]).body;
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let family = series.split('{').next()?;
            (family == name)
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The prefix-cache counters of every server: (hits, queries) in tokens.
fn prefix_counters() -> HashMap<String, (f64, f64)> {
    servers()
        .into_iter()
        .map(|s| {
            let hits = server_metric(&s, "vllm:prefix_cache_hits_total");
            let queries = server_metric(&s, "vllm:prefix_cache_queries_total");
            (s, (hits, queries))
        })
        .collect()
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn the_controller_reads_the_real_servers() {
    let front = Front::start("vllm-debug", None, None);
    for server in servers() {
        // vLLM reports its LoRA slots once an adapter has been used.
        let reply = post(
            &format!("http://{server}/v1/completions"),
            &completion_body("lora1", "hello", 2).to_string(),
            &[],
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert!(
            wait_until(SEE, || front.metrics_of(&server)["max_active_models"] == 2),
            "{server}: no LoRA slots seen: {}",
            front.metrics_of(&server)
        );
        let metrics = front.metrics_of(&server);
        assert_eq!(metrics["block_size"], 128, "{server}: {metrics}");
        assert_eq!(metrics["num_gpu_blocks"], 64, "{server}: {metrics}");
        assert!(metrics["kv_cache_usage"].is_number(), "{metrics}");
        assert!(metrics["waiting_queue_size"].is_number(), "{metrics}");
        // Tokens decoded between two scrapes give its decode speed, from vLLM's
        // `vllm:inter_token_latency_seconds` histogram (which the request above made sure
        // exists before this one).
        let reply = post(
            &format!("http://{server}/v1/completions"),
            &completion_body(MODEL, "hello", 4).to_string(),
            &[],
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        let decode_ms = || {
            front.metrics_of(&server)["decode_ms_per_token"]
                .as_f64()
                .unwrap_or(0.0)
        };
        assert!(
            wait_until(SEE, || decode_ms() > 0.0),
            "{server}: no decode speed: {}",
            front.metrics_of(&server)
        );
    }
    let reply = front.post("/v1/completions", &completion_body(MODEL, "hello", 4));
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(servers().contains(&picked(&reply)));
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn picks_follow_the_real_queue() {
    let front = Front::start("vllm-queue", None, None);
    let (busy, idle) = (servers()[0].clone(), servers()[1].clone());
    // 20 long requests straight to one server (8 run at a time; the rest wait).
    let tag = fresh_tag();
    let load: Vec<_> = (0..20)
        .map(|i| {
            let (busy, prompt) = (busy.clone(), format!("{tag} load {i}"));
            thread::spawn(move || {
                post_within(
                    &format!("http://{busy}/v1/completions"),
                    &completion_body(MODEL, &prompt, 600).to_string(),
                    &[],
                    LONG_REQUEST_TIMEOUT,
                )
                .status
            })
        })
        .collect();
    assert!(
        wait_until(SEE, || front.metrics_of(&busy)["waiting_queue_size"]
            .as_u64()
            .unwrap_or(0)
            >= 4),
        "the loaded server never reported a queue: {}",
        front.metrics_of(&busy)
    );
    let mut picks = Vec::new();
    for i in 0..10 {
        let reply = front.post(
            "/v1/completions",
            &completion_body(MODEL, &format!("{tag} probe {i}"), 2),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        picks.push(picked(&reply));
    }
    let to_idle = picks.iter().filter(|p| **p == idle).count();
    assert!(
        to_idle >= 9,
        "with {busy} queueing, {to_idle}/10 went to the idle {idle}: {picks:?}"
    );
    for handle in load {
        assert_eq!(handle.join().unwrap(), 200);
    }
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn a_repeated_long_prompt_lands_where_it_is_cached() {
    let front = Front::start("vllm-prefix", None, None);
    let prompt = long_text(&fresh_tag(), 2_000);
    let before = prefix_counters();
    let first = front.post("/v1/completions", &completion_body(MODEL, &prompt, 2));
    assert_eq!(first.status, 200, "{}", first.body);
    let home = picked(&first);
    for i in 0..4 {
        let reply = front.post(
            "/v1/completions",
            &completion_body(MODEL, &format!("{prompt} question {i}"), 2),
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        assert_eq!(
            picked(&reply),
            home,
            "request {i} left the server that cached the prompt"
        );
    }
    let after = prefix_counters();
    let hits = |s: &str| after[s].0 - before[s].0;
    let other = servers().into_iter().find(|s| *s != home).unwrap();
    // Four repeats of a ~2,000-token prompt in whole 128-token blocks.
    assert!(
        hits(&home) >= 4.0 * 1_000.0,
        "{home} (the server that cached the prompt) hit only {} tokens",
        hits(&home)
    );
    assert_eq!(hits(&other), 0.0, "{other} saw none of these prompts");
}

/// Sends `groups` × `per_group` requests sharing a long per-group prefix to `url`, one at a
/// time; returns the servers' prefix-cache hit rate over them (hit tokens / queried tokens).
fn shared_prefix_hit_rate(url: &str, groups: usize, per_group: usize) -> f64 {
    let before = prefix_counters();
    for g in 0..groups {
        let prefix = long_text(&format!("{} group {g}", fresh_tag()), 1_200);
        for r in 0..per_group {
            let reply = post(
                url,
                &completion_body(MODEL, &format!("{prefix} user {r}"), 2).to_string(),
                &[],
            );
            assert_eq!(reply.status, 200, "{}", reply.body);
        }
    }
    let after = prefix_counters();
    let (hits, queries) = servers().iter().fold((0.0, 0.0), |(h, q), s| {
        (h + after[s].0 - before[s].0, q + after[s].1 - before[s].1)
    });
    hits / queries.max(1.0)
}

/// Envoy with a round-robin cluster of the two servers and no picker; returns (Envoy, URL).
fn round_robin_envoy(scratch: &Scratch) -> (Proc, String) {
    let (port, admin) = (free_port(), free_port());
    let endpoints: String = servers()
        .iter()
        .map(|s| {
            let (address, port) = s.split_once(':').unwrap();
            format!(
                "        - endpoint: {{ address: {{ socket_address: {{ address: {address}, port_value: {port} }} }} }}\n"
            )
        })
        .collect();
    let vars = HashMap::from([
        ("ADMIN_PORT".to_string(), admin.to_string()),
        ("PORT".to_string(), port.to_string()),
        ("LB_POLICY".to_string(), "ROUND_ROBIN".to_string()),
        ("ENDPOINTS".to_string(), endpoints.trim_end().to_string()),
    ]);
    let config = render_template("plain.yaml", &vars);
    let path = scratch.path("round-robin.yaml");
    fs::write(&path, config).expect("write the round-robin config");
    let proc = Proc::spawn(
        std::process::Command::new(
            std::env::var("ENVOY_BIN").unwrap_or_else(|_| ".venv/envoy".into()),
        )
        .arg("-c")
        .arg(&path)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "-l",
            "warning",
        ])
        .args(["--base-id", &port.to_string()]),
        &scratch.path("round-robin.log"),
    );
    let ready = format!("http://127.0.0.1:{admin}/ready");
    assert!(
        wait_until(Duration::from_secs(20), || get(&ready, &[]).status == 200),
        "the round-robin Envoy did not become ready"
    );
    (proc, format!("http://127.0.0.1:{port}/v1/completions"))
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn the_servers_hit_their_prefix_cache_more_through_wasm_epp_than_round_robin() {
    let front = Front::start("vllm-hit-rate", None, None);
    let scratch = Scratch::new("vllm-hit-rate-rr");
    let (_rr, rr_url) = round_robin_envoy(&scratch);
    let rr = shared_prefix_hit_rate(&rr_url, 3, 4);
    let epp = shared_prefix_hit_rate(&front.envoy.url("/v1/completions"), 3, 4);
    eprintln!(
        "vllm prefix-cache hit rate, 3 groups x 4 requests sharing ~1,200 tokens: \
         wasm-epp {:.1} %, round-robin {:.1} %",
        epp * 100.0,
        rr * 100.0
    );
    assert!(
        epp > rr + 0.1,
        "wasm-epp {epp:.3} is not clearly above round-robin {rr:.3}"
    );
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn lora_requests_follow_the_adapter_a_server_is_running() {
    let config = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\nplugins:\n\
        - type: lora-affinity-scorer\n\
        - type: file-discovery\n  parameters: {path: \"{ENDPOINTS}\"}\n\
        schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: lora-affinity-scorer\n\
        dataLayer:\n  discovery: {pluginRef: file-discovery}\n";
    let front = Front::start("vllm-lora", Some(config), None);
    for (adapter, server) in [
        ("lora1", servers()[0].clone()),
        ("lora2", servers()[1].clone()),
    ] {
        // A long request for the adapter straight to one server makes it that server's running
        // adapter, as vLLM's `vllm:lora_requests_info` reports.
        let (target, prompt) = (server.clone(), format!("{} {adapter}", fresh_tag()));
        // 1,500 tokens on a CPU can outlast the usual 15 s request limit.
        let long = thread::spawn(move || {
            post_within(
                &format!("http://{target}/v1/completions"),
                &completion_body(adapter, &prompt, 1_500).to_string(),
                &[],
                LONG_REQUEST_TIMEOUT,
            )
        });
        assert!(
            wait_until(SEE, || front.metrics_of(&server)["active_models"]
                .as_array()
                .is_some_and(|a| a.iter().any(|m| m == adapter))),
            "{server} never reported {adapter} running: {}",
            front.metrics_of(&server)
        );
        // The controller knows; wait until the filter's snapshot does too (under the CPU load
        // of the running request the poller and the worker can lag the controller): a probe
        // held to that server by the subset header shows its score in the decision header.
        assert!(
            wait_until(SEE, || {
                let reply = post(
                    &front.envoy.url("/v1/completions"),
                    &completion_body(adapter, &format!("{adapter} ready?"), 1).to_string(),
                    &[("x-gateway-destination-endpoint-subset", server.as_str())],
                );
                reply
                    .header("x-wasm-epp-decision")
                    .is_some_and(|d| d.contains("lora-affinity-scorer=1.000"))
            }),
            "the filter never saw {adapter} running on {server}"
        );
        for i in 0..3 {
            let reply = front.post(
                "/v1/completions",
                &completion_body(adapter, &format!("{adapter} probe {i}"), 2),
            );
            assert_eq!(reply.status, 200, "{}", reply.body);
            assert_eq!(picked(&reply), server, "{adapter} request {i}");
        }
        let long = long.join().unwrap();
        assert_eq!(long.status, 200, "{}", long.body);
    }
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn a_model_rewrite_reaches_the_adapter() {
    let manifests = "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\n\
        metadata: {name: canary, namespace: e2e}\n\
        spec:\n  poolRef: {name: pool}\n  rules:\n  - matches: [{model: {type: Exact, value: tiny-canary}}]\n\
        \x20   targets: [{modelRewrite: lora2, weight: 100}]\n";
    let front = Front::start("vllm-rewrite", None, Some(manifests));
    let prompt = format!("{} rewrite", fresh_tag());
    let server = &servers()[0];
    let direct = |model: &str| {
        let reply = post(
            &format!("http://{server}/v1/completions"),
            &completion_body(model, &prompt, 8).to_string(),
            &[],
        );
        assert_eq!(reply.status, 200, "{}", reply.body);
        let body: Value = serde_json::from_str(&reply.body).unwrap();
        body["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let (as_lora2, as_base) = (direct("lora2"), direct(MODEL));
    assert_ne!(as_lora2, as_base, "the adapter changes nothing: no proof");
    let reply = front.post(
        "/v1/completions",
        &completion_body("tiny-canary", &prompt, 8),
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(
        body["choices"][0]["text"],
        json!(as_lora2),
        "served by lora2"
    );
    assert_eq!(
        body["model"], "tiny-canary",
        "the client's model name comes back"
    );
}

#[test]
#[ignore = "needs two real vLLM servers: make test-vllm"]
fn streams_chat_and_errors_pass_through_as_vllm_answers_them() {
    let front = Front::start("vllm-protocol", None, None);
    let tag = fresh_tag();

    // A stream with usage: SSE chunks, the usage, [DONE].
    let mut stream = completion_body(MODEL, &format!("{tag} stream"), 12);
    stream["stream"] = json!(true);
    stream["stream_options"] = json!({"include_usage": true});
    let reply = front.post("/v1/completions", &stream);
    assert_eq!(reply.status, 200, "{}", reply.body);
    assert!(reply
        .header("content-type")
        .is_some_and(|c| c.starts_with("text/event-stream")));
    let events: Vec<&str> = reply
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{}", reply.body);
    let usage: Value = serde_json::from_str(events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["completion_tokens"], 12, "{usage}");
    assert!(events.len() >= 12, "{} events", events.len());

    // Chat.
    let chat = json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": format!("{tag} chat")}],
        "max_tokens": 5, "temperature": 0, "ignore_eos": true,
    });
    let reply = front.post("/v1/chat/completions", &chat);
    assert_eq!(reply.status, 200, "{}", reply.body);
    let body: Value = serde_json::from_str(&reply.body).unwrap();
    assert_eq!(body["choices"][0]["message"]["role"], "assistant", "{body}");
    assert_eq!(body["usage"]["completion_tokens"], 5, "{body}");

    // Errors: the same status and body as from vLLM itself.
    let server = &servers()[0];
    for (what, body) in [
        ("an unknown model", completion_body("no-such-model", "x", 2)),
        ("too many tokens", completion_body(MODEL, "x", 100_000)),
    ] {
        let through = front.post("/v1/completions", &body);
        let direct = post(
            &format!("http://{server}/v1/completions"),
            &body.to_string(),
            &[],
        );
        assert!(
            (400..500).contains(&direct.status),
            "{what}: vLLM answered {}",
            direct.status
        );
        assert_eq!(through.status, direct.status, "{what}: {}", through.body);
        let (through, direct): (Value, Value) = (
            serde_json::from_str(&through.body).unwrap(),
            serde_json::from_str(&direct.body).unwrap(),
        );
        assert_eq!(
            through["error"]["message"], direct["error"]["message"],
            "{what}"
        );
    }
}
