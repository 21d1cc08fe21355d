//! The data plane keeps routing correctly when the control plane misbehaves or model servers
//! die: snapshot identities that survive controller restarts and hostile versions, and a
//! killed model server taken out of the candidates within about two scrape intervals. Real
//! Envoy, real controller and simulators on 127.0.0.1; the one fake here is a controller that
//! serves a hostile snapshot on purpose, which the real one never would. Needs
//! `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use wasm_epp::scheduler::profile::Profile;
use wasm_epp::snapshot::{Endpoint, Snapshot};

/// A controller impostor answering every snapshot poll with one fixed snapshot (the first at
/// once, later ones after a pause, like a long-poll that found something new). Stops when
/// dropped, or after a minute.
struct HostileController {
    /// The port it listens on (chosen by the OS at bind, so no other test can take it first).
    port: u16,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HostileController {
    fn serve(snapshot: &Snapshot) -> HostileController {
        let listener = TcpListener::bind(("127.0.0.1", 0)).expect("bind the fake controller");
        let port = listener.local_addr().expect("its address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let body = snapshot.to_json();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut answered = 0;
            while !stopping.load(Ordering::SeqCst) && Instant::now() < deadline {
                let Ok((mut stream, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match stream.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                if answered > 0 {
                    std::thread::sleep(Duration::from_millis(200));
                }
                answered += 1;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes());
                let _ = stream.write_all(&body);
            }
        });
        HostileController {
            port,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HostileController {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A snapshot naming `sim` only, with the given identity.
fn snapshot_of(sim: &Sim, instance: &str, version: u64) -> Snapshot {
    Snapshot {
        instance: instance.to_string(),
        version,
        generated_unix_ms: 0,
        profile: Profile::default(),
        endpoints: vec![Endpoint {
            name: sim.name.clone(),
            address: "127.0.0.1".into(),
            port: sim.port,
            ready: true,
            key_cache: Default::default(),
            labels: Default::default(),
            metrics: Default::default(),
        }],
        objectives: Default::default(),
        rewrites: Vec::new(),
        vouched_ms: 0,
        scoring_cache: Default::default(),
    }
}

/// Envoy follows a fake controller's snapshot (`version`), then the real controller on the
/// same port, whose versions are all smaller.
fn the_real_controller_takes_over_from(version: u64) {
    let scratch = Scratch::new("takeover");
    let (old, new) = (
        Sim::start(&scratch, "old", &[]),
        Sim::start(&scratch, "new", &[]),
    );
    let fake = HostileController::serve(&snapshot_of(&old, "fake", version));
    let (port, admin_port) = (fake.port, free_port());
    let envoy = Envoy::start(
        &scratch,
        EnvoyOptions {
            concurrency: 2,
            ..EnvoyOptions::with_controller(port)
        },
    );
    assert!(
        wait_until(Duration::from_secs(10), || envoy
            .complete(&unique("fake"), &[])
            .instance()
            == "old"),
        "Envoy never used the fake controller's snapshot"
    );
    drop(fake);
    let file = endpoints_file(&scratch, &[&new]);
    let _controller = Controller::start_at(
        &scratch,
        (port, admin_port),
        &format!("{INTERVAL_MS}ms"),
        &["--endpoints-file", &file.display().to_string()],
    );
    let started = Instant::now();
    let mut last = None;
    let moved = wait_until(Duration::from_secs(10), || {
        let reply = envoy.complete(&unique("real"), &[]);
        let done = reply.instance() == "new";
        last = Some(reply);
        done
    });
    assert!(
        moved,
        "routing froze on the snapshot of version {version}: {last:?}"
    );
    eprintln!(
        "version {version}: the real controller took over after {:?}",
        started.elapsed()
    );
    for _ in 0..10 {
        assert_eq!(envoy.complete(&unique("after"), &[]).instance(), "new");
    }
}

#[test]
fn a_restarted_controller_with_an_older_clock_is_followed() {
    // The previous controller's clock was ten days ahead of the new one's.
    let ahead = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 10 * 24 * 3_600_000;
    the_real_controller_takes_over_from(ahead);
}

#[test]
fn a_hostile_snapshot_version_never_freezes_routing() {
    the_real_controller_takes_over_from(u64::MAX);
}

/// One request of the load: when it started and how it ended.
struct Outcome {
    started: Instant,
    status: u16,
}

/// Kills the server a shared prompt sticks to while four clients keep sending (half that
/// shared prompt, half unique ones) through `envoy_config`; returns the failures among the
/// requests started more than a second after the kill, and Envoy's connect failures and
/// retries in that time.
fn kill_under_load(envoy_config: &'static str) -> (usize, usize, u64, u64) {
    let mut f = fleet_from(
        "kill",
        FleetSpec {
            sims: &[("s0", &[]), ("s1", &[]), ("s2", &[])],
            concurrency: 2,
            envoy_config: Some(envoy_config),
            ..FleetSpec::default()
        },
    );
    f.envoy.wait_for_snapshot();
    let shared = format!(
        "{} and now the question",
        "a long shared system prompt ".repeat(40)
    );
    let mut victim = String::new();
    for _ in 0..5 {
        victim = f.envoy.complete(&shared, &[]).instance().to_string();
    }
    let index = f
        .sims
        .iter()
        .position(|s| s.name == victim)
        .expect("a victim");
    let url = f.envoy.url("/v1/completions");
    let killed_at = Instant::now() + Duration::from_millis(500);
    let until = killed_at + Duration::from_secs(4);
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let (url, shared) = (url.clone(), shared.clone());
            std::thread::spawn(move || {
                let mut outcomes = Vec::new();
                let mut n = 0;
                while Instant::now() < until {
                    let prompt = if (client + n) % 2 == 0 {
                        shared.clone()
                    } else {
                        unique("load")
                    };
                    n += 1;
                    let started = Instant::now();
                    let status = post(&url, &completion(&prompt), &[]).status;
                    outcomes.push(Outcome { started, status });
                }
                outcomes
            })
        })
        .collect();
    std::thread::sleep(killed_at.saturating_duration_since(Instant::now()));
    f.sims[index].kill();
    let settled = killed_at + Duration::from_secs(1);
    std::thread::sleep(settled.saturating_duration_since(Instant::now()));
    let connect_fail = "cluster.inference_pool.upstream_cx_connect_fail";
    let retries = "cluster.inference_pool.upstream_rq_retry";
    let (fails_before, retries_before) = (f.envoy.stat(connect_fail), f.envoy.stat(retries));
    let outcomes: Vec<Outcome> = clients
        .into_iter()
        .flat_map(|c| c.join().expect("client thread"))
        .collect();
    let late: Vec<&Outcome> = outcomes.iter().filter(|o| o.started >= settled).collect();
    let failed_late = late.iter().filter(|o| o.status != 200).count();
    let failed_early = outcomes
        .iter()
        .filter(|o| o.started >= killed_at && o.started < settled && o.status != 200)
        .count();
    eprintln!(
        "{envoy_config}: killed {victim}; {} requests after the first second, {failed_late} failed; \
         {failed_early} failed within it",
        late.len()
    );
    assert!(
        late.len() > 20,
        "the load kept going: {} requests",
        late.len()
    );
    (
        failed_late,
        failed_early,
        f.envoy.stat(connect_fail) - fails_before,
        f.envoy.stat(retries) - retries_before,
    )
}

#[test]
fn a_killed_server_gets_no_new_requests_after_a_second() {
    let (failed, _, connect_failures, _) = kill_under_load("envoy.yaml");
    assert_eq!(failed, 0, "new requests failed after the first second");
    assert_eq!(
        connect_failures, 0,
        "Envoy still connected to the dead server"
    );
}

#[test]
fn a_killed_server_is_not_tried_first_after_a_second_with_fallbacks() {
    let (failed, _, connect_failures, retries) = kill_under_load("envoy-fallbacks.yaml");
    assert_eq!(failed, 0, "new requests failed after the first second");
    assert_eq!(
        (connect_failures, retries),
        (0, 0),
        "Envoy still tried the dead server first"
    );
}

/// Sends `n` slow completions at once over `n` connections; returns each one's status and
/// latency.
fn concurrent_slow_requests(port: u16, n: usize, body: &str) -> Vec<(u16, Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let request = request.clone();
                tokio::spawn(async move {
                    let started = Instant::now();
                    let exchange = async {
                        let mut stream =
                            tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
                        stream.write_all(request.as_bytes()).await?;
                        let mut response = Vec::new();
                        stream.read_to_end(&mut response).await?;
                        Ok::<_, std::io::Error>(response)
                    };
                    let response = tokio::time::timeout(Duration::from_secs(60), exchange)
                        .await
                        .ok()
                        .and_then(Result::ok)
                        .unwrap_or_default();
                    let status = std::str::from_utf8(&response)
                        .ok()
                        .and_then(|text| text.split(' ').nth(1)?.parse().ok())
                        .unwrap_or(0);
                    (status, started.elapsed())
                })
            })
            .collect();
        let mut results = Vec::with_capacity(n);
        for task in tasks {
            results.push(task.await.unwrap_or((0, Duration::ZERO)));
        }
        results
    })
}

#[test]
fn more_than_1024_concurrent_slow_requests_never_wait_in_envoy() {
    // 40 output tokens at 100 ms each, no slowdown from batching: every request takes about
    // 4 s in its server, however many run at once.
    let sim_flags: &[&str] = &[
        "--max-num-seqs",
        "2048",
        "--num-gpu-blocks",
        "100000",
        "--itl-ms",
        "100",
        "--batch-slowdown",
        "0",
    ];
    let f = fleet_from(
        "concurrency",
        FleetSpec {
            sims: &[("c0", sim_flags), ("c1", sim_flags)],
            concurrency: 2,
            ..FleetSpec::default()
        },
    );
    f.envoy.wait_for_snapshot();
    let body = serde_json::json!({
        "model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "slow", "max_tokens": 40,
    })
    .to_string();
    let n = 1_100;
    let results = concurrent_slow_requests(f.envoy.port, n, &body);
    let ok = results.iter().filter(|(status, _)| *status == 200).count();
    let slowest = results.iter().map(|(_, d)| *d).max().unwrap_or_default();
    let overflow = f.envoy.stat("cluster.inference_pool.upstream_cx_overflow");
    let pending_overflow = f
        .envoy
        .stat("cluster.inference_pool.upstream_rq_pending_overflow");
    eprintln!(
        "{n} concurrent 4 s requests: {ok} ok, slowest {slowest:?}, connection overflows \
         {overflow}, pending overflows {pending_overflow}"
    );
    assert_eq!(ok, n, "every request succeeded");
    assert_eq!(
        (overflow, pending_overflow),
        (0, 0),
        "requests waited for Envoy's circuit breakers"
    );
    // One server-side duration plus start-up and decision time; a request that waited for a
    // connection slot would take a second duration.
    assert!(slowest < Duration::from_secs(7), "slowest {slowest:?}");
}
