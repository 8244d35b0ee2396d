//! `LockError` as an HTTP response: contention is `423 Locked`, a lost or stale lock
//! `409 Conflict`, Redis trouble `503 Service Unavailable`, and misuse `500`, with
//! `Retry-After` on 423 and 503. The body names only the kind of error: keys (a
//! default prefix is a module path) and Redis's error text (hosts, ports) are for
//! the service's own logs, not for its callers.

use crate::LockError;

impl LockError {
    /// The HTTP status that fits this error.
    pub fn http_status(&self) -> u16 {
        match self {
            LockError::Busy { .. } | LockError::Timeout { .. } => 423,
            LockError::Lost { .. } | LockError::NotHeld { .. } => 409,
            LockError::Backend { .. }
            | LockError::Quorum { .. }
            | LockError::Replication { .. } => 503,
            LockError::Reentered { .. }
            | LockError::NoDefaultClient
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. } => 500,
        }
    }

    /// Seconds a client should wait before trying again, for 423 and 503.
    pub fn retry_after(&self) -> Option<u32> {
        matches!(self.http_status(), 423 | 503).then_some(1)
    }

    /// `{"error": "busy"}`: the kind of error and nothing else.
    pub fn http_body(&self) -> String {
        let kind = match self {
            LockError::Busy { .. } => "busy",
            LockError::Timeout { .. } => "timeout",
            LockError::Lost { .. } => "lost",
            LockError::NotHeld { .. } => "not_held",
            LockError::Reentered { .. } => "reentered",
            LockError::NoDefaultClient => "no_default_client",
            LockError::InvalidKey { .. } => "invalid_key",
            LockError::InvalidOptions { .. } => "invalid_options",
            LockError::Backend { .. } => "backend",
            LockError::Quorum { .. } => "quorum",
            LockError::Replication { .. } => "replication",
        };
        serde_json::json!({ "error": kind }).to_string()
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for LockError {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.http_status())
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
        let mut response = (status, json, self.http_body()).into_response();
        if let Some(seconds) = self.retry_after() {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, seconds.into());
        }
        response
    }
}

#[cfg(feature = "actix")]
impl actix_web::ResponseError for LockError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::from_u16(self.http_status())
            .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> actix_web::HttpResponse {
        let mut response = actix_web::HttpResponse::build(self.status_code());
        response.content_type("application/json");
        if let Some(seconds) = self.retry_after() {
            response.insert_header((actix_web::http::header::RETRY_AFTER, seconds));
        }
        response.body(self.http_body())
    }
}
