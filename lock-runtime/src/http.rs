//! `LockError` as an HTTP response: contention is `423 Locked`, a lost or stale lock
//! `409 Conflict`, Redis trouble `503 Service Unavailable`, and misuse `500`. The body
//! is JSON naming the kind of error, the key and what to do.

use crate::LockError;

impl LockError {
    /// The HTTP status that fits this error.
    pub fn http_status(&self) -> u16 {
        match self {
            LockError::Busy { .. } | LockError::Timeout { .. } => 423,
            LockError::Lost { .. } | LockError::NotHeld { .. } => 409,
            LockError::Backend { .. } | LockError::Quorum { .. } => 503,
            LockError::Reentered { .. }
            | LockError::NoDefaultClient
            | LockError::InvalidKey { .. }
            | LockError::InvalidOptions { .. } => 500,
        }
    }

    /// `{"error": "busy", "key": "order:42", "message": "..."}`.
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
        };
        serde_json::json!({ "error": kind, "key": self.key(), "message": self.to_string() })
            .to_string()
    }
}

#[cfg(feature = "axum")]
impl axum::response::IntoResponse for LockError {
    fn into_response(self) -> axum::response::Response {
        let status = axum::http::StatusCode::from_u16(self.http_status())
            .unwrap_or(axum::http::StatusCode::INTERNAL_SERVER_ERROR);
        let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
        (status, json, self.http_body()).into_response()
    }
}

#[cfg(feature = "actix")]
impl actix_web::ResponseError for LockError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::from_u16(self.http_status())
            .unwrap_or(actix_web::http::StatusCode::INTERNAL_SERVER_ERROR)
    }

    fn error_response(&self) -> actix_web::HttpResponse {
        actix_web::HttpResponse::build(self.status_code())
            .content_type("application/json")
            .body(self.http_body())
    }
}
