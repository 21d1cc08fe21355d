//! `make run` (scripts/run.sh) keeps the data plane up when the control plane dies: Envoy goes
//! on routing on its last snapshot while the controller is restarted with a backoff, and only
//! SIGTERM (or Ctrl-C) stops everything; a controller that cannot start at all (a bad
//! configuration) stops everything with its status. The real script, Envoy, controller and a
//! simulator on 127.0.0.1. `EPP_REPLICAS=N` starts N Envoy replicas on 10000+i (admin
//! 9901+i) that learn each other's prefix records. The script listens on the shipped fixed
//! ports (10000, 9901, 9002, 9090 and up), so these tests take turns. Needs `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::fs;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

/// The script's fixed ports are taken by one test at a time.
static PORTS: Mutex<()> = Mutex::new(());
/// Envoy's listener in the shipped `envoy/envoy.yaml`.
const ENVOY_URL: &str = "http://127.0.0.1:10000";
/// The controller's metrics listener as `make run` starts it (its default).
const CONTROLLER_READY: &str = "http://127.0.0.1:9090/readyz";

/// `scripts/run.sh` in its own process group: on drop it gets SIGTERM, then anything left in
/// the group SIGKILL.
struct RunScript {
    child: Child,
    log: PathBuf,
}

impl RunScript {
    fn start(scratch: &Scratch, endpoints: &Path) -> RunScript {
        RunScript::start_with(scratch, endpoints, &[])
    }

    /// Like [`start`](Self::start) with extra environment variables.
    fn start_with(scratch: &Scratch, endpoints: &Path, env: &[(&str, &str)]) -> RunScript {
        let log = scratch.path("run.log");
        let file = fs::File::create(&log).expect("create run.log");
        let child = Command::new("bash")
            .arg(repo().join("scripts/run.sh"))
            .env("EPP_ENDPOINTS", endpoints)
            .envs(env.iter().copied())
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("clone log"))
            .stderr(file)
            .spawn()
            .expect("spawn scripts/run.sh");
        RunScript { child, log }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The pids the script logged for the controllers it started, in order.
    fn controller_pids(&self) -> Vec<u32> {
        self.log()
            .lines()
            .filter_map(|l| l.strip_prefix("wasm-epp: controller started (pid "))
            .filter_map(|rest| rest.trim_end_matches(')').parse().ok())
            .collect()
    }

    fn signal(target: &str, signal: &str) {
        let _ = Command::new("kill")
            .args([signal, "--", target])
            .stderr(Stdio::null())
            .status();
    }

    /// Waits up to `limit` for the script to exit.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for RunScript {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        if self.child.try_wait().ok().flatten().is_none() {
            RunScript::signal(&pid, "-TERM");
            let _ = self.wait(Duration::from_secs(10));
        }
        RunScript::signal(&format!("-{pid}"), "-KILL");
        let _ = self.child.wait();
    }
}

/// One completion through the script's Envoy.
fn complete() -> Reply {
    post(
        &format!("{ENVOY_URL}/v1/completions"),
        &completion(&unique("make-run")),
        &[],
    )
}

#[test]
fn envoy_keeps_routing_while_the_controller_is_restarted_and_sigterm_stops_both() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("make-run-restart");
    let sim = Sim::start(&scratch, "run-sim", &[]);
    let endpoints = endpoints_file(&scratch, &[&sim]);
    let mut run = RunScript::start(&scratch, &endpoints);
    assert!(
        wait_until(Duration::from_secs(30), || complete().status == 200),
        "make run never routed a request:\n{}",
        run.log()
    );
    let first = run.controller_pids();
    assert_eq!(first.len(), 1, "one controller at start:\n{}", run.log());

    // The controller dies; Envoy routes every request meanwhile on its last snapshot.
    RunScript::signal(&first[0].to_string(), "-KILL");
    let until = Instant::now() + Duration::from_secs(3);
    let mut sent = 0;
    while Instant::now() < until {
        let reply = complete();
        assert_eq!(
            reply.status, 200,
            "request {sent} while the controller was away: {reply:?}"
        );
        assert_eq!(reply.instance(), "run-sim");
        sent += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(sent >= 10, "only {sent} requests in 3 s");

    // It is started again after the first backoff step, and serves.
    assert!(
        wait_until(Duration::from_secs(15), || run.controller_pids().len() == 2
            && get(CONTROLLER_READY, &[]).status == 200),
        "the controller was not restarted:\n{}",
        run.log()
    );
    let log = run.log();
    assert!(
        log.contains("Envoy keeps routing on its last snapshot; restarting the controller in 1 s"),
        "{log}"
    );
    assert_ne!(run.controller_pids()[1], first[0]);
    assert_eq!(complete().status, 200);

    // SIGTERM stops both, with the conventional status.
    RunScript::signal(&run.child.id().to_string(), "-TERM");
    let status = run
        .wait(Duration::from_secs(15))
        .expect("make run did not stop on SIGTERM");
    assert_eq!(status.code(), Some(143), "{status:?}:\n{}", run.log());
    assert_eq!(complete().status, 0, "Envoy still answers after SIGTERM");
    assert_ne!(
        get(CONTROLLER_READY, &[]).status,
        200,
        "the controller still runs"
    );
}

#[test]
fn a_controller_that_cannot_start_stops_make_run_with_its_status() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("make-run-bad-config");
    let mut run = RunScript::start(&scratch, &scratch.path("missing-endpoints.yaml"));
    let status = run
        .wait(Duration::from_secs(20))
        .expect("make run kept running with a controller that cannot start");
    let log = run.log();
    assert_eq!(
        status.code(),
        Some(2),
        "{status:?} (signal {:?}):\n{log}",
        status.signal()
    );
    assert!(log.contains("missing-endpoints.yaml: cannot open"), "{log}");
    assert!(
        log.contains("the controller exited at start (status 2)"),
        "{log}"
    );
    assert_eq!(complete().status, 0, "Envoy still answers");
}

#[test]
fn epp_replicas_starts_that_many_envoys_on_consecutive_ports_sharing_what_they_learn() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("make-run-replicas");
    let sims: Vec<Sim> = ["r-x", "r-y", "r-z"]
        .iter()
        .map(|n| Sim::start(&scratch, n, &[]))
        .collect();
    let endpoints = endpoints_file(&scratch, &sims.iter().collect::<Vec<_>>());
    let run = RunScript::start_with(&scratch, &endpoints, &[("EPP_REPLICAS", "2")]);
    let url = |i: u16| format!("http://127.0.0.1:{}/v1/completions", 10_000 + i);
    let stat = |i: u16| {
        get(
            &format!(
                "http://127.0.0.1:{}/stats?filter=wasm_epp_replicas_sharing",
                9_901 + i
            ),
            &[],
        )
        .body
    };
    assert!(
        wait_until(Duration::from_secs(30), || (0..2).all(|i| post(
            &url(i),
            &completion(&unique("replica")),
            &[]
        )
        .status
            == 200
            && stat(i).contains("wasm_epp_replicas_sharing: 1"))),
        "the two replicas never both routed and shared:\n{}",
        run.log()
    );
    let log = run.log();
    assert!(
        log.contains("Envoy replica 1 on http://127.0.0.1:10001 (admin 127.0.0.1:9902"),
        "{log}"
    );
    // Their workers notice the sharing at their next heartbeat (1 s).
    std::thread::sleep(Duration::from_millis(1_200));
    for (i, from) in [0u16, 1, 0, 1].into_iter().enumerate() {
        let system = format!("make run replicas {i}: be precise. ").repeat(250);
        let first = post(&url(from), &completion(&format!("{system}one")), &[]);
        std::thread::sleep(Duration::from_millis(200));
        let second = post(&url(1 - from), &completion(&format!("{system}two")), &[]);
        assert_eq!((first.status, second.status), (200, 200));
        assert_eq!(
            first.instance(),
            second.instance(),
            "prompt {i} from replica {from}"
        );
    }
}

#[test]
fn a_bad_replica_count_is_refused_before_anything_starts() {
    let _ports = PORTS.lock().unwrap_or_else(|e| e.into_inner());
    let scratch = Scratch::new("make-run-bad-replicas");
    let endpoints = endpoints_file(&scratch, &[]);
    for bad in ["0", "two", "33"] {
        let mut run = RunScript::start_with(&scratch, &endpoints, &[("EPP_REPLICAS", bad)]);
        let status = run.wait(Duration::from_secs(10)).expect("exits at once");
        assert_eq!(status.code(), Some(2), "EPP_REPLICAS={bad}");
        assert!(
            run.log()
                .contains("EPP_REPLICAS must be a whole number from 1 to 32"),
            "{}",
            run.log()
        );
    }
}
