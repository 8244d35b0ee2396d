//! Handlers that return a response instead of a `Result`: a lock error becomes the
//! response (423 when busy), and the body's value is the response otherwise.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};

#[derive(Clone)]
struct App {
    locks: LockClient,
}

#[distributed_lock(client = "app.locks", prefix = "stock", keys(sku), spin = false)]
async fn axum_opaque(
    axum::extract::State(app): axum::extract::State<App>,
    axum::extract::Path(sku): axum::extract::Path<u64>,
) -> impl IntoResponse {
    if sku == 0 {
        return (StatusCode::NOT_FOUND, "no such sku");
    }
    (StatusCode::OK, "reserved")
}

#[distributed_lock(client = "app.locks", prefix = "stock", keys(sku), spin = false)]
async fn axum_response(
    axum::extract::State(app): axum::extract::State<App>,
    axum::extract::Path(sku): axum::extract::Path<u64>,
) -> Response {
    format!("reserved {sku}").into_response()
}

#[distributed_lock(client = "app.locks", prefix = "stock", keys(sku), spin = false)]
async fn axum_opaque_ok(
    axum::extract::State(app): axum::extract::State<App>,
    axum::extract::Path(sku): axum::extract::Path<u64>,
) -> Result<impl IntoResponse, LockError> {
    let elsewhere = app.locks.is_locked("stock:unrelated").await?;
    Ok(axum::Json((sku, elsewhere)))
}

#[distributed_lock(client = "app.locks", prefix = "stock", keys(sku), spin = false)]
async fn actix_response(
    app: actix_web::web::Data<App>,
    sku: actix_web::web::Path<u64>,
) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().body(format!("reserved {sku}"))
}

#[distributed_lock(client = "app.locks", prefix = "stock", keys(*sku), spin = false)]
async fn actix_opaque_ok(
    app: actix_web::web::Data<App>,
    sku: actix_web::web::Path<u64>,
) -> Result<impl actix_web::Responder, LockError> {
    Ok(format!("reserved {sku}"))
}

fn assert_send<T: Send>(_: T) {}

async fn status(response: impl IntoResponse) -> u16 {
    response.into_response().status().as_u16()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let app = App {
        locks: LockClient::memory(),
    };
    let _: axum::Router = axum::Router::new()
        .route("/a/{sku}", axum::routing::post(axum_opaque))
        .route("/b/{sku}", axum::routing::post(axum_response))
        .route("/c/{sku}", axum::routing::post(axum_opaque_ok))
        .with_state(app.clone());
    let _ = actix_web::web::post().to(actix_response);
    let _ = actix_web::web::post().to(actix_opaque_ok);
    assert_send(axum_opaque(
        axum::extract::State(app.clone()),
        axum::extract::Path(1),
    ));

    let call = |sku| {
        axum_opaque(
            axum::extract::State(app.clone()),
            axum::extract::Path(sku),
        )
    };
    assert_eq!(status(call(1).await).await, 200);
    assert_eq!(status(call(0).await).await, 404, "the body's early return");
    let held = app
        .locks
        .acquire("stock:1", &LockOptions::new())
        .await
        .unwrap();
    assert_eq!(status(call(1).await).await, 423, "the lock error as a response");
    let response = axum_response(axum::extract::State(app.clone()), axum::extract::Path(1)).await;
    assert_eq!(response.status().as_u16(), 423);
    let response = actix_response(
        actix_web::web::Data::new(app.clone()),
        actix_web::web::Path::from(1),
    )
    .await;
    assert_eq!(response.status().as_u16(), 423);
    held.release().await.unwrap();
    let response = actix_response(
        actix_web::web::Data::new(app.clone()),
        actix_web::web::Path::from(1),
    )
    .await;
    assert_eq!(response.status().as_u16(), 200);
}
