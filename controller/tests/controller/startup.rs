//! Startup errors (exit status 2, one line naming the field) and clean shutdown.

use std::process::Command;
use std::time::Duration;

use crate::common::{temp_dir, write_endpoints, Controller};

/// Runs the binary to completion; returns (status code, stderr lines).
fn run(args: &[&str]) -> (Option<i32>, Vec<String>) {
    let output = Command::new(env!("CARGO_BIN_EXE_wasm-epp-controller"))
        .args(args)
        .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    (
        output.status.code(),
        stderr.lines().map(str::to_string).collect(),
    )
}

fn config(dir: &std::path::Path, body: &str) -> String {
    let path = dir.join("config.yaml");
    std::fs::write(
        &path,
        format!("apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n{body}"),
    )
    .unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn a_bad_config_exits_2_with_one_line_naming_the_field() {
    let dir = temp_dir("bad-config");
    let endpoints = dir.join("endpoints.yaml");
    write_endpoints(&endpoints, &[]);
    let endpoints = endpoints.to_str().unwrap();
    for (body, message) in [
        (
            "plugins:\n- type: queue-scorer\nschedulingProfiles:\n- name: p\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: foo\n",
            "schedulingProfiles[0].plugins[1].pluginRef: no plugin named \"foo\"",
        ),
        (
            "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n- type: bar\n",
            "plugins[2].type: unknown plugin type \"bar\"",
        ),
        (
            "plugins:\n- name: x\n  type: queue-scorer\n- name: x\n  type: kv-cache-utilization-scorer\n",
            "plugins[1].name: duplicate plugin name \"x\"",
        ),
    ] {
        let path = config(&dir, body);
        let (code, lines) = run(&["--config-file", &path, "--endpoints-file", endpoints]);
        assert_eq!(code, Some(2), "{lines:?}");
        assert_eq!(lines, [format!("wasm-epp-controller: {path}: {message}")]);
    }
}

#[test]
fn bad_files_and_flags_exit_2_with_one_line() {
    let dir = temp_dir("bad-files");
    let endpoints = dir.join("endpoints.yaml");
    std::fs::write(
        &endpoints,
        "endpoints:\n- {name: a, address: 10.0.0.1, port: 99999}\n",
    )
    .unwrap();
    let endpoints = endpoints.to_str().unwrap();

    let (code, lines) = run(&["--endpoints-file", endpoints]);
    assert_eq!(code, Some(2));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with(&format!(
            "wasm-epp-controller: {endpoints}: endpoints[0].port:"
        )),
        "{lines:?}"
    );

    let (code, lines) = run(&[]);
    assert_eq!(code, Some(2));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("--endpoints-file"), "{lines:?}");

    let (code, lines) = run(&[
        "--endpoints-file",
        endpoints,
        "--refresh-metrics-interval",
        "5x",
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("wasm-epp-controller: ") && lines[0].contains("5x"),
        "{lines:?}"
    );

    let missing = dir.join("missing.yaml");
    let (code, lines) = run(&["--config-file", missing.to_str().unwrap()]);
    assert_eq!(code, Some(2));
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("missing.yaml: cannot read"), "{lines:?}");

    let good = dir.join("good.yaml");
    write_endpoints(&good, &[]);
    let with_discovery = config(
        &dir,
        &format!(
            "plugins:\n- type: file-discovery\n  parameters: {{path: {}}}\ndataLayer:\n  discovery: {{pluginRef: file-discovery}}\n",
            good.display()
        ),
    );
    let (code, lines) = run(&[
        "--config-file",
        &with_discovery,
        "--endpoints-file",
        good.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
    assert_eq!(
        lines,
        [format!(
            "wasm-epp-controller: {with_discovery}: dataLayer.discovery: cannot be combined with --endpoints-file; use one of them"
        )]
    );
}

#[test]
fn sigterm_shuts_down_cleanly() {
    let dir = temp_dir("sigterm");
    let endpoints = dir.join("endpoints.yaml");
    write_endpoints(&endpoints, &[]);
    let mut controller = Controller::start(&["--endpoints-file", endpoints.to_str().unwrap()]);
    assert_eq!(controller.admin_get("/healthz").status, 200);
    let status = Command::new("kill")
        .args(["-TERM", &controller.pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = controller
        .wait_exit(Duration::from_secs(10))
        .expect("still running");
    assert_eq!(exit.code(), Some(0));
    assert!(controller.log().iter().any(|line| line.contains("SIGTERM")));
}
