//! Request metrics users chart, named like upstream's `llm_d_epp_*` family and labelled by
//! model, target model and objective, as Envoy stats.
//!
//! - `llm_d_epp_request_total` and `llm_d_epp_request_error_total` (+ `error_code`): counters.
//! - `llm_d_epp_request_duration_milliseconds`: decision → end of the stream, a histogram.
//! - `llm_d_epp_request_ttft_milliseconds`: decision → first response body chunk.
//! - `llm_d_epp_disagg_decision_total` (+ `decision_type`: `decode-only`, `prefill-decode`),
//!   for a profile with a prefill stage.
//!
//! Labels travel in the stat name, Istio-style (`<name>.model_name=.=<value>;.;…`); the
//! `stats_config.stats_tags` of the shipped Envoy configurations turn them into tags, and
//! `/stats/prometheus` shows a Wasm stat without its `wasmcustom.` namespace, so it reads
//! `llm_d_epp_request_total{model_name="…",target_model_name="…",objective="…"}`.
//!
//! The request path only counts in this worker's memory (no host call, no allocation once a
//! label set has been seen); [`RequestMetrics::flush`] sends the counts and samples to Envoy on
//! the worker's tick, about once a second: one counter increment per label set that moved and
//! one histogram sample per recorded value. Label values are capped per worker
//! ([`LABEL_VALUES`] models, [`LABEL_VALUES`] objectives); later ones are folded into `other`.

use std::collections::HashMap;

/// Distinct values per label kept per worker before new ones become [`OTHER`].
pub const LABEL_VALUES: usize = 64;
/// The value that stands for every label value past the cap.
pub const OTHER: &str = "other";
/// `decision_type` of a request a prefill stage left on its decode endpoint.
pub const DECODE_ONLY: &str = "decode-only";
/// `decision_type` of a request sent to a prefill endpoint too.
pub const PREFILL_DECODE: &str = "prefill-decode";

/// One kind of metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// `llm_d_epp_request_total`.
    Requests,
    /// `llm_d_epp_request_error_total` with its upstream error code.
    Errors(&'static str),
    /// `llm_d_epp_disagg_decision_total` with its decision type.
    Disaggregation(&'static str),
    /// `llm_d_epp_request_duration_milliseconds`.
    DurationMs,
    /// `llm_d_epp_request_ttft_milliseconds`.
    TtftMs,
}

impl Kind {
    fn is_histogram(self) -> bool {
        matches!(self, Kind::DurationMs | Kind::TtftMs)
    }

    /// The stat name's base and its extra label, if any.
    fn base(self) -> (&'static str, Option<(&'static str, &'static str)>) {
        match self {
            Kind::Requests => ("llm_d_epp_request_total", None),
            Kind::Errors(code) => ("llm_d_epp_request_error_total", Some(("error_code", code))),
            Kind::Disaggregation(kind) => (
                "llm_d_epp_disagg_decision_total",
                Some(("decision_type", kind)),
            ),
            Kind::DurationMs => ("llm_d_epp_request_duration_milliseconds", None),
            Kind::TtftMs => ("llm_d_epp_request_ttft_milliseconds", None),
        }
    }
}

/// A request's labels, as interned ids (cheap to copy into a request's state).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Labels {
    model: u16,
    target: u16,
    objective: u16,
}

/// Defining and updating Envoy metrics (the Proxy-Wasm host; a fake in tests).
pub trait MetricsHost {
    /// Defines a counter or histogram named `name`; its id, or `None` if the host refused.
    fn define(&mut self, histogram: bool, name: &str) -> Option<u32>;
    /// Adds `by` to counter `id`.
    fn increment(&mut self, id: u32, by: u64);
    /// Records `value` in histogram `id`.
    fn record(&mut self, id: u32, value: u64);
}

/// Label values seen so far, capped.
#[derive(Debug, Default)]
struct Interner {
    ids: HashMap<String, u16>,
    values: Vec<String>,
}

impl Interner {
    /// The id of `value`; past the cap, the id of [`OTHER`].
    fn intern(&mut self, value: &str) -> u16 {
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        let value = if self.values.len() < LABEL_VALUES {
            value
        } else {
            OTHER
        };
        if let Some(&id) = self.ids.get(value) {
            return id;
        }
        let id = u16::try_from(self.values.len()).unwrap_or(u16::MAX);
        // `;` would end the value early in the stat name, `=` start a label of its own.
        self.values.push(value.replace([';', '='], "_"));
        self.ids.insert(value.to_string(), id);
        id
    }

    fn value(&self, id: u16) -> &str {
        self.values.get(usize::from(id)).map_or("", String::as_str)
    }
}

/// One worker's request metrics, pending until the next flush.
#[derive(Debug, Default)]
pub struct RequestMetrics {
    models: Interner,
    objectives: Interner,
    /// Envoy metric ids by kind and labels (`None`: the host refused to define it).
    ids: HashMap<(Kind, Labels), Option<u32>>,
    /// Counter increments since the last flush.
    counts: HashMap<(Kind, Labels), u64>,
    /// Histogram samples since the last flush.
    samples: Vec<(Kind, Labels, u64)>,
}

/// Samples kept between flushes at most (a worker routing more in one second drops the rest).
const MAX_SAMPLES: usize = 65_536;

impl RequestMetrics {
    /// The labels of a request for `model`, rewritten to `target`, naming `objective` (empty:
    /// none).
    pub fn labels(&mut self, model: &str, target: &str, objective: &str) -> Labels {
        Labels {
            model: self.models.intern(model),
            target: self.models.intern(target),
            objective: self.objectives.intern(objective),
        }
    }

    /// Counts one `kind` event (a counter kind) for `labels`.
    pub fn count(&mut self, kind: Kind, labels: Labels) {
        *self.counts.entry((kind, labels)).or_default() += 1;
    }

    /// Records one `kind` sample (a histogram kind) for `labels`.
    pub fn sample(&mut self, kind: Kind, labels: Labels, value: u64) {
        if self.samples.len() < MAX_SAMPLES {
            self.samples.push((kind, labels, value));
        }
    }

    /// Sends the pending counts and samples to `host`, defining each label set's metric the
    /// first time it is used.
    pub fn flush(&mut self, host: &mut impl MetricsHost) {
        let counts: Vec<((Kind, Labels), u64)> = self.counts.drain().collect();
        for ((kind, labels), by) in counts {
            if let Some(id) = self.id(host, kind, labels) {
                host.increment(id, by);
            }
        }
        let samples = std::mem::take(&mut self.samples);
        for &(kind, labels, value) in &samples {
            if let Some(id) = self.id(host, kind, labels) {
                host.record(id, value);
            }
        }
        // Keep the buffer's capacity for the next second.
        self.samples = samples;
        self.samples.clear();
    }

    fn id(&mut self, host: &mut impl MetricsHost, kind: Kind, labels: Labels) -> Option<u32> {
        if let Some(&id) = self.ids.get(&(kind, labels)) {
            return id;
        }
        let id = host.define(kind.is_histogram(), &self.stat_name(kind, labels));
        self.ids.insert((kind, labels), id);
        id
    }

    /// `<base>.model_name=.=<m>;.;target_model_name=.=<t>;.;objective=.=<o>;.;[<extra>=.=<v>;.;]`.
    fn stat_name(&self, kind: Kind, labels: Labels) -> String {
        let (base, extra) = kind.base();
        let mut name = format!(
            "{base}.model_name=.={};.;target_model_name=.={};.;objective=.={};.;",
            self.models.value(labels.model),
            self.models.value(labels.target),
            self.objectives.value(labels.objective),
        );
        if let Some((key, value)) = extra {
            name.push_str(&format!("{key}=.={value};.;"));
        }
        name
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Records what the filter would send to Envoy.
    #[derive(Default)]
    struct FakeHost {
        names: Vec<(bool, String)>,
        increments: Vec<(u32, u64)>,
        records: Vec<(u32, u64)>,
    }

    impl MetricsHost for FakeHost {
        fn define(&mut self, histogram: bool, name: &str) -> Option<u32> {
            self.names.push((histogram, name.to_string()));
            Some(u32::try_from(self.names.len() - 1).unwrap())
        }
        fn increment(&mut self, id: u32, by: u64) {
            self.increments.push((id, by));
        }
        fn record(&mut self, id: u32, value: u64) {
            self.records.push((id, value));
        }
    }

    #[test]
    fn counts_are_batched_per_label_set_and_defined_once() {
        let mut metrics = RequestMetrics::default();
        let mut host = FakeHost::default();
        let llama = metrics.labels("llama", "llama-v2", "batch");
        for _ in 0..3 {
            metrics.count(Kind::Requests, llama);
        }
        metrics.count(Kind::Errors("ResourceExhausted"), llama);
        metrics.sample(Kind::TtftMs, llama, 42);
        metrics.flush(&mut host);
        let name = |id: u32| host.names[id as usize].1.clone();
        let mut increments: Vec<(String, u64)> = host
            .increments
            .iter()
            .map(|&(id, by)| (name(id), by))
            .collect();
        increments.sort();
        assert_eq!(
            increments,
            [
                ("llm_d_epp_request_error_total.model_name=.=llama;.;target_model_name=.=llama-v2;.;objective=.=batch;.;error_code=.=ResourceExhausted;.;".to_string(), 1),
                ("llm_d_epp_request_total.model_name=.=llama;.;target_model_name=.=llama-v2;.;objective=.=batch;.;".to_string(), 3),
            ]
        );
        assert_eq!(host.records.len(), 1);
        assert_eq!(host.records[0].1, 42);
        assert!(host.names[host.records[0].0 as usize].0, "a histogram");
        // The next second: the same label set reuses its metric.
        metrics.count(Kind::Requests, llama);
        metrics.flush(&mut host);
        assert_eq!(host.names.len(), 3);
        assert_eq!(host.increments.len(), 3);
        // Nothing pending: a flush sends nothing.
        metrics.flush(&mut host);
        assert_eq!(host.increments.len(), 3);
    }

    #[test]
    fn label_values_past_the_cap_fold_into_other() {
        let mut metrics = RequestMetrics::default();
        for i in 0..LABEL_VALUES {
            metrics.labels(&format!("m{i}"), &format!("m{i}"), "");
        }
        let late = metrics.labels("a-new-model", "a-new-model", "");
        assert_eq!(metrics.models.value(late.model), OTHER);
        let known = metrics.labels("m3", "m3", "");
        assert_eq!(metrics.models.value(known.model), "m3");
    }

    #[test]
    fn a_value_cannot_end_early_or_fake_a_label() {
        let mut metrics = RequestMetrics::default();
        let labels = metrics.labels("a;.;objective=.=x", "t", "");
        let name = metrics.stat_name(Kind::Requests, labels);
        assert!(
            name.starts_with(
                "llm_d_epp_request_total.model_name=.=a_._objective_._x;.;target_model_name=.=t;.;"
            ),
            "{name}"
        );
    }
}
