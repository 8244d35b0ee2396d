//! Web handlers: extractor patterns bind the key's names, the client comes from the
//! app state, and the locked fn is still a handler, on actix-web too when its
//! future is not `Send` (`HttpRequest` holds an `Rc`).

use lock_runtime::{LockClient, LockError, distributed_lock};

#[derive(serde::Deserialize)]
struct CreateOrder {
    user_id: u64,
}

#[derive(Clone)]
struct AppState {
    locker: LockClient,
}

#[distributed_lock(client = "state.locker", keys = "req.user_id")]
async fn axum_create_order(
    axum::extract::State(state): axum::extract::State<AppState>,
    axum::Json(req): axum::Json<CreateOrder>,
) -> Result<String, LockError> {
    Ok(format!("order for {}", req.user_id))
}

#[distributed_lock(client = "state.locker", keys = "req.user_id")]
async fn actix_create_order(
    state: actix_web::web::Data<AppState>,
    req: actix_web::web::Json<CreateOrder>,
) -> Result<String, LockError> {
    Ok(format!("order for {}", req.user_id))
}

#[distributed_lock(client = "state.locker", keys = "req.match_info().query(\"id\")")]
async fn actix_cancel_order(
    state: actix_web::web::Data<AppState>,
    req: actix_web::HttpRequest,
) -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().body(format!("cancelled {}", req.match_info().query("id")))
}

fn main() {
    let state = AppState {
        locker: LockClient::memory(),
    };
    let _: axum::Router = axum::Router::new()
        .route("/orders", axum::routing::post(axum_create_order))
        .with_state(state);
    let _ = actix_web::web::post().to(actix_create_order);
    let _ = actix_web::web::delete().to(actix_cancel_order);
}
