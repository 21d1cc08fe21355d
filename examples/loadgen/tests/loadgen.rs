//! Runs the real binary against a tiny in-test HTTP/1.1 server.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;

use serde_json::Value;

const BODY: &str = r#"{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":10,"completion_tokens":3,"total_tokens":13}}"#;

/// Starts a keep-alive server answering every request with [`BODY`] and an
/// `x-sim-instance` header alternating between `sim-a` and `sim-b`.
fn serve() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let served = Arc::new(AtomicUsize::new(0));
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let served = served.clone();
            thread::spawn(move || answer(stream, &served));
        }
    });
    format!("http://{addr}/v1/completions")
}

/// Answers requests on one connection until the client closes it.
fn answer(stream: TcpStream, served: &AtomicUsize) {
    let mut writer = stream.try_clone().expect("clone");
    let mut reader = BufReader::new(stream);
    loop {
        let mut length = 0;
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                return;
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        let n = served.fetch_add(1, Ordering::SeqCst);
        let instance = if n % 2 == 0 { "sim-a" } else { "sim-b" };
        let response = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-sim-instance: {instance}\r\ncontent-length: {}\r\n\r\n{BODY}",
            BODY.len()
        );
        if writer.write_all(response.as_bytes()).is_err() {
            return;
        }
    }
}

fn loadgen(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_wasm-epp-loadgen"))
        .args(args)
        .output()
        .expect("runs the binary")
}

#[test]
fn counts_requests_per_instance() {
    let url = serve();
    let json_path =
        std::env::temp_dir().join(format!("wasm-epp-loadgen-test-{}.json", std::process::id()));
    let json_arg = json_path.to_str().expect("utf-8 temp path");
    let trace_path = json_path.with_extension("trace.jsonl");
    let trace_arg = trace_path.to_str().expect("utf-8 temp path");
    let out = loadgen(&[
        "--url",
        &url,
        "--requests",
        "20",
        "--concurrency",
        "4",
        "--label",
        "it",
        "--json",
        json_arg,
        "--trace",
        trace_arg,
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("== wasm-epp-loadgen: it =="), "{stdout}");
    assert!(stdout.contains("20 sent, 20 ok, 0 errors"), "{stdout}");

    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("JSON written"))
            .expect("JSON");
    let _ = std::fs::remove_file(&json_path);
    assert_eq!(report["requests"], 20);
    assert_eq!(report["ok"], 20);
    assert_eq!(report["errors"], serde_json::json!({}));
    assert_eq!(report["output_tokens"], 60);
    assert_eq!(report["label"], "it");
    let mut instances: Vec<(String, u64)> = report["instances"]
        .as_array()
        .expect("instances")
        .iter()
        .map(|i| {
            (
                i["name"].as_str().unwrap_or("").to_string(),
                i["count"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    instances.sort();
    assert_eq!(
        instances,
        [("sim-a".to_string(), 10), ("sim-b".to_string(), 10)]
    );
    assert!(report["latency_ms"]["p99"].as_f64().is_some());
    assert!(report["ttft_ms"].is_null());

    // The trace: one line per request, each request once, with its server and latency.
    let trace = std::fs::read_to_string(&trace_path).expect("trace written");
    let _ = std::fs::remove_file(&trace_path);
    let lines: Vec<Value> = trace
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let mut indexes: Vec<u64> = lines.iter().filter_map(|l| l["index"].as_u64()).collect();
    indexes.sort_unstable();
    assert_eq!(indexes, (0..20).collect::<Vec<u64>>());
    for line in &lines {
        assert_eq!(line["status"], 200, "{line}");
        assert!(["sim-a", "sim-b"].contains(&line["instance"].as_str().unwrap_or("")));
        assert!(
            line["latency_ms"].as_f64().is_some_and(|ms| ms > 0.0),
            "{line}"
        );
        assert_eq!(line["max_tokens"], 16, "{line}");
        assert_eq!(line["prompt_bytes"], 1024, "{line}");
        assert!(line["sent_s"].as_f64().is_some_and(|s| s >= 0.0), "{line}");
    }
}

#[test]
fn fails_clearly_when_unreachable_or_misused() {
    // A port that was free a moment ago: nothing listens there now.
    let port = TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address")
        .port();
    let url = format!("http://127.0.0.1:{port}/v1/completions");
    let out = loadgen(&["--url", &url, "--requests", "3", "--timeout", "5"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot reach"), "{stderr}");
    assert!(out.stdout.is_empty());

    let out = loadgen(&["--url", "https://example.com/", "--requests", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not supported"));
}
