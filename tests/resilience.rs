//! The data plane keeps routing correctly when the control plane misbehaves or model servers
//! die: snapshot identities that survive controller restarts and hostile versions. Real
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
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl HostileController {
    fn serve(port: u16, snapshot: &Snapshot) -> HostileController {
        let listener = TcpListener::bind(("127.0.0.1", port)).expect("bind the fake controller");
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
            labels: Default::default(),
            metrics: Default::default(),
        }],
        objectives: Default::default(),
        rewrites: Vec::new(),
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
    let (port, admin_port) = (free_port(), free_port());
    let fake = HostileController::serve(port, &snapshot_of(&old, "fake", version));
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
