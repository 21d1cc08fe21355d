//! The subset hint (`x-gateway-destination-endpoint-subset`): which pool members one request
//! may go to, and of those the ready ones.

use crate::errors::InferenceError;
use crate::snapshot::Endpoint;

/// Request header restricting the pick to these endpoints: comma-separated `ip:port` (that
/// endpoint) or `ip` (every port of that address).
pub const SUBSET_HEADER: &str = "x-gateway-destination-endpoint-subset";

/// The pool, or only its members named by the subset header; of those, only the ready ones
/// (the controller's scrapes reach them), unless none is ready: a pool whose every scrape
/// fails is still tried rather than refused. References into the snapshot: nothing is copied
/// per endpoint.
pub fn candidates<'a>(
    endpoints: &'a [Endpoint],
    subset: Option<&str>,
) -> Result<Vec<&'a Endpoint>, InferenceError> {
    let wanted: Option<Vec<(&str, Option<u16>)>> = subset.map(|subset| {
        subset
            .split(',')
            .filter_map(|item| split_host_port(item.trim()))
            .collect()
    });
    let named = |e: &Endpoint| {
        wanted.as_ref().is_none_or(|wanted| {
            wanted
                .iter()
                .any(|&(ip, port)| ip == e.address && port.is_none_or(|p| p == e.port))
        })
    };
    let mut ready = Vec::with_capacity(endpoints.len());
    ready.extend(endpoints.iter().filter(|e| e.ready && named(e)));
    if !ready.is_empty() {
        return Ok(ready);
    }
    let all: Vec<&Endpoint> = endpoints.iter().filter(|e| named(e)).collect();
    if all.is_empty() && wanted.is_some() {
        return Err(no_candidates());
    }
    Ok(all)
}

/// `ip`, `ip:port`, `[v6]` or `[v6]:port` as address and optional port; `None` when empty or
/// the port is not a number.
fn split_host_port(item: &str) -> Option<(&str, Option<u16>)> {
    let (host, port) = if let Some(rest) = item.strip_prefix('[') {
        let (host, tail) = rest.split_once(']')?;
        (host, tail.strip_prefix(':'))
    } else if item.matches(':').count() == 1 {
        let (host, port) = item.split_once(':')?;
        (host, Some(port))
    } else {
        (item, None)
    };
    let port = match port {
        Some(p) => Some(p.parse().ok()?),
        None => None,
    };
    (!host.is_empty()).then_some((host, port))
}

pub fn no_candidates() -> InferenceError {
    InferenceError::NoEndpoints(
        "failed to find endpoint candidates for serving the request".to_string(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn subset_entries_are_ip_or_ip_port_with_bracketed_ipv6() {
        assert_eq!(split_host_port("[fd00::1]:80"), Some(("fd00::1", Some(80))));
        assert_eq!(split_host_port("fd00::1"), Some(("fd00::1", None)));
        assert_eq!(split_host_port("10.0.0.1:x"), None);
        assert_eq!(split_host_port(""), None);
    }
}
