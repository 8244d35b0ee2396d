//! The behaviour suite: one binary, one module per concern, against real
//! `redis-server`s started by `lock_tests` (and the memory backend where it applies).

mod attribute;
mod behaviour;
mod chaos;
mod cluster;
mod connection;
mod crash;
mod everyday;
mod failover;
mod hand_off;
mod http;
mod lease;
mod multi;
mod observability;
mod operator;
mod outage;
mod ownership;
mod read_write;
mod redlock;
mod renewal;
mod replication;
mod secured;
mod semaphore;
mod sentinel;
mod waiting;
mod window;

/// A connection for the tests' own reads and writes on `redis`.
pub(crate) async fn data(redis: &lock_tests::RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

/// Has tracing ask every live subscriber whether it wants a callsite hit for the
/// first time. While just one dispatcher is registered, tracing-core asks only the
/// hitting thread's own: a library callsite first hit on another test's thread,
/// which has none, would stay off for good for a test's thread-local subscriber.
/// A second dispatcher, registered once and kept, rules that out.
pub(crate) fn ask_every_subscriber() {
    static KEPT: std::sync::LazyLock<tracing::Dispatch> = std::sync::LazyLock::new(|| {
        tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default())
    });
    std::sync::LazyLock::force(&KEPT);
}
