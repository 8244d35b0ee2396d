//! `#[distributed_lock]` on web handlers served over real HTTP on loopback: requests
//! for one key run one at a time, also across two servers with a client each,
//! requests for different keys run together, and a lock that cannot be had is an
//! HTTP status with a JSON body naming the kind of error. Handlers return a
//! `Result` or a response, and stack with the frameworks' own attributes.

use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{LockClient, LockError, LockOptions, distributed_lock};
use lock_tests::RedisServer;
use serde::Deserialize;

use crate::attribute::Overlap;

#[derive(Deserialize)]
struct Order {
    user_id: u64,
}

#[derive(Clone)]
struct Shop {
    locks: LockClient,
    overlap: Arc<Overlap>,
}

/// Sends one order per user id, all at once, to each server in turn, and returns
/// their statuses.
async fn order_all(bases: &[&str], path: &str, user_ids: &[u64]) -> Vec<u16> {
    let http = reqwest::Client::new();
    let requests = user_ids.iter().enumerate().map(|(at, user_id)| {
        let base = bases[at % bases.len()];
        let request = http
            .post(format!("{base}{path}"))
            .json(&serde_json::json!({ "user_id": user_id }));
        tokio::spawn(async move {
            request
                .send()
                .await
                .expect("the server answers")
                .status()
                .as_u16()
        })
    });
    let mut statuses = Vec::new();
    for request in requests.collect::<Vec<_>>() {
        statuses.push(request.await.unwrap());
    }
    statuses
}

async fn shop(redis: &RedisServer) -> Shop {
    Shop {
        locks: LockClient::connect(&redis.url()).await.unwrap(),
        overlap: Arc::default(),
    }
}

/// Two shops on one Redis, each with a client of its own, counting into one
/// `Overlap`: two instances of one service.
async fn two_shops(redis: &RedisServer) -> (Shop, Shop) {
    let first = shop(redis).await;
    let second = Shop {
        locks: LockClient::connect(&redis.url()).await.unwrap(),
        overlap: first.overlap.clone(),
    };
    (first, second)
}

/// Posts an order for `user_id` and returns the status, `Retry-After` and body.
async fn order(base: &str, path: &str, user_id: u64) -> (u16, Option<String>, String) {
    let response = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(&serde_json::json!({ "user_id": user_id }))
        .send()
        .await
        .expect("the server answers");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|value| value.to_str().unwrap().to_owned());
    (status, retry_after, response.text().await.unwrap())
}

mod on_axum {
    use axum::Json;
    use axum::extract::State;
    use axum::response::{IntoResponse, Response};

    use super::*;

    #[distributed_lock(
        client = "shop.locks",
        prefix = "order",
        keys = "order.user_id",
        timeout_ms = 10_000
    )]
    async fn create_order(
        State(shop): State<Shop>,
        Json(order): Json<Order>,
    ) -> Result<Json<u64>, LockError> {
        shop.overlap.section(Duration::from_millis(50)).await;
        Ok(Json(order.user_id))
    }

    #[distributed_lock(
        client = "shop.locks",
        prefix = "order",
        keys = "order.user_id",
        spin = false
    )]
    async fn create_order_now(
        State(shop): State<Shop>,
        Json(order): Json<Order>,
    ) -> Result<Json<u64>, LockError> {
        Ok(Json(order.user_id))
    }

    #[axum::debug_handler]
    #[distributed_lock(
        client = "shop.locks",
        prefix = "order",
        keys(order.user_id),
        timeout_ms = 10_000
    )]
    async fn create_order_response(
        State(shop): State<Shop>,
        Json(order): Json<Order>,
    ) -> impl IntoResponse {
        shop.overlap.section(Duration::from_millis(50)).await;
        Json(order.user_id)
    }

    #[distributed_lock(client = "shop.locks", prefix = "order", keys(order.user_id), spin = false)]
    #[axum::debug_handler]
    async fn create_order_response_now(
        State(shop): State<Shop>,
        Json(order): Json<Order>,
    ) -> Response {
        Json(order.user_id).into_response()
    }

    async fn serve(shop: Shop) -> String {
        let app = axum::Router::new()
            .route("/orders", axum::routing::post(create_order))
            .route("/orders/now", axum::routing::post(create_order_now))
            .route("/responses", axum::routing::post(create_order_response))
            .route(
                "/responses/now",
                axum::routing::post(create_order_response_now),
            )
            .with_state(shop);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        base
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_key_runs_one_at_a_time_and_different_keys_together() {
        let redis = RedisServer::start();
        let same_key = shop(&redis).await;
        let base = serve(same_key.clone()).await;
        assert_eq!(order_all(&[&base], "/orders", &[42; 8]).await, [200; 8]);
        assert_eq!(
            same_key.overlap.most(),
            1,
            "two requests for one user ran at once"
        );

        let many_keys = shop(&redis).await;
        let base = serve(many_keys.clone()).await;
        assert_eq!(
            order_all(&[&base], "/orders", &[1, 2, 3, 4, 5, 6, 7, 8]).await,
            [200; 8]
        );
        assert!(
            many_keys.overlap.most() > 1,
            "requests for different users ran one at a time"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_lock_is_423_and_an_unreachable_redis_503() {
        let mut redis = RedisServer::start();
        let shop = shop(&redis).await;
        let base = serve(shop.clone()).await;
        let held = shop
            .locks
            .acquire("order:7", &LockOptions::new())
            .await
            .unwrap();
        let http = reqwest::Client::new();
        let busy = tokio::spawn({
            let request = http
                .post(format!("{base}/orders/now"))
                .json(&serde_json::json!({ "user_id": 7 }));
            async move { request.send().await.unwrap() }
        })
        .await
        .unwrap();
        assert_eq!(busy.status().as_u16(), 423);
        assert_eq!(busy.headers()["retry-after"], "1");
        assert_eq!(busy.text().await.unwrap(), r#"{"error":"busy"}"#);
        held.release().await.unwrap();

        redis.kill();
        let down = http
            .post(format!("{base}/orders/now"))
            .json(&serde_json::json!({ "user_id": 7 }))
            .send()
            .await
            .unwrap();
        assert_eq!(down.status().as_u16(), 503);
        assert_eq!(down.headers()["retry-after"], "1");
        assert_eq!(
            down.text().await.unwrap(),
            r#"{"error":"backend"}"#,
            "no key, host or Redis error text reaches the caller"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_returning_a_response_holds_the_lock_across_two_clients() {
        let redis = RedisServer::start();
        let (first, second) = two_shops(&redis).await;
        let servers = [serve(first.clone()).await, serve(second.clone()).await];
        let bases = [servers[0].as_str(), servers[1].as_str()];
        assert_eq!(order_all(&bases, "/responses", &[42; 8]).await, [200; 8]);
        assert_eq!(
            first.overlap.most(),
            1,
            "two requests for one user ran at once on two servers"
        );

        let held = first
            .locks
            .acquire("order:7", &LockOptions::new())
            .await
            .unwrap();
        let busy = order(bases[1], "/responses/now", 7).await;
        assert_eq!(
            busy,
            (423, Some("1".to_owned()), r#"{"error":"busy"}"#.to_owned())
        );
        held.release().await.unwrap();
        assert_eq!(order(bases[1], "/responses/now", 7).await.0, 200);
    }
}

mod on_actix {
    use actix_web::HttpResponse;
    use actix_web::web::{Data, Json};

    use super::*;

    #[distributed_lock(
        client = "shop.locks",
        prefix = "order",
        keys = "order.user_id",
        timeout_ms = 10_000
    )]
    async fn create_order(shop: Data<Shop>, order: Json<Order>) -> Result<Json<u64>, LockError> {
        shop.overlap.section(Duration::from_millis(50)).await;
        Ok(Json(order.user_id))
    }

    #[distributed_lock(
        client = "shop.locks",
        prefix = "order",
        keys = "order.user_id",
        spin = false
    )]
    async fn create_order_now(
        shop: Data<Shop>,
        order: Json<Order>,
    ) -> Result<Json<u64>, LockError> {
        Ok(Json(order.user_id))
    }

    #[actix_web::post("/responses")]
    #[distributed_lock(
        client = "shop.locks",
        prefix = "order",
        keys(order.user_id),
        timeout_ms = 10_000
    )]
    async fn create_order_response(shop: Data<Shop>, order: Json<Order>) -> HttpResponse {
        shop.overlap.section(Duration::from_millis(50)).await;
        HttpResponse::Ok().json(order.user_id)
    }

    #[actix_web::post("/responses/now")]
    #[distributed_lock(client = "shop.locks", prefix = "order", keys(order.user_id), spin = false)]
    async fn create_order_response_now(shop: Data<Shop>, order: Json<Order>) -> HttpResponse {
        HttpResponse::Ok().json(order.user_id)
    }

    /// An Actix server on its own thread and runtime, stopped when dropped.
    struct Server {
        base: String,
        handle: actix_web::dev::ServerHandle,
    }

    impl Drop for Server {
        fn drop(&mut self) {
            drop(self.handle.stop(false));
        }
    }

    fn serve(shop: Shop) -> Server {
        let (sender, receiver) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            actix_web::rt::System::new().block_on(async move {
                let server = actix_web::HttpServer::new(move || {
                    actix_web::App::new()
                        .app_data(Data::new(shop.clone()))
                        .route("/orders", actix_web::web::post().to(create_order))
                        .route("/orders/now", actix_web::web::post().to(create_order_now))
                        .service(create_order_response)
                        .service(create_order_response_now)
                })
                .workers(2)
                .bind(("127.0.0.1", 0))
                .unwrap();
                let base = format!("http://{}", server.addrs()[0]);
                let server = server.run();
                sender.send((base, server.handle())).unwrap();
                server.await
            })
        });
        let (base, handle) = receiver.recv().unwrap();
        Server { base, handle }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_key_runs_one_at_a_time_and_different_keys_together() {
        let redis = RedisServer::start();
        let same_key = shop(&redis).await;
        let server = serve(same_key.clone());
        assert_eq!(
            order_all(&[&server.base], "/orders", &[42; 8]).await,
            [200; 8]
        );
        assert_eq!(
            same_key.overlap.most(),
            1,
            "two requests for one user ran at once"
        );

        let many_keys = shop(&redis).await;
        let server = serve(many_keys.clone());
        assert_eq!(
            order_all(&[&server.base], "/orders", &[1, 2, 3, 4, 5, 6, 7, 8]).await,
            [200; 8]
        );
        assert!(
            many_keys.overlap.most() > 1,
            "requests for different users ran one at a time"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_lock_is_423_with_only_the_kind_of_error() {
        let redis = RedisServer::start();
        let shop = shop(&redis).await;
        let server = serve(shop.clone());
        let held = shop
            .locks
            .acquire("order:7", &LockOptions::new())
            .await
            .unwrap();
        let busy = reqwest::Client::new()
            .post(format!("{}/orders/now", server.base))
            .json(&serde_json::json!({ "user_id": 7 }))
            .send()
            .await
            .unwrap();
        assert_eq!(busy.status().as_u16(), 423);
        assert_eq!(busy.headers()["retry-after"], "1");
        assert_eq!(busy.text().await.unwrap(), r#"{"error":"busy"}"#);
        held.release().await.unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_handler_returning_a_response_holds_the_lock_across_two_clients() {
        let redis = RedisServer::start();
        let (first, second) = two_shops(&redis).await;
        let servers = [serve(first.clone()), serve(second.clone())];
        let bases = [servers[0].base.as_str(), servers[1].base.as_str()];
        assert_eq!(order_all(&bases, "/responses", &[42; 8]).await, [200; 8]);
        assert_eq!(
            first.overlap.most(),
            1,
            "two requests for one user ran at once on two servers"
        );

        let held = first
            .locks
            .acquire("order:7", &LockOptions::new())
            .await
            .unwrap();
        let busy = order(bases[1], "/responses/now", 7).await;
        assert_eq!(
            busy,
            (423, Some("1".to_owned()), r#"{"error":"busy"}"#.to_owned())
        );
        held.release().await.unwrap();
        assert_eq!(order(bases[1], "/responses/now", 7).await.0, 200);
    }
}
