//! `--manifests`: InferenceObjective and InferenceModelRewrite objects in the snapshot, picked
//! up when the file changes; bad files at startup exit 2, bad files while running are ignored.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::common::{temp_dir, write_endpoints, Controller};

fn objective(name: &str, namespace: &str, priority: i32, pool: &str) -> String {
    format!(
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata:\n  name: {name}\n  namespace: {namespace}\nspec:\n  priority: {priority}\n  poolRef:\n    name: {pool}\n"
    )
}

fn rewrite(name: &str, created: &str, from: &str, to: &[(&str, u32)]) -> String {
    let mut text = format!(
        "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceModelRewrite\nmetadata:\n  name: {name}\n  namespace: llm\n  creationTimestamp: \"{created}\"\nspec:\n  poolRef: {{name: pool}}\n  rules:\n  - matches:\n    - model: {{type: Exact, value: {from}}}\n    targets:\n"
    );
    for (model, weight) in to {
        text.push_str(&format!(
            "    - modelRewrite: {model}\n      weight: {weight}\n"
        ));
    }
    text
}

/// Write-then-rename so the watcher never sees a half-written file.
fn write(path: &Path, documents: &[String]) {
    let staging = path.with_extension("tmp");
    std::fs::write(&staging, documents.join("---\n")).unwrap();
    std::fs::rename(&staging, path).unwrap();
}

fn wait_for_log(controller: &Controller, what: impl Fn(&str) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !controller.log().iter().any(|line| what(line)) {
        assert!(Instant::now() < deadline, "no log: {:?}", controller.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn manifests_reach_the_snapshot_and_changes_are_picked_up() {
    let dir = temp_dir("manifests");
    let endpoints = dir.join("endpoints.yaml");
    write_endpoints(&endpoints, &[]);
    let manifests = dir.join("manifests.yaml");
    write(
        &manifests,
        &[
            objective("batch", "llm", -1, "pool"),
            // Newer object first in the file: the snapshot lists the older one first.
            rewrite("newer", "2026-02-01T00:00:00Z", "llama", &[("llama-v3", 1)]),
            rewrite(
                "older",
                "2025-01-01T00:00:00Z",
                "llama",
                &[("llama-v2", 90), ("llama-v3", 10)],
            ),
        ],
    );
    let controller = Controller::start(&[
        "--endpoints-file",
        endpoints.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
    ]);
    assert!(
        controller
            .log()
            .iter()
            .any(|line| line.contains("manifests: ") && line.contains("1 objective, 2 rewrites")),
        "{:?}",
        controller.log()
    );
    let first = controller.snapshot();
    assert_eq!(first["objectives"], json!({"batch": -1}));
    assert_eq!(
        first["rewrites"],
        json!([
            {"name": "llm/older", "rules": [{"matches": ["llama"], "targets": [
                {"model": "llama-v2", "weight": 90}, {"model": "llama-v3", "weight": 10}]}]},
            {"name": "llm/newer", "rules": [{"matches": ["llama"], "targets": [
                {"model": "llama-v3", "weight": 1}]}]},
        ])
    );
    let first_version = first["version"].as_u64().unwrap();

    // A change publishes a new version.
    write(
        &manifests,
        &[
            objective("batch", "llm", 5, "pool"),
            objective("critical", "llm", 100, "pool"),
        ],
    );
    let changed = controller.wait_for_snapshot("the new objectives", |s| {
        s["objectives"] == json!({"batch": 5, "critical": 100})
    });
    assert!(changed["version"].as_u64().unwrap() > first_version);
    assert_eq!(changed["rewrites"], json!([]));
    wait_for_log(&controller, |line| {
        line.contains("manifests.yaml: applied 2 objectives, 0 rewrites")
    });

    // A bad file is logged and the last good manifests kept.
    write(
        &manifests,
        &["apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: high, poolRef: {name: pool}}\n".to_string()],
    );
    wait_for_log(&controller, |line| {
        line.contains("document 1 (InferenceObjective \"x\"): spec.priority: invalid type")
            && line.contains("keeping the previous manifests")
    });
    assert_eq!(
        controller.snapshot()["objectives"],
        json!({"batch": 5, "critical": 100})
    );

    // And a fixed file applies again.
    write(&manifests, &[objective("x", "llm", -3, "pool")]);
    controller.wait_for_snapshot("the fixed file", |s| s["objectives"] == json!({"x": -3}));
}

#[test]
fn a_directory_with_a_pool_filter() {
    let dir = temp_dir("manifests-dir");
    let endpoints = dir.join("endpoints.yaml");
    write_endpoints(&endpoints, &[]);
    let manifests = dir.join("manifests.d");
    std::fs::create_dir_all(&manifests).unwrap();
    write(
        &manifests.join("10-objectives.yaml"),
        &[
            objective("mine", "llm", -1, "pool"),
            objective("theirs", "llm", 7, "other-pool"),
        ],
    );
    let controller = Controller::start(&[
        "--endpoints-file",
        endpoints.to_str().unwrap(),
        "--manifests",
        manifests.to_str().unwrap(),
        "--pool-name",
        "pool",
        "--pool-namespace",
        "llm",
    ]);
    assert_eq!(controller.snapshot()["objectives"], json!({"mine": -1}));

    // A new file in the directory is picked up.
    write(
        &manifests.join("20-rewrites.yml"),
        &[rewrite("r", "2026-01-01T00:00:00Z", "a", &[("b", 1)])],
    );
    let snapshot = controller.wait_for_snapshot("the new file", |s| {
        s["rewrites"].as_array().is_some_and(|r| r.len() == 1)
    });
    assert_eq!(snapshot["rewrites"][0]["name"], "llm/r");
    assert_eq!(snapshot["objectives"], json!({"mine": -1}));
}

#[test]
fn bad_manifests_at_startup_exit_2_with_one_line() {
    let dir = temp_dir("manifests-bad");
    let endpoints = dir.join("endpoints.yaml");
    write_endpoints(&endpoints, &[]);
    let manifests = dir.join("manifests.yaml");
    write(
        &manifests,
        &[
            objective("ok", "llm", 1, "pool"),
            "apiVersion: llm-d.ai/v1alpha2\nkind: InferenceObjective\nmetadata: {name: x}\nspec: {priority: high, poolRef: {name: pool}}\n".to_string(),
        ],
    );
    let missing = dir.join("missing.yaml");
    for (path, expected) in [
        (
            &manifests,
            format!(
                "wasm-epp-controller: {}: document 2 (InferenceObjective \"x\"): spec.priority: invalid type: string \"high\", expected i32",
                manifests.display()
            ),
        ),
        (
            &missing,
            format!("wasm-epp-controller: {}: cannot open", missing.display()),
        ),
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_wasm-epp-controller"))
            .args(["--endpoints-file", endpoints.to_str().unwrap()])
            .args(["--manifests", path.to_str().unwrap()])
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(output.status.code(), Some(2), "{lines:?}");
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with(&expected), "{lines:?}");
    }
}

#[test]
fn without_manifests_the_snapshot_has_empty_objectives_and_rewrites() {
    let dir = temp_dir("manifests-none");
    let endpoints = dir.join("endpoints.yaml");
    write_endpoints(&endpoints, &[]);
    let controller = Controller::start(&["--endpoints-file", endpoints.to_str().unwrap()]);
    let snapshot: Value = controller.snapshot();
    assert_eq!(snapshot["objectives"], json!({}));
    assert_eq!(snapshot["rewrites"], json!([]));
}
