//! The decision header (`explainDecisions`): the pick, then the best candidates with their
//! total and per-scorer scores.

use crate::scheduler::profile::Profile;
use crate::scheduler::Decision;
use crate::snapshot::Endpoint;

/// Response header explaining the decision, when `explainDecisions` is on.
pub const DECISION_HEADER: &str = "x-wasm-epp-decision";
/// Candidates listed in the decision header.
const EXPLAINED_CANDIDATES: usize = 3;

/// `picked=<ip:port>; <ip:port> total=… <scorer>=…; …` for the best candidates, best first.
pub fn explain(profile: &Profile, decision: &Decision, endpoints: &[&Endpoint]) -> String {
    let mut order: Vec<usize> = (0..decision.candidates.len()).collect();
    order.sort_by(|&a, &b| decision.totals[b].total_cmp(&decision.totals[a]));
    let picked = decision
        .picked
        .iter()
        .filter_map(|&i| endpoints.get(i))
        .map(|e| e.host_port())
        .collect::<Vec<_>>()
        .join(",");
    let mut out = format!("picked={picked}");
    for &c in order.iter().take(EXPLAINED_CANDIDATES) {
        let Some(endpoint) = decision.candidates.get(c).and_then(|&i| endpoints.get(i)) else {
            continue;
        };
        out.push_str(&format!(
            "; {} total={:.3}",
            endpoint.host_port(),
            decision.totals[c]
        ));
        for (scorer, scores) in profile.scorers.iter().zip(&decision.scores) {
            out.push_str(&format!(
                " {}={:.3}",
                scorer.name,
                scores.get(c).copied().unwrap_or(0.0)
            ));
        }
    }
    out
}
