//! End-to-end tests against the real `vllm-sim` binary on 127.0.0.1.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// A running simulator, killed when dropped.
struct Sim {
    child: Child,
    base: String,
    // Held so that the simulator's stderr stays open.
    _stderr: BufReader<ChildStderr>,
}

impl Sim {
    /// Starts the binary on a free port and waits for its listening line.
    fn start(args: &[&str]) -> Sim {
        let mut child = Command::new(env!("CARGO_BIN_EXE_vllm-sim"))
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--instance-name",
                "itest",
            ])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn vllm-sim");
        let mut stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let mut line = String::new();
        stderr.read_line(&mut line).expect("read listening line");
        assert!(
            line.starts_with("vllm-sim itest listening on 127.0.0.1:"),
            "{line}"
        );
        let addr = line.trim().rsplit(' ').next().expect("address").to_owned();
        Sim {
            child,
            base: format!("http://{addr}"),
            _stderr: stderr,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn metrics(&self) -> String {
        agent()
            .get(self.url("/metrics"))
            .call()
            .expect("GET /metrics")
            .body_mut()
            .read_to_string()
            .expect("metrics body")
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(10)))
        .build()
        .into()
}

/// The value of the sample of `name` in a Prometheus text.
fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {name} in:\n{text}"))
}

#[test]
fn completions_answer_json_with_usage_and_headers() {
    let sim = Sim::start(&[]);
    let mut response = agent()
        .post(sim.url("/v1/completions"))
        .header("x-gateway-destination-endpoint", "127.0.0.1:9999")
        .send_json(json!({"model": MODEL, "prompt": "hello world!", "max_tokens": 5}))
        .expect("POST");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-sim-instance"], "itest");
    assert_eq!(
        response.headers()["x-sim-received-destination"],
        "127.0.0.1:9999"
    );
    let body: Value = response.body_mut().read_json().expect("json");
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["model"], MODEL);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(
        body["usage"],
        json!({"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let text = body["choices"][0]["text"].as_str().expect("text");
    assert_eq!(text.len(), 20);
}

#[test]
fn chat_streams_one_chunk_per_token_then_usage_and_done() {
    let sim = Sim::start(&["--itl-ms", "25", "--ttft-base-ms", "10"]);
    let response = agent()
        .post(sim.url("/v1/chat/completions"))
        .send_json(json!({
            "model": MODEL,
            "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": 5,
            "stream": true,
            "stream_options": {"include_usage": true},
        }))
        .expect("POST");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut events = Vec::new();
    for line in BufReader::new(response.into_body().into_reader()).lines() {
        let line = line.expect("line");
        if let Some(data) = line.strip_prefix("data: ") {
            events.push((Instant::now(), data.to_owned()));
        }
    }
    assert_eq!(events.len(), 7, "5 tokens, usage, [DONE]: {events:?}");
    let chunks: Vec<Value> = events[..6]
        .iter()
        .map(|(_, data)| serde_json::from_str(data).expect("chunk json"))
        .collect();
    for chunk in &chunks[..5] {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert!(chunk["choices"][0]["delta"]["content"].is_string());
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 5);
    assert_eq!(chunks[5]["usage"]["prompt_tokens"], 5); // "user" + 15 bytes = 19 bytes
    assert_eq!(events[6].1, "[DONE]");
    // Tokens are paced: four inter-token gaps of 25 ms each.
    let decode = events[4].0 - events[0].0;
    assert!(
        decode >= Duration::from_millis(80),
        "tokens not paced: {decode:?}"
    );
}

#[test]
fn metrics_show_waiting_requests_while_in_flight() {
    let sim = Sim::start(&["--max-num-seqs", "1", "--itl-ms", "20"]);
    let url = sim.url("/v1/completions");
    let clients: Vec<_> = (0..3)
        .map(|i| {
            let url = url.clone();
            thread::spawn(move || {
                let prompt = format!("request {i}");
                agent()
                    .post(&url)
                    .send_json(json!({"model": MODEL, "prompt": prompt, "max_tokens": 15}))
                    .map(|r| r.status())
            })
        })
        .collect();
    let mut seen = None;
    for _ in 0..200 {
        let text = sim.metrics();
        let (waiting, running) = (
            sample(&text, "vllm:num_requests_waiting"),
            sample(&text, "vllm:num_requests_running"),
        );
        assert!(running <= 1.0, "max-num-seqs 1 but {running} running");
        if waiting >= 1.0 {
            seen = Some((waiting, running, sample(&text, "vllm:kv_cache_usage_perc")));
            break;
        }
        thread::sleep(Duration::from_millis(5));
    }
    let (_, running, kv) = seen.expect("never saw a waiting request");
    assert_eq!(running, 1.0);
    assert!(kv > 0.0);
    for client in clients {
        assert_eq!(client.join().expect("client thread").expect("request"), 200);
    }
    let text = sim.metrics();
    assert_eq!(sample(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    assert_eq!(sample(&text, "vllm:request_success_total"), 3.0);
    assert_eq!(sample(&text, "vllm:generation_tokens_total"), 45.0);
    assert!(text.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\","));
}

#[test]
fn metrics_override_pins_and_clears() {
    let sim = Sim::start(&["--lora-modules", "sql,chat"]);
    let agent = agent();
    let response = agent
        .put(sim.url("/sim/metrics-override"))
        .send_json(json!({"waiting": 42, "kv_cache_usage": 0.75}))
        .expect("PUT");
    assert_eq!(response.status(), 200);
    let text = sim.metrics();
    assert_eq!(sample(&text, "vllm:num_requests_waiting"), 42.0);
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), 0.75);
    assert_eq!(sample(&text, "vllm:num_requests_running"), 0.0);
    assert!(text.contains(
        "vllm:lora_requests_info{max_lora=\"2\",running_lora_adapters=\"\",waiting_lora_adapters=\"\","
    ));
    let mut stats = agent.get(sim.url("/sim/stats")).call().expect("stats");
    let stats: Value = stats.body_mut().read_json().expect("stats json");
    assert_eq!(stats["waiting"], 0, "stats are never overridden");

    agent
        .delete(sim.url("/sim/metrics-override"))
        .call()
        .expect("DELETE");
    let text = sim.metrics();
    assert_eq!(sample(&text, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(sample(&text, "vllm:kv_cache_usage_perc"), 0.0);
}

#[test]
fn errors_are_openai_shaped() {
    let sim = Sim::start(&[]);
    let agent = agent();
    let mut bad = agent
        .post(sim.url("/v1/chat/completions"))
        .content_type("application/json")
        .send("{\"model\": ")
        .expect("POST");
    assert_eq!(bad.status(), 400);
    let body: Value = bad.body_mut().read_json().expect("json");
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["code"], 400);

    let mut unknown = agent
        .post(sim.url("/v1/completions"))
        .send_json(json!({"model": "nope", "prompt": "x"}))
        .expect("POST");
    assert_eq!(unknown.status(), 404);
    let body: Value = unknown.body_mut().read_json().expect("json");
    assert_eq!(body["error"]["type"], "NotFoundError");

    let health = agent.get(sim.url("/health")).call().expect("health");
    assert_eq!(health.status(), 200);
}

#[test]
fn bind_failure_is_one_message_and_a_failure_exit() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port().to_string();
    let output = Command::new(env!("CARGO_BIN_EXE_vllm-sim"))
        .args(["--host", "127.0.0.1", "--port", &port])
        .output()
        .expect("run vllm-sim");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("vllm-sim: cannot listen on 127.0.0.1:"),
        "{stderr}"
    );
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn sigterm_stops_the_server_cleanly() {
    let mut sim = Sim::start(&[]);
    let killed = Command::new("kill")
        .args(["-TERM", &sim.child.id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(status) = sim.child.try_wait().expect("try_wait") {
            assert!(status.success(), "{status}");
            break;
        }
        assert!(Instant::now() < deadline, "still running after SIGTERM");
        thread::sleep(Duration::from_millis(10));
    }
}
