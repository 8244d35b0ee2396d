//! Test support on real processes: servers (`redis-server`, or the binary that
//! `LOCK_TEST_SERVER` names, such as `valkey-server`) on free loopback ports (alone, as
//! a Cluster, or watched by Sentinels; in the clear, or over TLS with a CA made at
//! test time), and loopback TCP proxies that stall, cut or count a client's traffic.
//!
//! Nothing here talks to a Redis it did not start.

mod cluster;
mod counting;
mod proxy;
mod sentinel;
mod server;
mod tls;

pub use cluster::{RedisCluster, Shard};
pub use counting::{CommandCounts, CountingProxy};
pub use proxy::TcpProxy;
pub use sentinel::SentinelGroup;
pub use server::{
    Monitor, RedisServer, SERVER_VARIABLE, ServerVersion, binary_serves_tls, server_binary,
};
pub use tls::TestCa;
