//! File discovery while running: changes are applied, bad files are ignored.

use std::time::Duration;

use crate::common::{endpoint, temp_dir, vllm_metrics, write_endpoints, Controller, FakeServer};

#[test]
fn endpoints_file_changes_add_and_remove_endpoints() {
    let a = FakeServer::start(&vllm_metrics(4, 0, 0.0));
    let b = FakeServer::start(&vllm_metrics(6, 0, 0.0));
    let dir = temp_dir("file-change");
    let file = dir.join("endpoints.yaml");
    write_endpoints(&file, &[("a", a.port)]);
    let controller = Controller::start(&["--endpoints-file", file.to_str().unwrap()]);
    controller.wait_for_snapshot("a scraped", |s| {
        endpoint(s, "test/a").is_some_and(|e| e["metrics"]["waiting_queue_size"] == 4)
    });

    write_endpoints(&file, &[("a", a.port), ("b", b.port)]);
    let added = controller.wait_for_snapshot("b added", |s| endpoint(s, "test/b").is_some());
    assert_eq!(
        endpoint(&added, "test/a").unwrap()["metrics"]["waiting_queue_size"],
        4,
        "an endpoint that stays keeps its metrics"
    );
    controller.wait_for_snapshot("b scraped", |s| {
        endpoint(s, "test/b").is_some_and(|e| e["metrics"]["waiting_queue_size"] == 6)
    });

    // A broken file is logged and the last good list kept.
    std::fs::write(
        &file,
        "endpoints:\n- {name: c, address: not-an-ip, port: 1}\n",
    )
    .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !controller
        .log()
        .iter()
        .any(|line| line.contains("endpoints[0].address") && line.contains("keeping the previous"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no log: {:?}",
            controller.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let snapshot = controller.snapshot();
    assert!(endpoint(&snapshot, "test/a").is_some() && endpoint(&snapshot, "test/b").is_some());

    write_endpoints(&file, &[("b", b.port)]);
    let removed = controller.wait_for_snapshot("a removed", |s| endpoint(s, "test/a").is_none());
    assert_eq!(removed["endpoints"].as_array().unwrap().len(), 1);
}
