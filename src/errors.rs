//! Errors the filter answers itself, in the upstream EPP's wire format:
//! body `inference error: <Code> - <message>`, and a drop-reason header where upstream sets one.

use std::fmt;

/// Response header naming why a request was dropped.
pub const DROPPED_REASON_HEADER: &str = "x-llm-d-request-dropped-reason";

/// An error answered to the client instead of forwarding the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InferenceError {
    /// 400: the body cannot be understood.
    BadRequest(String),
    /// 503: there is no endpoint to send the request to.
    NoEndpoints(String),
    /// 503: the filter has no snapshot from the controller yet (fail-close).
    NoSnapshot,
    /// 429: the profile's filters removed every endpoint.
    FilteredOut,
    /// 500: a header-only request with an empty pool.
    NoPods,
    /// 429: the request was shed (a sheddable request while the pool is saturated).
    ResourceExhausted(String),
    /// 500: an internal failure, e.g. the request body could not be re-encoded.
    Internal(String),
    /// 429 (`ResourceExhausted`) or 503 (`ServiceUnavailable`) from flow control, with its
    /// drop reason.
    Dropped {
        /// 429 or 503.
        status: u32,
        /// `x-llm-d-request-dropped-reason`.
        reason: &'static str,
        /// The message after the code.
        message: String,
    },
}

impl InferenceError {
    /// HTTP status code.
    pub fn status(&self) -> u32 {
        match self {
            InferenceError::BadRequest(_) => 400,
            InferenceError::ResourceExhausted(_) => 429,
            InferenceError::NoEndpoints(_) | InferenceError::NoSnapshot => 503,
            InferenceError::NoPods | InferenceError::Internal(_) => 500,
            InferenceError::FilteredOut => 429,
            InferenceError::Dropped { status, .. } => *status,
        }
    }

    /// The upstream error code name.
    pub fn code(&self) -> &'static str {
        match self {
            InferenceError::BadRequest(_) => "BadRequest",
            InferenceError::ResourceExhausted(_) => "ResourceExhausted",
            InferenceError::NoEndpoints(_) | InferenceError::NoSnapshot => "ServiceUnavailable",
            InferenceError::NoPods | InferenceError::Internal(_) => "Internal",
            InferenceError::FilteredOut => "ResourceExhausted",
            InferenceError::Dropped { status: 429, .. } => "ResourceExhausted",
            InferenceError::Dropped { .. } => "ServiceUnavailable",
        }
    }

    /// The value of `x-llm-d-request-dropped-reason`, where upstream sets one.
    pub fn dropped_reason(&self) -> Option<&'static str> {
        match self {
            InferenceError::NoEndpoints(_) => Some("rejected-no-endpoints"),
            InferenceError::FilteredOut => Some("rejected-saturated"),
            InferenceError::Dropped { reason, .. } => Some(reason),
            _ => None,
        }
    }

    /// The response body.
    pub fn body(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for InferenceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let message = match self {
            InferenceError::BadRequest(m)
            | InferenceError::NoEndpoints(m)
            | InferenceError::ResourceExhausted(m)
            | InferenceError::Internal(m)
            | InferenceError::Dropped { message: m, .. } => m.as_str(),
            InferenceError::NoSnapshot => "no endpoint snapshot received from the controller yet",
            InferenceError::NoPods => "no pods available in datastore",
            InferenceError::FilteredOut => "no endpoints available for the given request",
        };
        write!(f, "inference error: {} - {}", self.code(), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn wire_format() {
        let e = InferenceError::BadRequest("model not found in request body".into());
        assert_eq!(e.status(), 400);
        assert_eq!(
            e.body(),
            "inference error: BadRequest - model not found in request body"
        );
        assert_eq!(e.dropped_reason(), None);
        let e = InferenceError::NoEndpoints("x".into());
        assert_eq!(
            (e.status(), e.dropped_reason()),
            (503, Some("rejected-no-endpoints"))
        );
        assert_eq!(e.body(), "inference error: ServiceUnavailable - x");
        assert_eq!(InferenceError::NoPods.status(), 500);
        assert_eq!(InferenceError::NoSnapshot.status(), 503);
        let e = InferenceError::FilteredOut;
        assert_eq!(
            (e.status(), e.dropped_reason()),
            (429, Some("rejected-saturated"))
        );
        assert_eq!(
            e.body(),
            "inference error: ResourceExhausted - no endpoints available for the given request"
        );
    }

    #[test]
    fn resource_exhausted_and_internal() {
        let e =
            InferenceError::ResourceExhausted("system saturated, sheddable request dropped".into());
        assert_eq!(
            (e.status(), e.code(), e.dropped_reason()),
            (429, "ResourceExhausted", None)
        );
        assert_eq!(
            e.body(),
            "inference error: ResourceExhausted - system saturated, sheddable request dropped"
        );
        let e = InferenceError::Internal("Error marshalling request body".into());
        assert_eq!(
            (e.status(), e.code(), e.dropped_reason()),
            (500, "Internal", None)
        );
        assert_eq!(
            e.body(),
            "inference error: Internal - Error marshalling request body"
        );
    }
}
