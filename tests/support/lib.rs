//! Test support on real processes: `redis-server`s on free loopback ports, and a
//! loopback TCP proxy that can stall or cut a client's connection.
//!
//! Nothing here talks to a Redis it did not start.

mod proxy;
mod server;

pub use proxy::TcpProxy;
pub use server::RedisServer;
