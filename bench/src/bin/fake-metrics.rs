//! `fake-metrics`: many fake vLLM metrics endpoints in one cheap process, for measuring what the
//! controller costs at 10, 100 or 1,000 model servers (`bench/controller_cost.py`).
//!
//! Every port serves `GET /metrics` with vLLM-style Prometheus text (the families the controller
//! reads, optionally followed by latency histograms so the body has a realistic size) and
//! `GET /fake/stats` with the number of metrics requests served by the whole process. Bodies are
//! built once at startup: endpoint `i` serves body `(i + phase) % BODIES`, and the phase moves
//! every `--phase` so the values change slowly. Everything runs on one thread.
//!
//! Once every port is bound, the endpoints file (the controller's `--endpoints-file` format) is
//! written atomically, so its appearance means the servers are ready.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::LocalSet;

/// Distinct bodies per histogram setting; endpoints cycle through them.
const BODIES: usize = 32;

/// Most endpoints one process serves.
const MAX_COUNT: usize = 10_000;

/// Pause after a failed accept (e.g. out of file descriptors).
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The base model, as the `model_name` label.
const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// Prometheus text exposition content type.
const PROMETHEUS: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Histogram families a vLLM server exposes, with their bucket bounds; `--histograms N`
/// appends the first N of them.
const HISTOGRAMS: [(&str, &[f64]); 12] = [
    ("vllm:time_to_first_token_seconds", LATENCY_BUCKETS),
    ("vllm:inter_token_latency_seconds", LATENCY_BUCKETS),
    ("vllm:e2e_request_latency_seconds", LATENCY_BUCKETS),
    ("vllm:request_queue_time_seconds", LATENCY_BUCKETS),
    ("vllm:request_inference_time_seconds", LATENCY_BUCKETS),
    ("vllm:request_prefill_time_seconds", LATENCY_BUCKETS),
    ("vllm:request_decode_time_seconds", LATENCY_BUCKETS),
    ("vllm:request_prompt_tokens", TOKEN_BUCKETS),
    ("vllm:request_generation_tokens", TOKEN_BUCKETS),
    ("vllm:request_params_max_tokens", TOKEN_BUCKETS),
    ("vllm:iteration_tokens_total", TOKEN_BUCKETS),
    ("vllm:request_params_n", &[1.0, 2.0, 5.0, 10.0, 20.0]),
];

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0,
];

const TOKEN_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0,
];

/// fake-metrics: serves vLLM-style /metrics on many ports of one address.
#[derive(Debug, Parser)]
#[command(name = "fake-metrics")]
struct Cli {
    /// Number of endpoints (ports) to serve.
    #[arg(long)]
    count: usize,

    /// First port; the endpoints use base-port .. base-port + count - 1. 0: the system picks
    /// a free port for each endpoint.
    #[arg(long, default_value_t = 0)]
    base_port: u16,

    /// Where to write the endpoints file (controller `--endpoints-file` format) once every
    /// port is bound.
    #[arg(long, value_name = "PATH")]
    endpoints_file: PathBuf,

    /// Address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,

    /// How often, in milliseconds, every endpoint moves on to its next set of values.
    #[arg(long, default_value_t = 1000)]
    phase_ms: u64,

    /// Latency/token histograms appended to every body (0..=12), to give it a real vLLM
    /// server's size.
    #[arg(long, default_value_t = 0)]
    histograms: usize,
}

impl Cli {
    /// Checks the flags that clap cannot.
    fn validate(&self) -> Result<(), String> {
        if self.count == 0 || self.count > MAX_COUNT {
            return Err(format!(
                "--count must be 1..={MAX_COUNT}, got {}",
                self.count
            ));
        }
        if self.histograms > HISTOGRAMS.len() {
            return Err(format!(
                "--histograms must be 0..={}, got {}",
                HISTOGRAMS.len(),
                self.histograms
            ));
        }
        if self.phase_ms == 0 {
            return Err("--phase-ms must be at least 1".to_string());
        }
        if self.base_port != 0 && usize::from(self.base_port) + self.count - 1 > 65_535 {
            return Err(format!(
                "--base-port {} with --count {} runs past port 65535",
                self.base_port, self.count
            ));
        }
        Ok(())
    }
}

/// The gauge values of body `index`.
#[derive(Debug, Clone, PartialEq)]
struct Gauges {
    waiting: u64,
    running: u64,
    kv_cache_usage: f64,
    running_adapters: &'static str,
    waiting_adapters: &'static str,
}

impl Gauges {
    /// Values for body `index`: neighbouring indexes differ, and walking through them changes
    /// each gauge a little at a time.
    fn for_index(index: usize) -> Gauges {
        const RUNNING: [&str; 4] = ["", "sql", "sql,chat", "chat"];
        const WAITING: [&str; 4] = ["", "", "code", ""];
        let step = index % BODIES;
        // A triangle wave over the bodies: 0 → 1 → 0 in BODIES steps.
        let half = BODIES / 2;
        let rise = if step <= half { step } else { BODIES - step };
        Gauges {
            waiting: (step % 5) as u64,
            running: 2 + (step % 7) as u64,
            kv_cache_usage: 0.05 + 0.85 * rise as f64 / half as f64,
            running_adapters: RUNNING[step % RUNNING.len()],
            waiting_adapters: WAITING[step % WAITING.len()],
        }
    }
}

/// Renders one exposition: the five families the controller reads, then `histograms`
/// histogram families.
fn render(index: usize, histograms: usize) -> String {
    let g = Gauges::for_index(index);
    let model = format!("engine=\"0\",model_name=\"{MODEL}\"");
    let mut out = String::new();
    let mut family = |name: &str, kind: &str, labels: &str, value: &dyn std::fmt::Display| {
        // Writing to a String cannot fail.
        let _ = write!(
            out,
            "# HELP {name} Fake {name}.\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}\n"
        );
    };
    family("vllm:num_requests_running", "gauge", &model, &g.running);
    family("vllm:num_requests_waiting", "gauge", &model, &g.waiting);
    family(
        "vllm:kv_cache_usage_perc",
        "gauge",
        &model,
        &g.kv_cache_usage,
    );
    let lora = format!(
        "max_lora=\"4\",running_lora_adapters=\"{}\",waiting_lora_adapters=\"{}\",{model}",
        g.running_adapters, g.waiting_adapters
    );
    // vLLM's value is the time of the last change; any increasing number will do.
    family(
        "vllm:lora_requests_info",
        "gauge",
        &lora,
        &(1.7e9 + index as f64),
    );
    let cache = format!("block_size=\"16\",num_gpu_blocks=\"2048\",{model}");
    family("vllm:cache_config_info", "gauge", &cache, &1);
    for (name, buckets) in HISTOGRAMS.iter().take(histograms) {
        render_histogram(&mut out, name, buckets, &model, index);
    }
    out
}

/// Appends one histogram family with cumulative bucket counts.
fn render_histogram(out: &mut String, name: &str, buckets: &[f64], labels: &str, index: usize) {
    let _ = write!(out, "# HELP {name} Fake {name}.\n# TYPE {name} histogram\n");
    let mut cumulative = 0u64;
    for (i, bound) in buckets.iter().enumerate() {
        cumulative += ((index + i) % 4) as u64;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{bound}\"}} {cumulative}");
    }
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let _ = writeln!(out, "{name}_count{{{labels}}} {cumulative}");
    let _ = writeln!(out, "{name}_sum{{{labels}}} {}", cumulative as f64 * 0.25);
}

/// The endpoints file for `ports`, in the controller's file-discovery format.
fn endpoints_yaml(host: IpAddr, ports: &[u16]) -> String {
    let mut out = String::from("endpoints:\n");
    for (i, port) in ports.iter().enumerate() {
        let _ = writeln!(
            out,
            "- {{ name: fake-{i}, address: \"{host}\", port: {port} }}"
        );
    }
    out
}

/// Writes `text` to `path` through a temporary file and a rename, so readers never see a
/// partial file.
fn write_atomically(path: &Path, text: &str) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// What every connection shares.
struct Shared {
    bodies: Vec<Bytes>,
    started: Instant,
    phase: Duration,
    served: AtomicU64,
}

impl Shared {
    /// The body endpoint `endpoint` serves now.
    fn body(&self, endpoint: usize) -> Bytes {
        let phase = (self.started.elapsed().as_millis() / self.phase.as_millis().max(1)) as usize;
        self.bodies[(endpoint + phase) % self.bodies.len()].clone()
    }
}

fn reply(status: StatusCode, content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn handle(shared: &Shared, endpoint: usize, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    match request.uri().path() {
        "/metrics" => {
            shared.served.fetch_add(1, Ordering::Relaxed);
            reply(StatusCode::OK, PROMETHEUS, shared.body(endpoint))
        }
        "/fake/stats" => {
            let stats = serde_json::json!({
                "metrics_requests": shared.served.load(Ordering::Relaxed),
                "body_bytes": shared.bodies.first().map_or(0, Bytes::len),
            });
            reply(
                StatusCode::OK,
                "application/json",
                Bytes::from(stats.to_string()),
            )
        }
        _ => reply(
            StatusCode::NOT_FOUND,
            "text/plain",
            Bytes::from_static(b"not found\n"),
        ),
    }
}

/// Accepts connections on `listener` (endpoint `endpoint`) and serves them, on the local set.
async fn serve(listener: TcpListener, endpoint: usize, shared: Rc<Shared>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let shared = Rc::clone(&shared);
                tokio::task::spawn_local(async move {
                    let service = service_fn(move |request| {
                        let response = handle(&shared, endpoint, &request);
                        async move { Ok::<_, Infallible>(response) }
                    });
                    // A connection error only concerns that client.
                    let _ = http1::Builder::new()
                        .keep_alive(true)
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            Err(error) => {
                eprintln!("fake-metrics: accept failed on endpoint {endpoint}: {error}");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

async fn bind_all(cli: &Cli) -> Result<Vec<TcpListener>, String> {
    let mut listeners = Vec::with_capacity(cli.count);
    for i in 0..cli.count {
        // validate() keeps base_port + count within 65535.
        let port = if cli.base_port == 0 {
            0
        } else {
            cli.base_port + i as u16
        };
        let addr = SocketAddr::new(cli.host, port);
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
        listeners.push(listener);
    }
    Ok(listeners)
}

async fn run(cli: Cli) -> Result<(), String> {
    cli.validate()?;
    let listeners = bind_all(&cli).await?;
    let ports = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<io::Result<Vec<_>>>()
        .map_err(|e| format!("cannot read a bound port: {e}"))?;
    let shared = Rc::new(Shared {
        bodies: (0..BODIES)
            .map(|i| Bytes::from(render(i, cli.histograms)))
            .collect(),
        started: Instant::now(),
        phase: Duration::from_millis(cli.phase_ms),
        served: AtomicU64::new(0),
    });
    for (endpoint, listener) in listeners.into_iter().enumerate() {
        tokio::task::spawn_local(serve(listener, endpoint, Rc::clone(&shared)));
    }
    write_atomically(&cli.endpoints_file, &endpoints_yaml(cli.host, &ports)).map_err(|e| {
        format!(
            "cannot write the endpoints file {}: {e}",
            cli.endpoints_file.display()
        )
    })?;
    eprintln!(
        "fake-metrics serving {} endpoints on {} ({} bytes per body), endpoints in {}",
        cli.count,
        cli.host,
        shared.bodies[0].len(),
        cli.endpoints_file.display()
    );
    shutdown_signal()
        .await
        .map_err(|e| format!("cannot install signal handlers: {e}"))
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() -> io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("fake-metrics: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match LocalSet::new().block_on(&runtime, run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("fake-metrics: {message}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value_of<'t>(text: &'t str, prefix: &str) -> &'t str {
        let line = text
            .lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line starting with {prefix:?} in:\n{text}"));
        line.rsplit(' ').next().unwrap()
    }

    #[test]
    fn body_has_the_families_the_controller_reads() {
        let text = render(3, 0);
        let g = Gauges::for_index(3);
        assert_eq!(
            value_of(&text, "vllm:num_requests_waiting{"),
            g.waiting.to_string()
        );
        assert_eq!(
            value_of(&text, "vllm:num_requests_running{"),
            g.running.to_string()
        );
        let kv: f64 = value_of(&text, "vllm:kv_cache_usage_perc{")
            .parse()
            .unwrap();
        assert!((kv - g.kv_cache_usage).abs() < 1e-12);
        assert!(text.contains("running_lora_adapters=\"chat\""), "{text}");
        assert!(text.contains("vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"2048\""));
        assert!(!text.contains("histogram"));
    }

    #[test]
    fn values_change_between_neighbouring_bodies_and_stay_in_range() {
        let all: Vec<Gauges> = (0..BODIES).map(Gauges::for_index).collect();
        for pair in all.windows(2) {
            assert_ne!(pair[0], pair[1]);
            assert!((pair[0].kv_cache_usage - pair[1].kv_cache_usage).abs() < 0.1);
        }
        assert!(all
            .iter()
            .all(|g| (0.0..=1.0).contains(&g.kv_cache_usage) && g.waiting < 5));
        assert_eq!(Gauges::for_index(BODIES + 2), all[2]);
    }

    #[test]
    fn histograms_are_cumulative_and_end_with_inf_and_count() {
        let text = render(1, 2);
        assert_eq!(text.matches("# TYPE").count(), 7);
        let buckets: Vec<u64> = text
            .lines()
            .filter(|l| l.starts_with("vllm:time_to_first_token_seconds_bucket"))
            .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS.len() + 1);
        assert!(buckets.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(
            value_of(&text, "vllm:time_to_first_token_seconds_count{"),
            buckets[buckets.len() - 1].to_string()
        );
        assert!(render(1, 12).len() > 20 * render(1, 0).len());
    }

    #[test]
    fn endpoints_file_lists_every_port_with_a_unique_name() {
        let yaml = endpoints_yaml(IpAddr::V4(Ipv4Addr::LOCALHOST), &[8000, 8001]);
        assert_eq!(
            yaml,
            "endpoints:\n\
             - { name: fake-0, address: \"127.0.0.1\", port: 8000 }\n\
             - { name: fake-1, address: \"127.0.0.1\", port: 8001 }\n"
        );
    }

    fn cli(args: &[&str]) -> Result<(), String> {
        let mut argv = vec!["fake-metrics", "--endpoints-file", "x.yaml"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv)
            .map_err(|e| e.to_string())?
            .validate()
    }

    #[test]
    fn rejects_bad_flags_with_the_flag_named() {
        assert!(cli(&["--count", "10"]).is_ok());
        assert!(cli(&["--count", "10", "--base-port", "65526"]).is_ok());
        let err = cli(&["--count", "10", "--base-port", "65527"]).unwrap_err();
        assert!(err.contains("--base-port 65527"), "{err}");
        assert!(cli(&["--count", "0"]).unwrap_err().contains("--count"));
        assert!(cli(&["--count", "1", "--histograms", "13"])
            .unwrap_err()
            .contains("--histograms"));
        assert!(cli(&["--count", "1", "--phase-ms", "0"])
            .unwrap_err()
            .contains("--phase-ms"));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn serves_metrics_on_every_port_and_counts_requests() {
        let dir = std::env::temp_dir().join(format!("fake-metrics-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("endpoints.yaml");
        let args = Cli::try_parse_from([
            "fake-metrics",
            "--count",
            "3",
            "--endpoints-file",
            file.to_str().unwrap(),
        ])
        .unwrap();
        let local = LocalSet::new();
        local.spawn_local(run(args));
        local
            .run_until(async {
                let deadline = Instant::now() + Duration::from_secs(5);
                while !file.exists() {
                    assert!(Instant::now() < deadline, "endpoints file never appeared");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
            .await;
        let yaml = std::fs::read_to_string(&file).unwrap();
        let ports: Vec<u16> = yaml
            .lines()
            .filter_map(|l| l.split("port: ").nth(1))
            .map(|p| p.trim_end_matches(" }").parse().unwrap())
            .collect();
        assert_eq!(ports.len(), 3);
        let fetched = local
            .run_until(async {
                let mut bodies = Vec::new();
                for port in &ports {
                    bodies.push(get(*port, "/metrics").await);
                }
                bodies.push(get(ports[0], "/fake/stats").await);
                bodies.push(get(ports[0], "/nope").await);
                bodies
            })
            .await;
        for body in &fetched[..3] {
            assert!(body.starts_with("HTTP/1.1 200"), "{body}");
            assert!(body.contains("vllm:num_requests_waiting{"), "{body}");
        }
        assert_ne!(
            fetched[0], fetched[1],
            "neighbouring endpoints serve different values"
        );
        assert!(
            fetched[3].contains("\"metrics_requests\":3"),
            "{}",
            fetched[3]
        );
        assert!(fetched[4].starts_with("HTTP/1.1 404"), "{}", fetched[4]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// One HTTP/1.1 request with `connection: close`; returns the whole response.
    async fn get(port: u16, path: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut out))
            .await
            .unwrap()
            .unwrap();
        out
    }
}
