use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::{RedisServer, TestCa};

/// A Redis Cluster of three primaries with a replica each, on loopback ports, made
/// with `redis-cli --cluster create`. Its servers stop when it is dropped.
pub struct RedisCluster {
    pub servers: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_as(None, None)
    }

    /// Like [`start`](Self::start), with every node requiring `password`.
    pub fn start_with_password(password: &str) -> RedisCluster {
        Self::start_as(Some(password), None)
    }

    /// Like [`start`](Self::start), with every node speaking TLS only (the Cluster
    /// bus too), with certificates `ca` signed.
    pub fn start_with_tls(ca: &Arc<TestCa>) -> RedisCluster {
        Self::start_as(None, Some(ca))
    }

    fn start_as(password: Option<&str>, tls: Option<&Arc<TestCa>>) -> RedisCluster {
        let config = ["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"];
        let server = || match (password, tls) {
            (Some(password), _) => RedisServer::start_with_password(password, &config),
            (None, Some(ca)) => {
                let config: Vec<&str> = config
                    .iter()
                    .chain(&["--tls-cluster", "yes"])
                    .copied()
                    .collect();
                RedisServer::start_with_tls(ca, &config)
            }
            (None, None) => RedisServer::start_with(&config),
        };
        let servers: Vec<RedisServer> = (0..6).map(|_| server()).collect();
        let mut create = Command::new("redis-cli");
        if let Some(password) = password {
            create.arg("--no-auth-warning").arg("-a").arg(password);
        }
        if let Some(ca) = tls {
            create.arg("--tls").arg("--cacert").arg(ca.file("ca.crt"));
        }
        create.arg("--cluster").arg("create");
        for server in &servers {
            create.arg(format!("127.0.0.1:{}", server.port()));
        }
        let created = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .output()
            .expect("run redis-cli (Debian package redis-tools)");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = RedisCluster { servers };
        cluster.wait_until_ok();
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The primary that serves `slot`.
    pub fn primary_for(&self, slot: u16) -> &RedisServer {
        let mut connection = self.servers[0].connection();
        let slots: Vec<(u16, u16, Vec<redis::Value>)> = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut connection)
            .map(|ranges: Vec<Vec<redis::Value>>| {
                ranges
                    .into_iter()
                    .map(|mut range| {
                        let nodes = range.split_off(2);
                        let bound = |value: &redis::Value| match value {
                            redis::Value::Int(n) => *n as u16,
                            other => panic!("unexpected slot bound {other:?}"),
                        };
                        (bound(&range[0]), bound(&range[1]), nodes)
                    })
                    .collect()
            })
            .expect("CLUSTER SLOTS");
        let port = slots
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))
            .and_then(|(_, _, nodes)| match nodes.first() {
                Some(redis::Value::Array(node)) => match node.get(1) {
                    Some(redis::Value::Int(port)) => Some(*port as u16),
                    _ => None,
                },
                _ => None,
            })
            .expect("every slot is served");
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .expect("a server of ours")
    }

    /// The primaries, in no particular order.
    pub fn primaries(&self) -> Vec<&RedisServer> {
        self.servers
            .iter()
            .filter(|server| {
                let role: Vec<redis::Value> = redis::cmd("ROLE")
                    .query(&mut server.connection())
                    .expect("ROLE");
                matches!(role.first(), Some(redis::Value::BulkString(role)) if role == b"master")
            })
            .collect()
    }

    /// Moves `slot`, with its keys, to the primary `to`, the way resharding does:
    /// IMPORTING and MIGRATING, MIGRATE key by key, then the new owner everywhere.
    /// Clients see ASK redirections during the move and MOVED after it.
    pub fn migrate_slot(&self, slot: u16, to: &RedisServer) {
        let from = self.primary_for(slot);
        let id = |server: &RedisServer| -> String {
            redis::cmd("CLUSTER")
                .arg("MYID")
                .query(&mut server.connection())
                .expect("CLUSTER MYID")
        };
        let (from_id, to_id) = (id(from), id(to));
        let setslot = |server: &RedisServer, state: &str, node: &str| {
            let () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(node)
                .query(&mut server.connection())
                .expect("CLUSTER SETSLOT");
        };
        setslot(to, "IMPORTING", &from_id);
        setslot(from, "MIGRATING", &to_id);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(10)
                .query(&mut from.connection())
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to.port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut from.connection())
                .expect("MIGRATE");
            std::thread::sleep(Duration::from_millis(20));
        }
        for primary in self.primaries() {
            setslot(primary, "NODE", &to_id);
        }
    }

    fn wait_until_ok(&self) {
        let started = Instant::now();
        for server in &self.servers {
            loop {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut server.connection())
                    .expect("CLUSTER INFO");
                if info.contains("cluster_state:ok") {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the cluster did not come up: {info}"
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
