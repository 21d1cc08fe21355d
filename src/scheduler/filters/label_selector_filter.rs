//! `label-selector-filter`: keeps endpoints whose labels match a Kubernetes label selector
//! (`matchLabels` and `matchExpressions`, all required).

use std::collections::BTreeMap;

use crate::scheduler::profile::{LabelSelector, LabelSelectorOperator};

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "label-selector-filter";
/// The plugin's old `type` name, still accepted in an EndpointPickerConfig.
pub const OLD_TYPE: &str = "by-label-selector";

/// Whether `labels` satisfy `selector`.
pub fn matches(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    selector
        .match_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
        && selector.match_expressions.iter().all(|req| {
            let value = labels.get(&req.key);
            match req.operator {
                LabelSelectorOperator::In => value.is_some_and(|v| req.values.contains(v)),
                LabelSelectorOperator::NotIn => value.is_none_or(|v| !req.values.contains(v)),
                LabelSelectorOperator::Exists => value.is_some(),
                LabelSelectorOperator::DoesNotExist => value.is_none(),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::profile::LabelSelectorRequirement;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn requirement(
        key: &str,
        operator: LabelSelectorOperator,
        values: &[&str],
    ) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator,
            values: values.iter().map(|v| v.to_string()).collect(),
        }
    }

    #[test]
    fn match_labels_and_expressions() {
        use LabelSelectorOperator::*;
        let gpu_a100 = labels(&[("gpu", "a100"), ("zone", "a")]);
        let gpu_h100 = labels(&[("gpu", "h100")]);
        let none = labels(&[]);
        let table = [
            (
                LabelSelector {
                    match_labels: labels(&[("gpu", "a100")]),
                    ..Default::default()
                },
                [true, false, false],
            ),
            (
                LabelSelector {
                    match_expressions: vec![requirement("gpu", In, &["a100", "h100"])],
                    ..Default::default()
                },
                [true, true, false],
            ),
            (
                LabelSelector {
                    match_expressions: vec![requirement("gpu", NotIn, &["h100"])],
                    ..Default::default()
                },
                [true, false, true],
            ),
            (
                LabelSelector {
                    match_expressions: vec![requirement("zone", Exists, &[])],
                    ..Default::default()
                },
                [true, false, false],
            ),
            (
                LabelSelector {
                    match_expressions: vec![requirement("zone", DoesNotExist, &[])],
                    ..Default::default()
                },
                [false, true, true],
            ),
            (LabelSelector::default(), [true, true, true]),
        ];
        for (selector, expected) in table {
            let got = [&gpu_a100, &gpu_h100, &none].map(|l| matches(&selector, l));
            assert_eq!(got, expected, "{selector:?}");
        }
    }
}
