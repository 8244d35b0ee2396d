//! The attribute stacked with others, in both orders: `#[tracing::instrument]`,
//! `#[axum::debug_handler]`, and Actix's route macros.

use axum::response::IntoResponse;
use lock_runtime::{LockClient, LockError, distributed_lock};

#[derive(Clone)]
struct App {
    locks: LockClient,
}

#[tracing::instrument(skip(locks))]
#[distributed_lock(client = "locks", keys(id))]
async fn traced_outside(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[distributed_lock(client = "locks", keys(id))]
#[tracing::instrument(skip(locks), err)]
async fn traced_inside(locks: &LockClient, id: u64) -> Result<u64, LockError> {
    Ok(id)
}

#[tracing::instrument(skip(locks))]
#[distributed_lock(client = "locks", keys(id))]
async fn traced_response(locks: &LockClient, id: u64) -> impl IntoResponse {
    id.to_string()
}

#[distributed_lock(client = "locks", keys(id))]
#[tracing::instrument(skip(locks))]
async fn traced_response_inside(locks: &LockClient, id: u64) -> impl IntoResponse {
    id.to_string()
}

#[axum::debug_handler]
#[distributed_lock(client = "app.locks", keys(id))]
async fn checked_outside(
    axum::extract::State(app): axum::extract::State<App>,
    axum::extract::Path(id): axum::extract::Path<u64>,
) -> impl IntoResponse {
    id.to_string()
}

#[distributed_lock(client = "app.locks", keys(id))]
#[axum::debug_handler]
async fn checked_inside(
    axum::extract::State(app): axum::extract::State<App>,
    axum::extract::Path(id): axum::extract::Path<u64>,
) -> Result<String, LockError> {
    Ok(id.to_string())
}

#[actix_web::post("/orders/{id}")]
#[distributed_lock(client = "app.locks", keys(*id))]
async fn routed_outside(
    app: actix_web::web::Data<App>,
    id: actix_web::web::Path<u64>,
) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().body(id.to_string())
}

#[distributed_lock(client = "app.locks", keys(*id))]
#[actix_web::post("/orders/{id}/now")]
async fn routed_inside(
    app: actix_web::web::Data<App>,
    id: actix_web::web::Path<u64>,
) -> Result<String, LockError> {
    Ok(id.to_string())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let locks = LockClient::memory();
    assert_eq!(traced_outside(&locks, 1).await.unwrap(), 1);
    assert_eq!(traced_inside(&locks, 2).await.unwrap(), 2);
    let _ = traced_response(&locks, 3).await.into_response();
    let _ = traced_response_inside(&locks, 4).await.into_response();
    let app = App { locks };
    let _: axum::Router = axum::Router::new()
        .route("/a/{id}", axum::routing::post(checked_outside))
        .route("/b/{id}", axum::routing::post(checked_inside))
        .with_state(app.clone());
    let _ = actix_web::App::new()
        .app_data(actix_web::web::Data::new(app))
        .service(routed_outside);
}
