//! Envoy Gateway mode: the real Envoy with envoy/envoy-gateway-rendered.yaml (the filter as
//! Envoy Gateway renders an EnvoyExtensionPolicy: disabled in the connection manager, enabled
//! per route, no bootstrap poller, override_host on an EDS cluster), four workers, the real
//! controller and simulators, all on 127.0.0.1. Needs `make build envoy`.

#![cfg(not(target_arch = "wasm32"))]

mod common;

use std::time::{Duration, Instant};

use common::*;

/// The stats of the controller cluster, which only the elected poller calls.
const CONTROLLER_ACTIVE: &str = "cluster.wasm_epp_controller.upstream_rq_active";
const CONTROLLER_TOTAL: &str = "cluster.wasm_epp_controller.upstream_rq_total";
/// Envoy workers.
const WORKERS: u32 = 4;

/// Three pool members and a plain server behind the rendered config.
struct Gateway {
    pool: Vec<Sim>,
    plain: Sim,
    controller: Controller,
    envoy: Envoy,
    _scratch: Scratch,
}

fn gateway(name: &str) -> Gateway {
    let scratch = Scratch::new(name);
    let pool: Vec<Sim> = ["busy", "medium", "idle"]
        .iter()
        .map(|n| Sim::start(&scratch, n, &[]))
        .collect();
    let plain = Sim::start(&scratch, "plain", &[]);
    let file = endpoints_file(&scratch, &pool.iter().collect::<Vec<_>>());
    let controller = Controller::start(
        &scratch,
        &format!("{INTERVAL_MS}ms"),
        &["--endpoints-file", &file.display().to_string()],
    );
    let envoy = Envoy::start(
        &scratch,
        EnvoyOptions {
            concurrency: WORKERS,
            // As examples/envoy-gateway configures it: unpicked requests go to LeastRequest.
            fail_open: true,
            // The plain route's backend (port 8000 in the shipped file).
            fallback_port: plain.port,
            config: "envoy-gateway-rendered.yaml",
            ..EnvoyOptions::with_controller(controller.port)
        },
    );
    Gateway {
        pool,
        plain,
        controller,
        envoy,
        _scratch: scratch,
    }
}

/// Pins the pool's load (busy, medium, idle) and waits until picks settle on idle.
fn settle_on_idle(g: &Gateway) -> &Sim {
    let [busy, medium, idle] = &g.pool[..] else {
        unreachable!()
    };
    busy.report_load(8, 0.8);
    medium.report_load(4, 0.4);
    idle.report_load(0, 0.0);
    assert!(
        wait_until(Duration::from_secs(10), || {
            let reply = g.envoy.complete(&unique("warm"), &[]);
            reply.header("x-sim-received-destination") == Some(idle.addr().as_str())
                && sticky_instance(&g.envoy, 5).as_deref() == Some("idle")
        }),
        "picks never settled on the idle server"
    );
    idle
}

#[test]
fn picks_route_only_where_enabled_and_ignore_spoofed_destinations() {
    let g = gateway("gw-routing");
    let idle = settle_on_idle(&g);

    // (a) The picker routes: every request lands on the idle member, through the header the
    // filter set (override_host honours it).
    for _ in 0..20 {
        let reply = g.envoy.complete(&unique("picked"), &[]);
        assert_eq!((reply.status, reply.instance()), (200, "idle"), "{reply:?}");
        assert_eq!(
            reply.header("x-sim-received-destination"),
            Some(idle.addr().as_str())
        );
    }

    // (d) A client's destination is never honoured, a member's or an outsider's, alone or
    // first in a list: the filter's pick wins, and requests it rejects reach nobody.
    let outsider_scratch = Scratch::new("gw-outsider");
    let outsider = Sim::start(&outsider_scratch, "outsider", &[]);
    let busy = g.pool[0].addr();
    let outside = outsider.addr();
    let lists = [
        busy.clone(),
        outside.clone(),
        format!("{busy},{}", idle.addr()),
        format!("{outside},{busy}"),
    ];
    for spoof in &lists {
        let reply = g.envoy.complete(
            &unique("spoof"),
            &[("x-gateway-destination-endpoint", spoof)],
        );
        assert_eq!((reply.status, reply.instance()), (200, "idle"), "{reply:?}");
        assert_eq!(
            reply.header("x-sim-received-destination"),
            Some(idle.addr().as_str())
        );
        // Without a body the pick is random among the members; the outsider is never one.
        let reply = get(
            &g.envoy.url("/v1/models"),
            &[("x-gateway-destination-endpoint", spoof)],
        );
        assert_eq!(reply.status, 200, "{reply:?}");
        let member = g.pool.iter().find(|m| m.name == reply.instance());
        assert!(
            member.is_some_and(
                |m| reply.header("x-sim-received-destination") == Some(m.addr().as_str())
            ),
            "{reply:?}"
        );
    }
    let reply = post(
        &g.envoy.url("/v1/completions"),
        "{",
        &[("x-gateway-destination-endpoint", &busy)],
    );
    assert_eq!(reply.status, 400, "{reply:?}");
    assert_eq!(outsider.requests_served(), 0);

    // (c) A route the policy does not target runs without the filter: no pick header reaches
    // its server, not even a client's.
    let served = g.plain.requests_served();
    for spoof in [None, Some(busy.as_str())] {
        let mut headers = vec![("x-backend", "plain")];
        headers.extend(spoof.map(|s| ("x-gateway-destination-endpoint", s)));
        let reply = g.envoy.complete(&unique("plain"), &headers);
        assert_eq!(
            (reply.status, reply.instance()),
            (200, "plain"),
            "{reply:?}"
        );
        assert_eq!(
            reply.header("x-sim-received-destination"),
            None,
            "{reply:?}"
        );
    }
    assert_eq!(g.plain.requests_served(), served + 2);
}

/// What the controller cluster's stats show over a window.
#[derive(Debug)]
struct PollLoad {
    samples: usize,
    max_active: u64,
    samples_polling: usize,
    envoy_requests: u64,
    reference_requests: u64,
}

/// Samples the controller cluster's stats for `window` while a reference poller of our own
/// long-polls the controller the way one Wasm poller does (each newer version, at once).
fn measure_poll_load(g: &Gateway, window: Duration) -> PollLoad {
    let snapshot = format!("http://127.0.0.1:{}/v1/snapshot", g.controller.port);
    let before = g.envoy.stat(CONTROLLER_TOTAL);
    let deadline = Instant::now() + window;
    let (reference_requests, (samples, max_active, samples_polling)) = std::thread::scope(|s| {
        let reference = s.spawn(|| {
            let mut since = 0u64;
            let mut requests = 0;
            while Instant::now() < deadline {
                let reply = get(&format!("{snapshot}?since={since}&wait_ms=1000"), &[]);
                assert!(matches!(reply.status, 200 | 304), "{reply:?}");
                since = reply
                    .header("x-snapshot-version")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(since);
                requests += 1;
            }
            requests
        });
        let mut samples = 0;
        let mut max_active = 0;
        let mut polling = 0;
        while Instant::now() < deadline {
            let active = g.envoy.stat(CONTROLLER_ACTIVE);
            max_active = max_active.max(active);
            polling += usize::from(active > 0);
            samples += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        let reference = reference.join().expect("reference poller");
        (reference, (samples, max_active, polling))
    });
    PollLoad {
        samples,
        max_active,
        samples_polling,
        envoy_requests: g.envoy.stat(CONTROLLER_TOTAL) - before,
        reference_requests,
    }
}

#[test]
fn the_controller_sees_one_poller_per_envoy_process() {
    let g = gateway("gw-poller");
    // Snapshots flow: the elected poller has been polling for a while.
    settle_on_idle(&g);
    let load = measure_poll_load(&g, Duration::from_secs(3));
    eprintln!("{WORKERS} workers, one poller expected: {load:?}");
    assert!(load.samples >= 100, "{load:?}");
    // Never more than the one poller's two long-polls at once (the snapshot, and the other
    // replicas' prefix records, held while there are none: 25 s for a lone replica), and a
    // poll outstanding most of the time. Two pollers would hold up to four.
    assert!(load.max_active <= 2, "{load:?}");
    assert!(load.samples_polling * 2 >= load.samples, "{load:?}");
    // About as many polls as one poller makes: one per published version (an idle pool
    // publishes about one a second: unchanged metrics are vouched for 2 s) or per 1 s wait.
    // Four pollers would make four times the reference's.
    assert!(load.reference_requests >= 3, "{load:?}");
    assert!(
        load.envoy_requests * 2 <= load.reference_requests * 3 + 4
            && load.envoy_requests * 2 + 4 >= load.reference_requests,
        "{load:?}"
    );
}
