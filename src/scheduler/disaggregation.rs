//! Prefill/decode disaggregation: upstream's `disagg-profile-handler` (decode first) with its
//! `prefix-based-pd-decider` or `always-disagg-pd-decider`.
//!
//! The snapshot's profile is the decode profile: its pick is the destination, as for any
//! request. When the profile carries a [`Disaggregation`], the decider looks at that pick: if it
//! approves, the prefill profile runs over the same endpoints and its pick goes to the decode
//! server in [`PREFILLER_HEADER`] (`ip:port`, IPv6 in brackets), for the server's routing
//! sidecar to run the prefill there. A prefill profile that finds no endpoint leaves the request
//! decode-only, as upstream does. The prompt's blocks are recorded in the prefix index for
//! both picks.

use serde::{Deserialize, Serialize};

use super::fixed_scores::ScoringCache;
use super::prefix::PrefixIndex;
use super::profile::Profile;
use super::rng::Rng;
use super::{schedule, Decision, InFlight, Request};
use crate::phases::PhaseTimer;
use crate::snapshot::Endpoint;

/// The handler's `type` in an EndpointPickerConfig.
pub const TYPE: &str = "disagg-profile-handler";
/// `type` of the decider that disaggregates when enough of the prompt is not cached.
pub const PREFIX_BASED_DECIDER_TYPE: &str = "prefix-based-pd-decider";
/// `type` of the decider that always disaggregates.
pub const ALWAYS_DECIDER_TYPE: &str = "always-disagg-pd-decider";
/// Request header naming the prefill endpoint, for the decode server.
pub const PREFILLER_HEADER: &str = "x-prefiller-host-port";
/// Request header of upstream's encode stage (not implemented): removed from every request
/// like the prefill header, so a client can name neither.
pub const ENCODER_HEADER: &str = "x-encoder-hosts-ports";
/// Bytes per pseudo-token when the prompt's length is counted in tokens (no tokenizer in the
/// proxy; upstream's estimate without one is the same).
const BYTES_PER_TOKEN: usize = 4;

/// The prefill stage of a decode profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Disaggregation {
    /// The prefill profile (its name from the config, usually `prefill`).
    pub prefill: Profile,
    /// When a request is disaggregated.
    pub decider: Decider,
    /// The prefill profile's cache of metric-only scores (not serialised).
    #[serde(skip)]
    pub scoring_cache: ScoringCache,
}

/// Decider plugins by upstream config `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub enum Decider {
    /// `prefix-based-pd-decider`.
    #[serde(rename = "prefix-based-pd-decider")]
    PrefixBased(PrefixBasedParams),
    /// `always-disagg-pd-decider`.
    #[serde(rename = "always-disagg-pd-decider")]
    Always,
}

/// Parameters of `prefix-based-pd-decider` (upstream names and defaults).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PrefixBasedParams {
    /// Disaggregate only when at least this many prompt tokens are not cached on the decode
    /// pick; 0 never disaggregates.
    pub non_cached_tokens: u64,
    /// Disaggregate only prompts of at least this many tokens; 0 means any length.
    pub prompt_tokens: u64,
}

impl Decider {
    /// The config `type`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Decider::PrefixBased(_) => PREFIX_BASED_DECIDER_TYPE,
            Decider::Always => ALWAYS_DECIDER_TYPE,
        }
    }

    /// Whether to run the prefill stage for a prompt of `prompt_bytes` whose decode pick likely
    /// holds `cached_tokens` of it (`None`: the decode profile has no prefix-cache scorer, so
    /// nothing is known and the prefix-based decider declines, as upstream's does).
    pub fn approves(&self, prompt_bytes: usize, cached_tokens: Option<u64>) -> bool {
        let params = match self {
            Decider::Always => return true,
            Decider::PrefixBased(params) => params,
        };
        let input = prompt_tokens(prompt_bytes);
        let Some(cached) = cached_tokens else {
            return false;
        };
        params.non_cached_tokens > 0
            && (params.prompt_tokens == 0 || input >= params.prompt_tokens)
            && input >= params.non_cached_tokens
            && input.saturating_sub(cached) >= params.non_cached_tokens
    }
}

/// The prefill endpoint for a request the decode profile scheduled as `decode` (over the same
/// `endpoints` and `in_flight` counts), or `None` when the decider declines or the prefill
/// profile finds no endpoint (the request stays decode-only). The prefill pick's prompt blocks
/// are recorded in `prefix_index`.
#[allow(clippy::too_many_arguments)]
pub fn prefill_pick<'e>(
    stage: &Disaggregation,
    decode: &Decision,
    endpoints: &[&'e Endpoint],
    in_flight: &[InFlight],
    request: &Request<'_>,
    prefix_index: &mut PrefixIndex,
    rng: &mut Rng,
    timer: &mut PhaseTimer,
) -> Option<&'e Endpoint> {
    if !stage
        .decider
        .approves(request.prompt.len(), decode.primary_cached_tokens)
    {
        return None;
    }
    let prefill = schedule(
        &stage.prefill,
        &stage.scoring_cache,
        endpoints,
        in_flight,
        request,
        prefix_index,
        rng,
        timer,
    )
    .ok()?;
    prefill
        .picked
        .first()
        .and_then(|&i| endpoints.get(i).copied())
}

/// The prompt's length in pseudo-tokens (a partial last token counts).
pub fn prompt_tokens(prompt_bytes: usize) -> u64 {
    u64::try_from(prompt_bytes.div_ceil(BYTES_PER_TOKEN)).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scheduler::filters::ROLE_LABEL;
    use crate::scheduler::profile::FilterSpec;
    use crate::scheduler::test_support::endpoint;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Two decode and two prefill endpoints (10.0.0.1–2 decode, .3–4 prefill).
    fn pool() -> Vec<Endpoint> {
        (1..=4)
            .map(|i| {
                let mut e = endpoint(i, 0, 0.1);
                let role = if i <= 2 { "decode" } else { "prefill" };
                e.labels.insert(ROLE_LABEL.to_string(), role.to_string());
                e
            })
            .collect()
    }

    /// The upstream example's shape: both profiles with their role filter and the default
    /// scorers (prefix-cache among them), disaggregating at 16 uncached tokens.
    fn decode_profile() -> Profile {
        let prefill = Profile {
            name: "prefill".into(),
            filters: vec![FilterSpec::Prefill],
            ..Profile::default()
        };
        Profile {
            name: "decode".into(),
            filters: vec![FilterSpec::Decode],
            disaggregation: Some(Box::new(Disaggregation {
                prefill,
                decider: prefix_based(16, 0),
                scoring_cache: ScoringCache::default(),
            })),
            ..Profile::default()
        }
    }

    /// (decode pick, prefill pick) for `prompt`.
    fn decide(
        profile: &Profile,
        endpoints: &[Endpoint],
        prompt: &[u8],
        index: &mut PrefixIndex,
    ) -> (String, Option<String>) {
        let refs: Vec<&Endpoint> = endpoints.iter().collect();
        let request = Request {
            model: "m",
            prompt,
            ..Request::default()
        };
        let (mut rng, mut timer) = (Rng::new(7), PhaseTimer::off());
        let cache = ScoringCache::default();
        let decode = schedule(
            profile,
            &cache,
            &refs,
            &[],
            &request,
            index,
            &mut rng,
            &mut timer,
        )
        .unwrap();
        let stage = profile.disaggregation.as_deref().unwrap();
        let prefill = prefill_pick(
            stage,
            &decode,
            &refs,
            &[],
            &request,
            index,
            &mut rng,
            &mut timer,
        );
        (
            refs[decode.picked[0]].host_port(),
            prefill.map(Endpoint::host_port),
        )
    }

    #[test]
    fn a_long_uncached_prompt_gets_a_prefill_endpoint_of_the_prefill_role() {
        let (endpoints, profile) = (pool(), decode_profile());
        let mut index = PrefixIndex::new(64);
        let long = vec![b'a'; 4000]; // 1,000 tokens, nothing cached yet
        let (decode, prefill) = decide(&profile, &endpoints, &long, &mut index);
        assert!(
            ["10.0.0.1:8000", "10.0.0.2:8000"].contains(&decode.as_str()),
            "{decode}"
        );
        let prefill = prefill.expect("disaggregated");
        assert!(
            ["10.0.0.3:8000", "10.0.0.4:8000"].contains(&prefill.as_str()),
            "{prefill}"
        );
        // The same prompt again: its blocks are now on the decode pick, so only the uncached
        // tail (under 16 tokens) is left and the request stays on one server.
        let (again, prefill_again) = decide(&profile, &endpoints, &long, &mut index);
        assert_eq!(again, decode, "prefix affinity");
        assert_eq!(prefill_again, None);
    }

    #[test]
    fn a_short_prompt_is_not_disaggregated() {
        let (endpoints, profile) = (pool(), decode_profile());
        let (_, prefill) = decide(&profile, &endpoints, &[b'a'; 60], &mut PrefixIndex::new(64));
        assert_eq!(prefill, None, "15 tokens");
    }

    #[test]
    fn no_prefill_endpoint_leaves_the_request_decode_only() {
        let decode_only: Vec<Endpoint> = pool().into_iter().take(2).collect();
        let (decode, prefill) = decide(
            &decode_profile(),
            &decode_only,
            &[b'a'; 4000],
            &mut PrefixIndex::new(64),
        );
        assert!(decode.starts_with("10.0.0."));
        assert_eq!(prefill, None);
    }

    #[test]
    fn a_profile_with_a_prefill_stage_round_trips_through_json() {
        let profile = decode_profile();
        let json = serde_json::to_string(&profile).unwrap();
        assert!(
            json.contains(r#""type":"prefix-based-pd-decider""#),
            "{json}"
        );
        let back: Profile = serde_json::from_str(&json).unwrap();
        assert_eq!(back, profile);
        // A profile without one serialises as before (older filters read it unchanged).
        let plain = serde_json::to_string(&Profile::default()).unwrap();
        assert!(!plain.contains("disaggregation"), "{plain}");
    }

    fn prefix_based(non_cached_tokens: u64, prompt_tokens: u64) -> Decider {
        Decider::PrefixBased(PrefixBasedParams {
            non_cached_tokens,
            prompt_tokens,
        })
    }

    #[test]
    fn prefix_based_decides_on_the_uncached_part_of_the_prompt() {
        let decider = prefix_based(16, 0);
        // 400 bytes = 100 tokens.
        assert!(decider.approves(400, Some(0)));
        assert!(
            decider.approves(400, Some(84)),
            "exactly the threshold disaggregates"
        );
        assert!(!decider.approves(400, Some(85)), "15 uncached tokens");
        assert!(!decider.approves(60, Some(0)), "a 15-token prompt");
        assert!(
            !decider.approves(400, None),
            "nothing known about the cache"
        );
    }

    #[test]
    fn zero_non_cached_tokens_never_disaggregates_and_prompt_tokens_gates() {
        assert!(!prefix_based(0, 0).approves(1 << 20, Some(0)));
        let gated = prefix_based(16, 1000);
        assert!(!gated.approves(3996, Some(0)), "999 tokens");
        assert!(gated.approves(4000, Some(0)));
    }

    #[test]
    fn always_disaggregates() {
        assert!(Decider::Always.approves(0, None));
    }

    #[test]
    fn pseudo_tokens_round_up() {
        assert_eq!(
            (prompt_tokens(0), prompt_tokens(1), prompt_tokens(8)),
            (0, 1, 2)
        );
    }

    #[test]
    fn deciders_serialise_with_their_type() {
        for decider in [prefix_based(1, 2), Decider::Always] {
            let json = serde_json::to_value(&decider).unwrap();
            assert_eq!(json["type"], decider.type_name());
            let back: Decider = serde_json::from_value(json).unwrap();
            assert_eq!(back, decider);
        }
    }
}
