//! The shipped Kubernetes examples, fed to the controller's real parsers: every container that
//! runs the controller has arguments its command line accepts, and every EndpointPickerConfig
//! in a ConfigMap loads. (`scripts/check_k8s.py` checks how the objects fit together; what the
//! controller accepts is checked here, by the controller itself.)

use std::path::{Path, PathBuf};

use clap::Parser;
use serde::Deserialize;
use serde_yaml::Value;
use wasm_epp_controller::cli::Cli;
use wasm_epp_controller::config;

/// Directories whose YAML files are Kubernetes manifests.
const MANIFEST_DIRS: [&str; 4] = [
    "examples/envoy-gateway",
    "examples/sidecar",
    "examples/plain-envoy",
    "examples/kind",
];

/// The controller image the examples run (a container with this image and no `command` runs
/// the controller with its `args`).
const CONTROLLER_IMAGE: &str = "wasm-epp-controller";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every document of every manifest file, with the file it came from.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for dir in MANIFEST_DIRS {
        let mut files: Vec<PathBuf> = std::fs::read_dir(repo_root().join(dir))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let name = format!("{dir}/{}", file.file_name().unwrap().to_string_lossy());
            for document in serde_yaml::Deserializer::from_str(&text) {
                let value = Value::deserialize(document)
                    .unwrap_or_else(|e| panic!("{name}: does not parse: {e}"));
                if !value.is_null() {
                    out.push((name.clone(), value));
                }
            }
        }
    }
    out
}

/// `(where, args)` of every container that runs the controller.
fn controller_args(documents: &[(String, Value)]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (file, doc) in documents {
        let containers = doc["spec"]["template"]["spec"]["containers"].as_sequence();
        for container in containers.into_iter().flatten() {
            let image = container["image"].as_str().unwrap_or_default();
            if !image.starts_with(CONTROLLER_IMAGE) || !container["command"].is_null() {
                continue;
            }
            let args = container["args"]
                .as_sequence()
                .into_iter()
                .flatten()
                .map(|a| match a {
                    Value::String(s) => s.clone(),
                    other => serde_yaml::to_string(other).unwrap().trim().to_string(),
                })
                .collect();
            let name = container["name"].as_str().unwrap_or_default();
            out.push((format!("{file}: container {name}"), args));
        }
    }
    out
}

/// `(where, text)` of every EndpointPickerConfig embedded in a ConfigMap.
fn picker_configs(documents: &[(String, Value)]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (file, doc) in documents {
        if doc["kind"] != "ConfigMap" {
            continue;
        }
        for (key, text) in doc["data"].as_mapping().into_iter().flatten() {
            let (Some(key), Some(text)) = (key.as_str(), text.as_str()) else {
                continue;
            };
            let parsed: Value = serde_yaml::from_str(text).unwrap_or(Value::Null);
            if parsed["kind"] == "EndpointPickerConfig" {
                out.push((format!("{file}: data.{key}"), text.to_string()));
            }
        }
    }
    out
}

fn parse_cli(args: &[String]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(std::iter::once("wasm-epp-controller".to_string()).chain(args.to_vec()))
}

#[test]
fn every_example_controller_command_line_is_accepted() {
    let all = controller_args(&documents());
    assert!(
        all.len() >= 2,
        "expected the Envoy Gateway and sidecar controllers, found {all:?}"
    );
    for (place, args) in &all {
        if let Err(e) = parse_cli(args) {
            panic!("{place}: the controller rejects its args {args:?}: {e}");
        }
        // The same line with a flag the controller does not have is refused: the check can fail.
        let mut wrong = args.clone();
        wrong.extend(["--no-such-flag".to_string(), "x".to_string()]);
        assert!(
            parse_cli(&wrong).is_err(),
            "{place}: --no-such-flag accepted"
        );
    }
}

/// `(where, text)` of every profile file in `examples/profiles` (bare EndpointPickerConfigs).
fn profile_files() -> Vec<(String, String)> {
    let dir = repo_root().join("examples/profiles");
    let mut out: Vec<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .map(|p| {
            let name = format!(
                "examples/profiles/{}",
                p.file_name().unwrap().to_string_lossy()
            );
            (name, std::fs::read_to_string(&p).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_example_picker_config_loads() {
    let profiles = profile_files();
    assert!(!profiles.is_empty(), "no profile in examples/profiles");
    let mut all = picker_configs(&documents());
    all.extend(profiles);
    assert!(
        !all.is_empty(),
        "no EndpointPickerConfig found in the examples"
    );
    for (place, text) in &all {
        if let Err(e) = config::parse(text) {
            panic!("{place}: the controller rejects it: {e}");
        }
        if text.contains("- type: queue-scorer") {
            let typo = text.replace("- type: queue-scorer", "- type: queue-scorr");
            let err = config::parse(&typo)
                .expect_err("a misspelt plugin type loads")
                .to_string();
            assert!(err.contains("queue-scorr"), "{place}: {err}");
        }
    }
}
