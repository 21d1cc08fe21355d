use std::path::PathBuf;

use wasm_epp::snapshot::{ModelRewrite, RewriteRule, RewriteTarget};

use super::*;

const HEADER: &str = "apiVersion: llm-d.ai/v1alpha2\n";

fn parse_one(text: &str, pool: &PoolSelector) -> Result<Loaded, ManifestError> {
    parse(
        &[(PathBuf::from("manifests.yaml"), text.as_bytes().to_vec())],
        pool,
    )
}

fn any_pool() -> PoolSelector {
    PoolSelector::default()
}

fn pool(name: &str, namespace: &str) -> PoolSelector {
    PoolSelector {
        name: Some(name.to_string()),
        namespace: namespace.to_string(),
    }
}

fn objective(name: &str, extra: &str) -> String {
    format!("{HEADER}kind: InferenceObjective\nmetadata:\n  name: {name}\n{extra}")
}

fn rewrite(name: &str, metadata: &str, rules: &str) -> String {
    format!(
        "{HEADER}kind: InferenceModelRewrite\nmetadata:\n  name: {name}\n{metadata}spec:\n  poolRef: {{name: pool}}\n  rules:\n{rules}"
    )
}

fn error(text: &str) -> String {
    parse_one(text, &any_pool()).unwrap_err().to_string()
}

#[test]
fn parses_objectives_and_rewrites() {
    let text = format!(
        "{}\n---\n{}\n---\n{}",
        objective(
            "batch",
            "  namespace: llm\nspec:\n  priority: -1\n  poolRef: {group: inference.networking.k8s.io, kind: InferencePool, name: pool}\nstatus:\n  conditions: [{type: Accepted}]\n"
        ),
        objective("plain", "spec:\n  poolRef: {name: pool}\n"),
        rewrite(
            "canary",
            "  namespace: llm\n  labels: {a: b}\n  uid: 1234\n",
            "  - matches:\n    - model: {type: Exact, value: llama}\n    - model: {value: llama-alias}\n    targets:\n    - {modelRewrite: llama-v2, weight: 90}\n    - {modelRewrite: llama-v3, weight: 10}\n  - targets:\n    - modelRewrite: fallback\n"
        ),
    );
    let loaded = parse_one(&text, &any_pool()).unwrap();
    assert!(loaded.warnings.is_empty());
    assert_eq!(loaded.ignored, 0);
    let objectives: Vec<_> = loaded.manifests.objectives.into_iter().collect();
    assert_eq!(
        objectives,
        [("batch".to_string(), -1), ("plain".to_string(), 0)]
    );
    assert_eq!(
        loaded.manifests.rewrites,
        [ModelRewrite {
            name: "llm/canary".to_string(),
            rules: vec![
                RewriteRule {
                    matches: vec!["llama".to_string(), "llama-alias".to_string()],
                    targets: vec![
                        RewriteTarget {
                            model: "llama-v2".to_string(),
                            weight: Some(90)
                        },
                        RewriteTarget {
                            model: "llama-v3".to_string(),
                            weight: Some(10)
                        },
                    ],
                },
                RewriteRule {
                    matches: vec![],
                    targets: vec![RewriteTarget {
                        model: "fallback".to_string(),
                        weight: None
                    }],
                },
            ],
        }]
    );
}

#[test]
fn empty_documents_and_files_are_skipped() {
    let loaded = parse_one("", &any_pool()).unwrap();
    assert_eq!(loaded.manifests, Manifests::default());
    let loaded = parse_one("# nothing\n---\n---\n", &any_pool()).unwrap();
    assert_eq!(loaded.manifests, Manifests::default());
    let text = format!(
        "---\n# comment only\n---\n{}",
        objective("x", "spec:\n  poolRef: {name: p}\n  priority: 3\n")
    );
    assert_eq!(
        parse_one(&text, &any_pool()).unwrap().manifests.objectives["x"],
        3
    );
}

#[test]
fn the_deprecated_api_version_is_accepted_with_a_warning() {
    let text = objective("x", "spec:\n  poolRef: {name: p}\n").replace(
        "llm-d.ai/v1alpha2",
        "inference.networking.x-k8s.io/v1alpha2",
    );
    let loaded = parse_one(&text, &any_pool()).unwrap();
    assert_eq!(loaded.manifests.objectives["x"], 0);
    assert_eq!(
        loaded.warnings,
        ["manifests.yaml: document 1 (InferenceObjective \"x\"): apiVersion \"inference.networking.x-k8s.io/v1alpha2\" is deprecated; use \"llm-d.ai/v1alpha2\""]
    );
}

#[test]
fn errors_name_file_document_and_field() {
    let ok = objective("ok", "spec:\n  poolRef: {name: p}\n");
    let with_ok = |bad: &str| format!("{ok}---\n{bad}");
    for (text, expected) in [
        (
            with_ok(&objective("x", "spec:\n  priority: high\n  poolRef: {name: p}\n")),
            "manifests.yaml: document 2 (InferenceObjective \"x\"): spec.priority: invalid type: string \"high\", expected i32",
        ),
        (
            objective("x", "spec:\n  priority: 3000000000\n  poolRef: {name: p}\n"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): spec.priority: invalid value: integer `3000000000`, expected i32",
        ),
        (
            objective("x", "spec:\n  priority: 1\n  poolRef: {name: p}\n  criticality: Critical\n"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): spec: unknown field `criticality`",
        ),
        (
            objective("x", "spec:\n  priority: 1\n"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): spec: missing field `poolRef`",
        ),
        (
            objective("x", "spec:\n  poolRef: {name: ''}\n"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): spec.poolRef.name: must not be empty",
        ),
        (
            objective("x", "  bogus: 1\nspec:\n  poolRef: {name: p}\n"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): metadata: unknown field `bogus`",
        ),
        (
            objective("x", "  creationTimestamp: yesterday\nspec:\n  poolRef: {name: p}\n"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): metadata.creationTimestamp: \"yesterday\" is not an RFC 3339 time",
        ),
        (
            format!("{HEADER}kind: InferenceObjective\nspec:\n  poolRef: {{name: p}}\n"),
            "manifests.yaml: document 1 (InferenceObjective): missing field `metadata`",
        ),
        (
            with_ok(&format!("{HEADER}kind: InferencePool\nmetadata: {{name: p}}\n")),
            "manifests.yaml: document 2 (InferencePool \"p\"): kind: unsupported \"InferencePool\" (expected InferenceObjective or InferenceModelRewrite)",
        ),
        (
            format!("{HEADER}metadata: {{name: p}}\n"),
            "manifests.yaml: document 1: kind: missing",
        ),
        (
            objective("x", "spec:\n  poolRef: {name: p}\n").replace("llm-d.ai/v1alpha2", "v1"),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): apiVersion: unsupported \"v1\" (expected \"llm-d.ai/v1alpha2\")",
        ),
        (
            "kind: InferenceObjective\nmetadata: {name: x}\nspec: {poolRef: {name: p}}\n".to_string(),
            "manifests.yaml: document 1 (InferenceObjective \"x\"): apiVersion: missing",
        ),
        (
            "- a\n- b\n".to_string(),
            "manifests.yaml: document 1: not a Kubernetes object",
        ),
        (
            with_ok("kind: [unclosed\n"),
            "manifests.yaml: document 2: ",
        ),
        (
            format!(
                "{}---\n{}",
                objective("dup", "  namespace: a\nspec:\n  poolRef: {name: p}\n"),
                objective("dup", "  namespace: b\nspec:\n  poolRef: {name: p}\n")
            ),
            "manifests.yaml: document 2 (InferenceObjective \"dup\"): metadata.name: duplicate InferenceObjective \"dup\" (first in manifests.yaml document 1)",
        ),
    ] {
        let got = error(&text);
        assert!(got.starts_with(expected), "{text:?}\n got: {got}\nwant: {expected}");
        assert!(!got.contains('\n'), "{got:?}");
    }
}

#[test]
fn rewrite_validation() {
    let targets = "    targets: [{modelRewrite: t}]\n";
    for (rules, expected) in [
        (
            format!("  - matches: [{{model: {{type: RegularExpression, value: 'l.*'}}}}]\n{targets}"),
            "spec.rules[0].matches[0].model.type: unsupported \"RegularExpression\" (only \"Exact\" is supported)",
        ),
        (
            format!("  - matches: [{{model: {{value: ''}}}}]\n{targets}"),
            "spec.rules[0].matches[0].model.value: must not be empty",
        ),
        (
            "  - matches: [{model: {value: m}}]\n".to_string(),
            "spec.rules[0]: missing field `targets`",
        ),
        (
            format!("{targets}  - targets: []\n").replacen("    targets", "  - targets", 1),
            "spec.rules[1].targets: must list at least one target",
        ),
        (
            "  - targets: [{modelRewrite: a, weight: 1}, {modelRewrite: b}]\n".to_string(),
            "spec.rules[0].targets: either every target or none must have a weight",
        ),
        (
            "  - targets: [{modelRewrite: a, weight: 0}]\n".to_string(),
            "spec.rules[0].targets[0].weight: 0 is outside 1..1000000",
        ),
        (
            "  - targets: [{modelRewrite: a, weight: 1000001}]\n".to_string(),
            "spec.rules[0].targets[0].weight: 1000001 is outside 1..1000000",
        ),
        (
            "  - targets: [{modelRewrite: ''}]\n".to_string(),
            "spec.rules[0].targets[0].modelRewrite: must not be empty",
        ),
        (
            "  - targets: [{model: a}]\n".to_string(),
            "spec.rules[0].targets[0]: unknown field `model`",
        ),
        (
            "  - targets: [{modelRewrite: a, weight: heavy}]\n".to_string(),
            "spec.rules[0].targets[0].weight: invalid type",
        ),
    ] {
        let got = error(&rewrite("r", "", &rules));
        let expected =
            format!("manifests.yaml: document 1 (InferenceModelRewrite \"r\"): {expected}");
        assert!(got.starts_with(&expected), "{rules:?}\n got: {got}\nwant: {expected}");
    }
    // Both weight limits are accepted.
    let loaded = parse_one(
        &rewrite(
            "r",
            "",
            "  - targets: [{modelRewrite: a, weight: 1}, {modelRewrite: b, weight: 1000000}]\n",
        ),
        &any_pool(),
    )
    .unwrap();
    let weights: Vec<_> = loaded.manifests.rewrites[0].rules[0]
        .targets
        .iter()
        .map(|t| t.weight)
        .collect();
    assert_eq!(weights, [Some(1), Some(1_000_000)]);
}

#[test]
fn rewrites_are_sorted_oldest_first_then_in_file_order() {
    let rules = "  - targets: [{modelRewrite: t}]\n";
    let docs = [
        rewrite("no-ts-1", "", rules),
        rewrite(
            "new",
            "  creationTimestamp: \"2026-03-01T00:00:00Z\"\n",
            rules,
        ),
        rewrite("old", "  creationTimestamp: 2025-01-01T00:00:00Z\n", rules),
        rewrite("no-ts-2", "", rules),
        // The same instant as "new", written with an offset: file order breaks the tie.
        rewrite(
            "same-as-new",
            "  creationTimestamp: \"2026-03-01T02:00:00+02:00\"\n",
            rules,
        ),
        rewrite(
            "middle",
            "  creationTimestamp: \"2025-06-01T12:00:00.5Z\"\n",
            rules,
        ),
    ];
    let loaded = parse_one(&docs.join("---\n"), &any_pool()).unwrap();
    let names: Vec<_> = loaded
        .manifests
        .rewrites
        .iter()
        .map(|r| r.name.as_str())
        .collect();
    assert_eq!(
        names,
        [
            "default/old",
            "default/middle",
            "default/new",
            "default/same-as-new",
            "default/no-ts-1",
            "default/no-ts-2"
        ]
    );
}

#[test]
fn file_order_spans_files() {
    let rules = "  - targets: [{modelRewrite: t}]\n";
    let files = vec![
        (
            PathBuf::from("a.yaml"),
            rewrite("first", "", rules).into_bytes(),
        ),
        (
            PathBuf::from("b.yaml"),
            rewrite("second", "", rules).into_bytes(),
        ),
    ];
    let loaded = parse(&files, &any_pool()).unwrap();
    let names: Vec<_> = loaded
        .manifests
        .rewrites
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(names, ["default/first", "default/second"]);
    // Errors name the file they are in.
    let files = vec![
        files[0].clone(),
        (PathBuf::from("b.yaml"), b"kind: Pod\n".to_vec()),
    ];
    let err = parse(&files, &any_pool()).unwrap_err();
    assert_eq!(err.file, "b.yaml");
    assert!(
        err.message
            .starts_with("document 1 (Pod): kind: unsupported"),
        "{err}"
    );
}

#[test]
fn pool_ref_filtering() {
    let objectives = [
        objective("mine", "spec:\n  poolRef: {name: pool}\n  priority: 1\n"),
        objective(
            "mine-explicit-ns",
            "  namespace: llm\nspec:\n  poolRef: {name: pool}\n",
        ),
        objective("other-pool", "spec:\n  poolRef: {name: other}\n"),
        objective(
            "other-ns",
            "  namespace: elsewhere\nspec:\n  poolRef: {name: pool}\n",
        ),
    ]
    .join("---\n");
    let rewrites = [
        rewrite("r-mine", "", "  - targets: [{modelRewrite: t}]\n"),
        rewrite("r-other", "", "  - targets: [{modelRewrite: t}]\n")
            .replace("poolRef: {name: pool}", "poolRef: {name: other}"),
    ]
    .join("---\n");
    let text = format!("{objectives}---\n{rewrites}");

    // Without a pool name everything is kept.
    let loaded = parse_one(&text, &any_pool()).unwrap();
    assert_eq!(loaded.manifests.objectives.len(), 4);
    assert_eq!(loaded.manifests.rewrites.len(), 2);
    assert_eq!(loaded.ignored, 0);

    // A pool in `llm`: objects without a namespace are taken to be in the pool's.
    let loaded = parse_one(&text, &pool("pool", "llm")).unwrap();
    let names: Vec<_> = loaded.manifests.objectives.keys().cloned().collect();
    assert_eq!(names, ["mine", "mine-explicit-ns"]);
    let names: Vec<_> = loaded
        .manifests
        .rewrites
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(names, ["llm/r-mine"]);
    assert_eq!(loaded.ignored, 3);
    assert_eq!(
        loaded.summary(),
        "2 objectives, 1 rewrite (3 for other pools ignored)"
    );

    // Duplicates in other pools are not an error once filtered out.
    let text = format!(
        "{}---\n{}",
        objective("dup", "spec:\n  poolRef: {name: pool}\n"),
        objective("dup", "  namespace: b\nspec:\n  poolRef: {name: pool}\n")
    );
    assert!(parse_one(&text, &any_pool()).is_err());
    let loaded = parse_one(&text, &pool("pool", "default")).unwrap();
    assert_eq!(loaded.manifests.objectives.len(), 1);
    // Objects for other pools are still validated.
    let text = objective("x", "spec:\n  poolRef: {name: other}\n  priority: high\n");
    assert!(parse_one(&text, &pool("pool", "default")).is_err());
}

#[test]
fn duplicate_rewrites_are_errors() {
    let rules = "  - targets: [{modelRewrite: t}]\n";
    let text = format!(
        "{}---\n{}",
        rewrite("r", "", rules),
        rewrite("r", "", rules)
    );
    assert!(error(&text).contains("duplicate InferenceModelRewrite \"default/r\""));
    let text = format!(
        "{}---\n{}",
        rewrite("r", "", rules),
        rewrite("r", "  namespace: other\n", rules)
    );
    assert_eq!(
        parse_one(&text, &any_pool())
            .unwrap()
            .manifests
            .rewrites
            .len(),
        2
    );
}

#[test]
fn timestamps() {
    assert_eq!(parse_timestamp("1970-01-01T00:00:00Z"), Ok((0, 0)));
    assert_eq!(
        parse_timestamp("2000-02-29T12:34:56.789Z"),
        Ok((951_827_696, 789_000_000))
    );
    assert_eq!(
        parse_timestamp("2000-02-29T14:34:56+02:00"),
        Ok((951_827_696, 0))
    );
    assert_eq!(
        parse_timestamp("2000-02-29T11:34:56.123456789-01:00"),
        Ok((951_827_696, 123_456_789))
    );
    assert_eq!(parse_timestamp("1969-12-31T23:59:59z"), Ok((-1, 0)));
    // RFC 3339 allows a space for the T; ISO 8601's basic offset is taken too.
    assert_eq!(parse_timestamp("1970-01-01 00:00:01Z"), Ok((1, 0)));
    assert_eq!(parse_timestamp("1970-01-01T01:00:00+0100"), Ok((0, 0)));
    assert_eq!(
        parse_timestamp("1969-12-31T23:59:59.25Z"),
        Ok((-1, 250_000_000))
    );
    for bad in [
        "",
        "2024-01-01",
        "2024-01-01T00:00:00",
        "2024-13-01T00:00:00Z",
        "2023-02-29T00:00:00Z",
        "2024-01-01T24:00:00Z",
        "2024-01-01T00:00:00.Z",
        "2024-01-01T00:00:00Zjunk",
        "2024-1-01T00:00:00Z",
    ] {
        assert!(parse_timestamp(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn reads_a_directory_sorted_and_skips_other_files() {
    let dir = std::env::temp_dir().join(format!("wasm-epp-manifests-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("sub.yaml")).unwrap();
    let rules = "  - targets: [{modelRewrite: t}]\n";
    std::fs::write(dir.join("b.yml"), rewrite("b", "", rules)).unwrap();
    std::fs::write(dir.join("a.yaml"), rewrite("a", "", rules)).unwrap();
    std::fs::write(dir.join("c.json"), "not yaml: [").unwrap();
    std::fs::write(dir.join(".hidden.yaml"), "kind: Pod\n").unwrap();
    let source = ManifestSource {
        path: dir.clone(),
        pool: any_pool(),
    };
    let startup = source.clone().load().unwrap();
    let files: Vec<_> = startup.files.iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(files, [dir.join("a.yaml"), dir.join("b.yml")]);
    let names: Vec<_> = startup
        .loaded
        .manifests
        .rewrites
        .iter()
        .map(|r| r.name.clone())
        .collect();
    assert_eq!(names, ["default/a", "default/b"]);
    assert!(startup.describe().contains("0 objectives, 2 rewrites"));

    // A single file works too; a missing path is an error naming it.
    let single = ManifestSource {
        path: dir.join("a.yaml"),
        pool: any_pool(),
    };
    assert_eq!(single.load().unwrap().loaded.manifests.rewrites.len(), 1);
    let missing = ManifestSource {
        path: dir.join("missing.yaml"),
        pool: any_pool(),
    };
    let err = missing.load().unwrap_err();
    assert!(
        err.to_string().contains("missing.yaml: cannot open"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
