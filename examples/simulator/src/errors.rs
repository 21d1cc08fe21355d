//! OpenAI-style error responses.

use hyper::{Response, StatusCode};
use serde_json::json;

use crate::respond::{self, Body};

/// An error reported to the client as
/// `{"error": {"message", "type", "code"}}`, as vLLM does.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    status: StatusCode,
    kind: &'static str,
    message: String,
}

impl ApiError {
    /// A 400 `BadRequestError`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            kind: "BadRequestError",
            message: message.into(),
        }
    }

    /// A 404 `NotFoundError`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self {
            status: StatusCode::NOT_FOUND,
            kind: "NotFoundError",
            message: message.into(),
        }
    }

    /// The error as an HTTP response.
    pub fn into_response(self) -> Response<Body> {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "code": self.status.as_u16(),
            }
        });
        respond::json(self.status, &body)
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::BodyExt;
    use serde_json::Value;

    use super::*;

    async fn body_of(error: ApiError) -> (StatusCode, Value) {
        let response = error.into_response();
        let status = response.status();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn bad_request_body() {
        let (status, body) = body_of(ApiError::bad_request("missing field `model`")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(
            body,
            json!({"error": {"message": "missing field `model`", "type": "BadRequestError", "code": 400}})
        );
    }

    #[tokio::test]
    async fn not_found_body() {
        let (status, body) = body_of(ApiError::not_found("The model `x` does not exist.")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["error"]["type"], "NotFoundError");
        assert_eq!(body["error"]["code"], 404);
    }
}
