//! Envoy replicas that act as one: two real Envoys polling one real controller share their
//! prefix records through it, so a shared prompt first routed by one replica sticks to the
//! same endpoint when it reaches the other; the replicas keep routing while the controller is
//! away and learn from each other again when it is back; a replica that sends garbage or
//! floods is refused, logged, and harms no one; and two controller replicas peered with
//! `--peer` relay the records between Envoys that poll different controllers. Needs
//! `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// How long a worker may take to notice that sharing was turned on (its heartbeat, 1 s).
const HEARTBEAT: Duration = Duration::from_millis(1_200);
/// How long a record may take to reach the other replica (the target, 200 ms).
const PROPAGATION: Duration = Duration::from_millis(200);

/// Three idle simulators (equal metrics), one controller and two Envoy replicas.
struct Replicas {
    _sims: Vec<Sim>,
    controller: Controller,
    /// With peered controllers: the second one, which replica 1 polls.
    peer: Option<(Controller, Scratch)>,
    envoys: [Envoy; 2],
    scratch: Scratch,
    _envoy_scratch: [Scratch; 2],
}

impl Replicas {
    fn start(name: &str) -> Replicas {
        Replicas::start_with(name, false)
    }

    /// With `peered`, replica 1 polls a second controller; the two relay records to each
    /// other (`--peer`).
    fn start_with(name: &str, peered: bool) -> Replicas {
        let scratch = Scratch::new(name);
        let sims: Vec<Sim> = ["x", "y", "z"]
            .iter()
            .map(|n| Sim::start(&scratch, n, &[]))
            .collect();
        let file = endpoints_file(&scratch, &sims.iter().collect::<Vec<_>>());
        let file = file.display().to_string();
        let interval = format!("{INTERVAL_MS}ms");
        let ports = [(free_port(), free_port()), (free_port(), free_port())];
        let peer_of = |i: usize| format!("127.0.0.1:{}", ports[1 - i].0);
        let args = |i: usize| {
            let mut args = vec!["--endpoints-file".to_string(), file.clone()];
            if peered {
                args.extend(["--peer".to_string(), peer_of(i)]);
            }
            args
        };
        let start = |scratch: &Scratch, i: usize| {
            let args = args(i);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            Controller::start_at(scratch, ports[i], &interval, &args)
        };
        let controller = start(&scratch, 0);
        let peer = peered.then(|| {
            let peer_scratch = Scratch::new(&format!("{name}-controller1"));
            (start(&peer_scratch, 1), peer_scratch)
        });
        let envoy_scratch = [
            Scratch::new(&format!("{name}-envoy0")),
            Scratch::new(&format!("{name}-envoy1")),
        ];
        let polled = [
            controller.port,
            peer.as_ref().map_or(controller.port, |(c, _)| c.port),
        ];
        let envoys = [0, 1]
            .map(|i| Envoy::start(&envoy_scratch[i], EnvoyOptions::with_controller(polled[i])));
        let replicas = Replicas {
            _sims: sims,
            controller,
            peer,
            envoys,
            scratch,
            _envoy_scratch: envoy_scratch,
        };
        for envoy in &replicas.envoys {
            envoy.wait_for_snapshot();
        }
        replicas.wait_until_sharing();
        replicas
    }

    /// Waits until both replicas' pollers share records, then for their workers to notice.
    fn wait_until_sharing(&self) {
        assert!(
            wait_until(Duration::from_secs(15), || self
                .envoys
                .iter()
                .all(|e| e.stat("wasmcustom.wasm_epp_replicas_sharing") == 1)),
            "the replicas never started sharing; controller log:\n{}",
            self.controller_log()
        );
        std::thread::sleep(HEARTBEAT);
    }

    fn controller_log(&self) -> String {
        std::fs::read_to_string(self.scratch.path("controller.log")).unwrap_or_default()
    }

    fn records_url(&self, query: &str) -> String {
        format!(
            "http://127.0.0.1:{}/v1/prefix-records?{query}",
            self.controller.port
        )
    }

    /// A prompt of `tag`'s own long system prompt (~8.7 KB) sent through replica `from`, then
    /// another question on it through the other replica after [`PROPAGATION`]: both
    /// instances that served them.
    fn across(&self, tag: &str, from: usize) -> (String, String) {
        let system = format!("{tag}: you are a careful assistant. ").repeat(250);
        let first = self.envoys[from].complete(&format!("{system}first question"), &[]);
        assert_eq!(first.status, 200, "{first:?}");
        std::thread::sleep(PROPAGATION);
        let second = self.envoys[1 - from].complete(&format!("{system}second question"), &[]);
        assert_eq!(second.status, 200, "{second:?}");
        (first.instance().to_string(), second.instance().to_string())
    }
}

#[test]
fn a_shared_prompt_sticks_to_one_endpoint_across_replicas_both_ways() {
    let r = Replicas::start("replicas-share");
    // Six independent prompts: with three equal endpoints, a replica that had not learnt the
    // other's pick would match it only by chance (1 in 3 each).
    for (i, from) in [0, 1, 0, 1, 0, 1].into_iter().enumerate() {
        let (first, second) = r.across(&format!("prompt {i}"), from);
        assert_eq!(
            first,
            second,
            "prompt {i}: replica {from} sent it to {first}, replica {} to {second}",
            1 - from
        );
    }
}

#[test]
fn the_replicas_keep_routing_without_the_controller_and_learn_again_when_it_returns() {
    let mut r = Replicas::start("replicas-controller-down");
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let urls = [r.envoys[0].url(""), r.envoys[1].url("")];
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            let mut sent = 0;
            while !stop.load(Ordering::SeqCst) {
                let url = format!("{}/v1/completions", urls[sent % 2]);
                let reply = post(&url, &completion(&unique("under load")), &[]);
                if reply.status != 200 {
                    failures.push(format!("{url}: {reply:?}"));
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            (sent, failures)
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    let ports = (r.controller.port, r.controller.admin_port);
    r.controller.proc.kill();
    std::thread::sleep(Duration::from_secs(3));
    r.controller = Controller::start_at(
        &r.scratch,
        ports,
        &format!("{INTERVAL_MS}ms"),
        &[
            "--endpoints-file",
            &r.scratch.path("endpoints.yaml").display().to_string(),
        ],
    );
    r.wait_until_sharing();
    stop.store(true, Ordering::SeqCst);
    let (sent, failures) = load.join().expect("load thread");
    assert!(sent >= 50, "only {sent} requests");
    assert!(
        failures.is_empty(),
        "{} of {sent} failed: {failures:?}",
        failures.len()
    );
    for (i, from) in [0, 1, 0, 1].into_iter().enumerate() {
        let (first, second) = r.across(&format!("after the restart {i}"), from);
        assert_eq!(first, second, "prompt {i} from replica {from}");
    }
}

#[test]
fn a_replica_sending_garbage_or_flooding_is_refused_and_harms_no_one() {
    let r = Replicas::start("replicas-misbehaving");
    let garbage = post_status(&r.records_url("replica=garbage-replica"), b"not records");
    assert_eq!(garbage.0, 400, "{garbage:?}");
    assert!(garbage.1.contains("malformed records"), "{garbage:?}");
    let oversize = post_status(&r.records_url("replica=big-replica"), &vec![0u8; 300_000]);
    assert_eq!(oversize.0, 413, "{oversize:?}");
    // A flood of valid batches (200 KB each, far over the 1 MB/s allowance).
    let mut words = vec![42u64, 1, 25_000];
    words.extend(1..=25_000u64);
    let batch: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let statuses: Vec<u16> = (0..30)
        .map(|_| post_status(&r.records_url("replica=flood-replica"), &batch).0)
        .collect();
    assert!(statuses.contains(&204), "{statuses:?}");
    assert!(statuses.contains(&429), "{statuses:?}");
    let log = r.controller_log();
    for replica in ["garbage-replica", "big-replica", "flood-replica"] {
        let lines = log
            .lines()
            .filter(|l| l.contains("prefix records: refused") && l.contains(replica))
            .count();
        assert_eq!(
            lines, 1,
            "one line per replica in 10 s for {replica}:\n{log}"
        );
    }
    // The good replicas still learn from each other at once.
    for (i, from) in [0, 1].into_iter().enumerate() {
        let (first, second) = r.across(&format!("despite the flood {i}"), from);
        assert_eq!(first, second, "prompt {i} from replica {from}");
    }
}

#[test]
fn peered_controllers_relay_the_records_of_the_envoys_they_serve() {
    let r = Replicas::start_with("replicas-peered", true);
    for (i, from) in [0, 1, 0, 1].into_iter().enumerate() {
        let (first, second) = r.across(&format!("through two controllers {i}"), from);
        assert_eq!(
            first,
            second,
            "prompt {i}: replica {from} (controller {from}) sent it to {first}, replica {} to {second}",
            1 - from
        );
    }
    let (peer, peer_scratch) = r.peer.as_ref().expect("peered");
    let peer_log = std::fs::read_to_string(peer_scratch.path("controller.log")).unwrap_or_default();
    assert!(
        peer_log.contains(&format!(
            "relaying to peer controller 127.0.0.1:{}",
            r.controller.port
        )),
        "{peer_log}"
    );
    assert_ne!(peer.port, r.controller.port);
}

/// POSTs raw bytes; the status and body.
fn post_status(url: &str, body: &[u8]) -> (u16, String) {
    let reply = post_bytes(url, body);
    (reply.status, reply.body)
}
