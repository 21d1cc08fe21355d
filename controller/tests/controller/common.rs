//! Shared pieces of the integration tests: fake model servers, the controller process, an
//! HTTP client and temporary files.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;

/// vLLM-style metrics text with the given gauges.
pub fn vllm_metrics(waiting: u64, running: u64, kv: f64) -> String {
    format!(
        "# HELP vllm:num_requests_waiting Requests waiting.\n\
         # TYPE vllm:num_requests_waiting gauge\n\
         vllm:num_requests_waiting{{model_name=\"m\"}} {waiting}\n\
         vllm:num_requests_running{{model_name=\"m\"}} {running}\n\
         vllm:kv_cache_usage_perc{{model_name=\"m\"}} {kv}\n\
         vllm:cache_config_info{{block_size=\"16\",num_gpu_blocks=\"1000\"}} 1\n"
    )
}

/// A fake model server on 127.0.0.1 serving `/metrics` text that the test controls, with
/// HTTP/1.1 keep-alive.
pub struct FakeServer {
    /// Its port.
    pub port: u16,
    body: Arc<Mutex<String>>,
    requests: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
}

impl FakeServer {
    /// Starts serving `body`.
    pub fn start(body: &str) -> FakeServer {
        FakeServer::start_at("127.0.0.1:0", body)
    }

    /// Starts serving `body` on `addr` (e.g. `127.0.0.2:0`; Linux routes all of 127.0.0.0/8
    /// to the loopback interface, so several servers can share one port on distinct
    /// addresses).
    pub fn start_at(addr: &str, body: &str) -> FakeServer {
        let listener = TcpListener::bind(addr).unwrap();
        let port = listener.local_addr().unwrap().port();
        let body = Arc::new(Mutex::new(body.to_string()));
        let requests = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (shared_body, shared_requests) = (body.clone(), requests.clone());
        let shared_connections = connections.clone();
        thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                shared_connections.fetch_add(1, Ordering::SeqCst);
                let (body, requests) = (shared_body.clone(), shared_requests.clone());
                thread::spawn(move || serve_connection(stream, &body, &requests));
            }
        });
        FakeServer {
            port,
            body,
            requests,
            connections,
        }
    }

    /// Replaces the metrics text.
    pub fn set(&self, body: &str) {
        *self.body.lock().unwrap() = body.to_string();
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn serve_connection(stream: TcpStream, body: &Mutex<String>, requests: &AtomicUsize) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut writer = stream;
    loop {
        // Read one request head; GET requests have no body.
        let mut line = String::new();
        let mut saw_request = false;
        loop {
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) if line == "\r\n" || line == "\n" => break,
                Ok(_) => saw_request = true,
            }
        }
        if !saw_request {
            continue;
        }
        requests.fetch_add(1, Ordering::SeqCst);
        let text = body.lock().unwrap().clone();
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{text}",
            text.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

/// A server that accepts connections and never answers (a hung model server).
pub fn black_hole() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

/// A port with nothing listening on it.
pub fn closed_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A fresh temporary directory for one test.
pub fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "wasm-epp-controller-it-{}-{test}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes an endpoints file listing `(name, port)` pairs on 127.0.0.1.
pub fn write_endpoints(path: &Path, endpoints: &[(&str, u16)]) {
    let mut text = String::from("endpoints:\n");
    for (name, port) in endpoints {
        text.push_str(&format!(
            "- name: {name}\n  namespace: test\n  address: 127.0.0.1\n  port: {port}\n  labels: {{app: fake}}\n"
        ));
    }
    if endpoints.is_empty() {
        text = "endpoints: []\n".to_string();
    }
    // Write-then-rename so the watcher never sees a half-written file.
    let staging = path.with_extension("tmp");
    std::fs::write(&staging, text).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

/// A running controller process; killed on drop.
pub struct Controller {
    child: Child,
    /// `ip:port` of the snapshot API.
    pub snapshot_addr: String,
    /// `ip:port` of the admin server.
    pub admin_addr: String,
    log: Arc<Mutex<Vec<String>>>,
}

impl Controller {
    /// Starts the binary with `args` plus ephemeral listen addresses, and waits for its
    /// startup line.
    pub fn start(args: &[&str]) -> Controller {
        let mut child = Command::new(env!("CARGO_BIN_EXE_wasm-epp-controller"))
            .args(args)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().unwrap();
        let shared = log.clone();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                shared.lock().unwrap().push(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let startup = log
                .lock()
                .unwrap()
                .iter()
                .find(|line| line.contains("listening:"))
                .cloned();
            if let Some(line) = startup {
                let snapshot_addr = between(&line, "snapshot API on ", ",");
                let admin_addr = between(&line, "admin on ", ";");
                return Controller {
                    child,
                    snapshot_addr,
                    admin_addr,
                    log,
                };
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("controller exited with {status}: {:?}", log.lock().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "no startup line: {:?}",
                log.lock().unwrap()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// GET on the snapshot API.
    pub fn snapshot_get(&self, path_and_query: &str) -> Reply {
        get(&format!("http://{}{path_and_query}", self.snapshot_addr))
    }

    /// GET on the admin server.
    pub fn admin_get(&self, path: &str) -> Reply {
        get(&format!("http://{}{path}", self.admin_addr))
    }

    /// The current snapshot as JSON.
    pub fn snapshot(&self) -> Value {
        let reply = self.snapshot_get("/v1/snapshot");
        assert_eq!(reply.status, 200, "{}", reply.body);
        serde_json::from_str(&reply.body).unwrap()
    }

    /// Polls the snapshot (long-polling from the last version seen) until `done` accepts it.
    pub fn wait_for_snapshot(&self, what: &str, done: impl FnMut(&Value) -> bool) -> Value {
        self.wait_for_snapshot_within(what, Duration::from_secs(10), done)
    }

    /// Like [`wait_for_snapshot`](Self::wait_for_snapshot), giving up after `timeout`; the
    /// failure shows the last snapshot's endpoints, objectives and rewrites, and the log.
    pub fn wait_for_snapshot_within(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + timeout;
        let mut version = 0u64;
        let mut last = Value::Null;
        loop {
            let wait_ms = deadline
                .saturating_duration_since(Instant::now())
                .as_millis()
                .clamp(1, 1000);
            let reply =
                self.snapshot_get(&format!("/v1/snapshot?since={version}&wait_ms={wait_ms}"));
            if reply.status == 200 {
                let snapshot: Value = serde_json::from_str(&reply.body).unwrap();
                version = snapshot["version"].as_u64().unwrap();
                if done(&snapshot) {
                    return snapshot;
                }
                last = snapshot;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for {what}; last snapshot: endpoints {}, objectives {}, rewrites {}; log: {:#?}",
                last["endpoints"],
                last["objectives"],
                last["rewrites"],
                self.log()
            );
        }
    }

    /// Waits up to `timeout` for a stderr line that `matches` accepts, and returns it.
    pub fn wait_for_log(
        &self,
        what: &str,
        timeout: Duration,
        matches: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(line) = self.log().into_iter().find(|line| matches(line)) {
                return line;
            }
            assert!(
                Instant::now() < deadline,
                "timed out after {timeout:?} waiting for a log line: {what}; log: {:#?}",
                self.log()
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// The stderr lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap().clone()
    }

    /// The process id (for sending signals).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits up to `timeout` for the process to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            thread::sleep(Duration::from_millis(20));
        }
        None
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn between(line: &str, start: &str, end: &str) -> String {
    let from = line.find(start).unwrap() + start.len();
    let rest = &line[from..];
    rest[..rest.find(end).unwrap()].to_string()
}

/// An HTTP answer.
#[derive(Debug)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// `x-snapshot-version`, if present.
    pub version: Option<u64>,
    /// `content-type`, if present.
    pub content_type: Option<String>,
    /// Body text.
    pub body: String,
}

/// GET `url` (no status is an error).
pub fn get(url: &str) -> Reply {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(40)))
        .build()
        .into();
    let mut response = agent.get(url).call().unwrap();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let version = header("x-snapshot-version").and_then(|v| v.parse().ok());
    let content_type = header("content-type");
    let mut body = String::new();
    response
        .body_mut()
        .as_reader()
        .read_to_string(&mut body)
        .unwrap();
    Reply {
        status: response.status().as_u16(),
        version,
        content_type,
        body,
    }
}

/// The endpoint named `name` in a snapshot.
pub fn endpoint<'s>(snapshot: &'s Value, name: &str) -> Option<&'s Value> {
    snapshot["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == name)
}
