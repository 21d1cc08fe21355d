//! Model-server engines: which metric names carry the queue, running count, KV-cache usage, LoRA
//! state and cache geometry, per engine, as upstream's core metrics extractor maps them.
//!
//! An endpoint's engine is the value of its label [`ENGINE_LABEL`] (or the legacy
//! [`LEGACY_ENGINE_LABEL`]); without one, or with a name we do not know, it is [`DEFAULT_ENGINE`].

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;
use thiserror::Error;

use crate::prometheus::Sample;

/// The label naming an endpoint's engine.
pub const ENGINE_LABEL: &str = "llm-d.ai/engine-type";

/// The label's older name, read when the current one is absent.
pub const LEGACY_ENGINE_LABEL: &str = "inference.networking.k8s.io/engine-type";

/// The engine of an endpoint that names none.
pub const DEFAULT_ENGINE: &str = "vllm";

/// vLLM's cache-info labels, which upstream's `cacheInfoSpec` also reads.
const BLOCK_SIZE_LABEL: &str = "block_size";
const NUM_BLOCKS_LABEL: &str = "num_gpu_blocks";

/// A text that is not a series selector; each message quotes the text.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SelectorError {
    /// The family name is empty or has characters other than `[A-Za-z0-9_:]`.
    #[error("'{0}' is not a metric selector (name{{label=\"value\"}})")]
    Name(String),
    /// `{` without a closing `}`.
    #[error("'{0}': missing the closing brace")]
    Unclosed(String),
    /// A label matcher without `=`.
    #[error("'{text}': '{pair}' is not label=value")]
    Pair {
        /// The whole selector.
        text: String,
        /// The matcher.
        pair: String,
    },
}

/// An `engineConfigs` entry or extractor parameter that is wrong, shown as
/// `{field}: {problem}`.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{field}: {problem}")]
pub struct EngineError {
    /// The field, relative to the `engineConfigs` entry (`name`, `kvUsageSpec`, …) or to the
    /// extractor's parameters (`defaultEngine`).
    pub field: &'static str,
    /// What is wrong with it.
    pub problem: EngineProblem,
}

/// What is wrong in an [`EngineError`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EngineProblem {
    /// A required name is empty.
    #[error("must not be empty")]
    Empty,
    /// A `…Spec` is not a series selector.
    #[error(transparent)]
    Selector(#[from] SelectorError),
    /// `defaultEngine` names no engine.
    #[error("unknown engine {name:?} (known: {known})")]
    UnknownEngine {
        /// The name given.
        name: String,
        /// The known engines, comma-separated.
        known: String,
    },
}

/// A PromQL-style series selector: a family name and label values every sample must carry,
/// e.g. `nv_trt_llm_request_metrics{request_type="waiting"}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    /// The metric family.
    pub name: String,
    /// Required `label = value` pairs.
    pub labels: Vec<(String, String)>,
}

impl Selector {
    /// Parses `name` or `name{label="value",…}` (quotes optional).
    pub fn parse(text: &str) -> Result<Selector, SelectorError> {
        let text = text.trim();
        let (name, rest) = match text.split_once('{') {
            Some((name, rest)) => (name.trim(), Some(rest)),
            None => (text, None),
        };
        let valid_name = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
        if !valid_name {
            return Err(SelectorError::Name(text.to_string()));
        }
        let mut labels = Vec::new();
        if let Some(rest) = rest {
            let inner = rest
                .strip_suffix('}')
                .ok_or_else(|| SelectorError::Unclosed(text.to_string()))?;
            for pair in inner.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                let (label, value) = pair.split_once('=').ok_or_else(|| SelectorError::Pair {
                    text: text.to_string(),
                    pair: pair.to_string(),
                })?;
                let value = value.trim().trim_matches('"');
                labels.push((label.trim().to_string(), value.to_string()));
            }
        }
        Ok(Selector {
            name: name.to_string(),
            labels,
        })
    }

    /// Whether `sample` is one of the selected series.
    pub fn matches(&self, sample: &Sample<'_>) -> bool {
        sample.name == self.name
            && self
                .labels
                .iter()
                .all(|(label, value)| sample.label(label) == Some(value.as_str()))
    }

    /// The same series of the family `name + suffix` (a histogram's `_sum`, say).
    pub fn suffixed(&self, suffix: &str) -> Selector {
        Selector {
            name: format!("{}{suffix}", self.name),
            labels: self.labels.clone(),
        }
    }

    fn of(text: &str) -> Selector {
        Selector::parse(text).unwrap_or_else(|e| panic!("built-in selector: {e}"))
    }
}

/// Where a number comes from: a selected series' value, or one of its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Field {
    /// The value of the selected series.
    Value(Selector),
    /// A label of the selected series (e.g. `block_size` of `vllm:cache_config_info`).
    Label(Selector, String),
}

impl Field {
    /// The selector this field reads.
    pub fn selector(&self) -> &Selector {
        match self {
            Field::Value(selector) | Field::Label(selector, _) => selector,
        }
    }
}

/// The LoRA information series: its selector and the labels holding the running and waiting
/// adapters (comma lists) and the number of adapter slots. Its value is a timestamp; the newest
/// series wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraInfo {
    /// The series.
    pub selector: Selector,
    /// Label with the running adapters.
    pub running_label: String,
    /// Label with the waiting adapters.
    pub waiting_label: String,
    /// Label with the number of adapter slots.
    pub max_label: String,
}

impl LoraInfo {
    /// `selector` with vLLM's label names, which upstream's `loraSpec` also reads.
    fn with_vllm_labels(selector: Selector) -> LoraInfo {
        LoraInfo {
            selector,
            running_label: "running_lora_adapters".into(),
            waiting_label: "waiting_lora_adapters".into(),
            max_label: "max_lora".into(),
        }
    }
}

/// How to read one engine's metrics. Each list is tried in order; the first selector with a
/// series present is used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engine {
    /// The engine's name (the label value).
    pub name: String,
    /// Requests waiting; several series are summed.
    pub waiting: Vec<Selector>,
    /// Requests running; several series are summed.
    pub running: Vec<Selector>,
    /// KV-cache usage 0..1; the largest series is taken.
    pub kv_usage: Vec<Selector>,
    /// LoRA state, for engines that report it.
    pub lora: Option<LoraInfo>,
    /// Tokens per KV-cache block.
    pub block_size: Option<Field>,
    /// KV-cache blocks.
    pub num_blocks: Option<Field>,
    /// Inter-token-latency histograms (their `_sum` and `_count` series are read), for the
    /// server's measured decode speed; several series are summed.
    pub inter_token_latency: Vec<Selector>,
    /// Histograms of output tokens per finished request (`_sum` and `_count` read), for the
    /// mean length of the server's requests; several series are summed.
    pub request_output_tokens: Vec<Selector>,
}

impl Engine {
    /// Every metric family this engine reads (for servers that can filter their exposition).
    pub fn families(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .waiting
            .iter()
            .chain(&self.running)
            .chain(&self.kv_usage)
            .chain(self.lora.iter().map(|l| &l.selector))
            .chain(self.block_size.iter().map(Field::selector))
            .chain(self.num_blocks.iter().map(Field::selector))
            .map(|s| s.name.clone())
            .chain(
                self.inter_token_latency
                    .iter()
                    .chain(&self.request_output_tokens)
                    .flat_map(|s| [s.suffixed("_sum").name, s.suffixed("_count").name]),
            )
            .collect();
        names.sort_unstable();
        names.dedup();
        names
    }
}

/// The engines upstream maps out of the box: `vllm`, `sglang`, `trtllm-serve`,
/// `triton-tensorrt-llm` and `triton`.
pub fn built_in() -> Vec<Engine> {
    let list = |names: &[&str]| names.iter().map(|n| Selector::of(n)).collect::<Vec<_>>();
    let label =
        |selector: &str, label: &str| Some(Field::Label(Selector::of(selector), label.into()));
    let value = |selector: &str| Some(Field::Value(Selector::of(selector)));
    let trt = "nv_trt_llm_kv_cache_block_metrics";
    vec![
        Engine {
            name: "vllm".into(),
            waiting: list(&["vllm:num_requests_waiting"]),
            running: list(&["vllm:num_requests_running"]),
            // The second is the name vLLM used before `kv_cache_usage_perc`.
            kv_usage: list(&["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"]),
            lora: Some(LoraInfo::with_vllm_labels(Selector::of(
                "vllm:lora_requests_info",
            ))),
            block_size: label("vllm:cache_config_info", BLOCK_SIZE_LABEL),
            num_blocks: label("vllm:cache_config_info", NUM_BLOCKS_LABEL),
            // The second is the name vLLM used before `inter_token_latency_seconds`.
            inter_token_latency: list(&[
                "vllm:inter_token_latency_seconds",
                "vllm:time_per_output_token_seconds",
            ]),
            request_output_tokens: list(&["vllm:request_generation_tokens"]),
        },
        Engine {
            name: "sglang".into(),
            waiting: list(&["sglang:num_queue_reqs"]),
            running: list(&["sglang:num_running_reqs"]),
            kv_usage: list(&["sglang:token_usage"]),
            lora: None,
            block_size: label("sglang:cache_config_info", "page_size"),
            num_blocks: label("sglang:cache_config_info", "num_pages"),
            inter_token_latency: list(&[
                "sglang:inter_token_latency_seconds",
                "sglang:time_per_output_token_seconds",
            ]),
            request_output_tokens: Vec::new(),
        },
        Engine {
            name: "trtllm-serve".into(),
            waiting: list(&["trtllm_num_requests_waiting"]),
            running: list(&["trtllm_num_requests_running"]),
            kv_usage: list(&["trtllm_kv_cache_utilization"]),
            lora: None,
            block_size: value("trtllm_kv_cache_tokens_per_block"),
            num_blocks: value("trtllm_kv_cache_max_blocks"),
            inter_token_latency: Vec::new(),
            request_output_tokens: Vec::new(),
        },
        Engine {
            name: "triton-tensorrt-llm".into(),
            waiting: list(&["nv_trt_llm_request_metrics{request_type=\"waiting\"}"]),
            running: list(&["nv_trt_llm_request_metrics{request_type=\"scheduled\"}"]),
            kv_usage: list(&[&format!("{trt}{{kv_cache_block_type=\"fraction\"}}")]),
            lora: None,
            block_size: value(&format!("{trt}{{kv_cache_block_type=\"tokens_per\"}}")),
            num_blocks: value(&format!("{trt}{{kv_cache_block_type=\"max\"}}")),
            inter_token_latency: Vec::new(),
            request_output_tokens: Vec::new(),
        },
        Engine {
            name: "triton".into(),
            waiting: list(&["nv_inference_pending_request_count"]),
            running: list(&["nv_inference_exec_count"]),
            kv_usage: Vec::new(),
            lora: None,
            block_size: None,
            num_blocks: None,
            inter_token_latency: Vec::new(),
            request_output_tokens: Vec::new(),
        },
    ]
}

/// One entry of the `core-metrics-extractor`'s `engineConfigs`, as upstream writes it: PromQL
/// selectors for each field; an empty or absent one turns the field off. An entry replaces the
/// engine of the same name whole.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EngineConfig {
    /// The engine's name (the value of the engine label).
    pub name: String,
    /// Requests waiting.
    #[serde(default)]
    pub queued_requests_spec: String,
    /// Requests running.
    #[serde(default)]
    pub running_requests_spec: String,
    /// KV-cache usage, 0..1.
    #[serde(default)]
    pub kv_usage_spec: String,
    /// LoRA information (labels `running_lora_adapters`, `waiting_lora_adapters`, `max_lora`;
    /// the newest series wins).
    #[serde(default)]
    pub lora_spec: String,
    /// Cache geometry (labels `block_size` and `num_gpu_blocks`).
    #[serde(default)]
    pub cache_info_spec: String,
    /// The inter-token-latency histogram (its `_sum` and `_count` series are read); not an
    /// upstream field.
    #[serde(default)]
    pub inter_token_latency_spec: String,
    /// The histogram of output tokens per finished request (its `_sum` and `_count` series are
    /// read); not an upstream field.
    #[serde(default)]
    pub request_output_tokens_spec: String,
}

impl EngineConfig {
    /// The engine this entry describes; the error names the field.
    pub fn compile(&self) -> Result<Engine, EngineError> {
        if self.name.trim().is_empty() {
            return Err(EngineError {
                field: "name",
                problem: EngineProblem::Empty,
            });
        }
        let one = |field: &'static str, spec: &str| -> Result<Option<Selector>, EngineError> {
            if spec.trim().is_empty() {
                Ok(None)
            } else {
                Selector::parse(spec).map(Some).map_err(|e| EngineError {
                    field,
                    problem: e.into(),
                })
            }
        };
        let cache = one("cacheInfoSpec", &self.cache_info_spec)?;
        Ok(Engine {
            name: self.name.clone(),
            waiting: one("queuedRequestsSpec", &self.queued_requests_spec)?
                .into_iter()
                .collect(),
            running: one("runningRequestsSpec", &self.running_requests_spec)?
                .into_iter()
                .collect(),
            kv_usage: one("kvUsageSpec", &self.kv_usage_spec)?
                .into_iter()
                .collect(),
            lora: one("loraSpec", &self.lora_spec)?.map(LoraInfo::with_vllm_labels),
            block_size: cache
                .clone()
                .map(|s| Field::Label(s, BLOCK_SIZE_LABEL.into())),
            num_blocks: cache.map(|s| Field::Label(s, NUM_BLOCKS_LABEL.into())),
            inter_token_latency: one("interTokenLatencySpec", &self.inter_token_latency_spec)?
                .into_iter()
                .collect(),
            request_output_tokens: one(
                "requestOutputTokensSpec",
                &self.request_output_tokens_spec,
            )?
            .into_iter()
            .collect(),
        })
    }
}

/// The engines known to the controller, by name, and how an endpoint names its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Engines {
    by_name: BTreeMap<String, Arc<Engine>>,
    /// The label naming an endpoint's engine.
    label_key: String,
    /// The engine of an endpoint whose label is absent or names no known engine.
    default_engine: String,
}

impl Default for Engines {
    fn default() -> Self {
        Engines {
            by_name: built_in()
                .into_iter()
                .map(|engine| (engine.name.clone(), Arc::new(engine)))
                .collect(),
            label_key: ENGINE_LABEL.to_string(),
            default_engine: DEFAULT_ENGINE.to_string(),
        }
    }
}

impl Engines {
    /// The built-in engines plus `custom` ones (each replaces a built-in one of the same name
    /// whole), read from `label_key` (default [`ENGINE_LABEL`]), defaulting to `default_engine`
    /// (default [`DEFAULT_ENGINE`]), which must be one of them.
    pub fn configured(
        label_key: Option<String>,
        default_engine: Option<String>,
        custom: Vec<Engine>,
    ) -> Result<Engines, EngineError> {
        let mut engines = Engines::default();
        for engine in custom {
            engines
                .by_name
                .insert(engine.name.clone(), Arc::new(engine));
        }
        if let Some(key) = label_key.filter(|k| !k.trim().is_empty()) {
            engines.label_key = key;
        }
        if let Some(name) = default_engine.filter(|n| !n.trim().is_empty()) {
            if !engines.by_name.contains_key(&name) {
                let known = engines.by_name.keys().cloned().collect::<Vec<_>>();
                return Err(EngineError {
                    field: "defaultEngine",
                    problem: EngineProblem::UnknownEngine {
                        name,
                        known: known.join(", "),
                    },
                });
            }
            engines.default_engine = name;
        }
        Ok(engines)
    }

    /// The engine for an endpoint with `labels`. With the default label key, the legacy
    /// [`LEGACY_ENGINE_LABEL`] is read when the current one is absent.
    pub fn for_labels(&self, labels: &BTreeMap<String, String>) -> &Arc<Engine> {
        labels
            .get(&self.label_key)
            .or_else(|| {
                (self.label_key == ENGINE_LABEL)
                    .then(|| labels.get(LEGACY_ENGINE_LABEL))
                    .flatten()
            })
            .and_then(|name| self.by_name.get(name))
            .unwrap_or_else(|| self.default_engine())
    }

    /// The engine named `name`, if known.
    pub fn get(&self, name: &str) -> Option<&Engine> {
        self.by_name.get(name).map(Arc::as_ref)
    }

    fn default_engine(&self) -> &Arc<Engine> {
        self.by_name
            .get(&self.default_engine)
            .expect("the default engine is checked when configured")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_parse_with_and_without_labels() {
        assert_eq!(
            Selector::parse("vllm:num_requests_waiting").unwrap(),
            Selector {
                name: "vllm:num_requests_waiting".into(),
                labels: vec![]
            }
        );
        let s = Selector::parse("m{request_type=\"waiting\", x=y}").unwrap();
        assert_eq!(s.name, "m");
        assert_eq!(
            s.labels,
            vec![
                ("request_type".into(), "waiting".into()),
                ("x".into(), "y".into())
            ]
        );
        for bad in ["", "{a=b}", "m{a=b", "m{a}", "bad name"] {
            assert!(Selector::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Selector::parse("m{a}").unwrap_err().to_string(),
            "'m{a}': 'a' is not label=value"
        );
    }

    #[test]
    fn the_engine_comes_from_the_label_then_the_legacy_label_then_the_default() {
        let engines = Engines::default();
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        assert_eq!(engines.for_labels(&labels(&[])).name, "vllm");
        assert_eq!(
            engines
                .for_labels(&labels(&[(ENGINE_LABEL, "sglang")]))
                .name,
            "sglang"
        );
        assert_eq!(
            engines
                .for_labels(&labels(&[(LEGACY_ENGINE_LABEL, "triton")]))
                .name,
            "triton"
        );
        assert_eq!(
            engines
                .for_labels(&labels(&[
                    (ENGINE_LABEL, "trtllm-serve"),
                    (LEGACY_ENGINE_LABEL, "sglang")
                ]))
                .name,
            "trtllm-serve"
        );
        assert_eq!(
            engines
                .for_labels(&labels(&[(ENGINE_LABEL, "unknown")]))
                .name,
            "vllm",
            "an unknown engine falls back to the default"
        );
    }

    #[test]
    fn every_upstream_engine_is_built_in() {
        let engines = Engines::default();
        for name in [
            "vllm",
            "sglang",
            "trtllm-serve",
            "triton-tensorrt-llm",
            "triton",
        ] {
            assert!(engines.get(name).is_some(), "{name}");
        }
        assert_eq!(
            engines.get("vllm").unwrap().families(),
            [
                "vllm:cache_config_info",
                "vllm:gpu_cache_usage_perc",
                "vllm:inter_token_latency_seconds_count",
                "vllm:inter_token_latency_seconds_sum",
                "vllm:kv_cache_usage_perc",
                "vllm:lora_requests_info",
                "vllm:num_requests_running",
                "vllm:num_requests_waiting",
                "vllm:request_generation_tokens_count",
                "vllm:request_generation_tokens_sum",
                "vllm:time_per_output_token_seconds_count",
                "vllm:time_per_output_token_seconds_sum",
            ]
        );
    }

    #[test]
    fn custom_engines_replace_or_add_and_can_be_the_default() {
        let yaml = "- name: atom\n  queuedRequestsSpec: atom:waiting\n  runningRequestsSpec: atom:running\n  kvUsageSpec: atom:kv\n  cacheInfoSpec: atom:cache\n\
                    - name: vllm\n  queuedRequestsSpec: vllm:num_requests_waiting\n  loraSpec: ''\n";
        let configs: Vec<EngineConfig> = serde_yaml::from_str(yaml).unwrap();
        let custom: Vec<Engine> = configs.iter().map(|c| c.compile().unwrap()).collect();
        let engines =
            Engines::configured(Some("engine".into()), Some("atom".into()), custom).unwrap();
        let none = BTreeMap::new();
        let atom = engines.for_labels(&none);
        assert_eq!(atom.name, "atom");
        assert_eq!(
            atom.families(),
            ["atom:cache", "atom:kv", "atom:running", "atom:waiting"]
        );
        let vllm = engines
            .for_labels(&BTreeMap::from([(
                "engine".to_string(),
                "vllm".to_string(),
            )]))
            .clone();
        assert_eq!(vllm.lora, None, "replaced whole: LoRA off");
        assert!(vllm.running.is_empty());
        assert_eq!(
            engines
                .for_labels(&BTreeMap::from([(
                    ENGINE_LABEL.to_string(),
                    "sglang".to_string()
                )]))
                .name,
            "atom",
            "another label key is not read"
        );
        let err = Engines::configured(None, Some("nope".into()), vec![])
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("defaultEngine: unknown engine \"nope\""),
            "{err}"
        );
        let bad: Vec<EngineConfig> =
            serde_yaml::from_str("- name: x\n  kvUsageSpec: 'a{b'\n").unwrap();
        assert!(bad[0]
            .compile()
            .unwrap_err()
            .to_string()
            .starts_with("kvUsageSpec:"));
        assert!(serde_yaml::from_str::<Vec<EngineConfig>>("- name: x\n  queueSpec: a\n").is_err());
    }
}
