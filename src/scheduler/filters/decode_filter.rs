//! `decode-filter`: keeps endpoints that can decode — role `decode`, `prefill-decode`, `both`
//! or `encode-prefill-decode` — and endpoints without a role label.

use crate::snapshot::Endpoint;

/// The plugin's `type`: in an EndpointPickerConfig `plugins` entry and in the snapshot's profile.
pub const TYPE: &str = "decode-filter";

/// Whether the filter keeps `endpoint`.
pub fn keeps(endpoint: &Endpoint) -> bool {
    matches!(
        super::role(endpoint),
        None | Some("decode" | "prefill-decode" | "both" | "encode-prefill-decode")
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
    fn decode_roles_and_unlabelled() {
        let table = [
            (None, true),
            (Some("decode"), true),
            (Some("both"), true),
            (Some("prefill-decode"), true),
            (Some("encode-prefill-decode"), true),
            (Some("prefill"), false),
            (Some("encode"), false),
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
