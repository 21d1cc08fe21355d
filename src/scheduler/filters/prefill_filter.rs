//! `prefill-filter`: keeps endpoints that can prefill — role `prefill`, `encode-prefill`,
//! `prefill-decode`, `both` or `encode-prefill-decode`; unlabelled endpoints are dropped.

use crate::snapshot::Endpoint;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "prefill-filter";

/// Whether the filter keeps `endpoint`.
pub fn keeps(endpoint: &Endpoint) -> bool {
    matches!(
        super::role(endpoint),
        Some("prefill" | "encode-prefill" | "prefill-decode" | "both" | "encode-prefill-decode")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::filters::ROLE_LABEL;
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn prefill_roles_only() {
        let table = [
            (None, false),
            (Some("prefill"), true),
            (Some("encode-prefill"), true),
            (Some("both"), true),
            (Some("decode"), false),
        ];
        for (role, kept) in table {
            let mut e = endpoint(1, 0, 0.0);
            if let Some(role) = role {
                e.labels.insert(ROLE_LABEL.into(), role.into());
            }
            assert_eq!(keeps(&e), kept, "{role:?}");
        }
    }
}
