use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::{RedisServer, TestCa};

/// A primary, its replica, and three Sentinels watching them, on loopback ports.
pub struct SentinelGroup {
    pub name: &'static str,
    pub primary: RedisServer,
    pub replica: RedisServer,
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Sentinels declare the primary down after `down_after`.
    pub fn start(down_after: Duration) -> SentinelGroup {
        Self::start_as(down_after, None, None)
    }

    /// Like [`start`](Self::start), with every server and Sentinel requiring
    /// `password`.
    pub fn start_with_password(down_after: Duration, password: &str) -> SentinelGroup {
        Self::start_as(down_after, Some(password), None)
    }

    /// Like [`start`](Self::start), with every server and Sentinel speaking TLS only,
    /// with certificates `ca` signed.
    pub fn start_with_tls(down_after: Duration, ca: &Arc<TestCa>) -> SentinelGroup {
        Self::start_as(down_after, None, Some(ca))
    }

    fn start_as(
        down_after: Duration,
        password: Option<&str>,
        tls: Option<&Arc<TestCa>>,
    ) -> SentinelGroup {
        let name = "locks";
        let server = |args: &[&str]| match (password, tls) {
            (Some(password), _) => RedisServer::start_with_password(password, args),
            (None, Some(ca)) => RedisServer::start_with_tls(ca, args),
            (None, None) => RedisServer::start_with(args),
        };
        let primary = server(&[]);
        let port = primary.port().to_string();
        let replica = server(&["--replicaof", "127.0.0.1", &port]);
        let down_after_ms = down_after.as_millis() as u64;
        let sentinels = (0..3)
            .map(|_| {
                RedisServer::start_sentinel(name, primary.port(), down_after_ms, password, tls)
            })
            .collect();
        let group = SentinelGroup {
            name,
            primary,
            replica,
            sentinels,
        };
        group.wait_until_watching();
        group
    }

    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::url).collect()
    }

    /// The port of the primary the Sentinels name now.
    pub fn primary_port(&self) -> u16 {
        let address: Vec<String> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(self.name)
            .query(&mut self.sentinels[0].connection())
            .expect("SENTINEL GET-MASTER-ADDR-BY-NAME");
        address[1].parse().expect("a port")
    }

    /// Waits until the Sentinels name another primary than `old_port`.
    pub fn wait_for_failover(&self, old_port: u16, at_most: Duration) {
        let started = Instant::now();
        while self.primary_port() == old_port {
            assert!(
                started.elapsed() < at_most,
                "no failover within {at_most:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the replica is in sync and every Sentinel knows it and the others.
    fn wait_until_watching(&self) {
        let started = Instant::now();
        loop {
            let ready = self.sentinels.iter().all(|sentinel| {
                let mut connection = sentinel.connection();
                let primary: Vec<(String, String)> = redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(self.name)
                    .query::<Vec<String>>(&mut connection)
                    .map(|fields| {
                        fields
                            .chunks(2)
                            .map(|pair| (pair[0].clone(), pair[1].clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                let field = |name: &str| {
                    primary
                        .iter()
                        .find(|(key, _)| key == name)
                        .map(|(_, value)| value.clone())
                        .unwrap_or_default()
                };
                field("num-slaves") == "1" && field("num-other-sentinels") == "2"
            });
            let synced: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut self.replica.connection())
                .expect("INFO replication");
            if ready && synced.contains("master_link_status:up") {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the Sentinels did not settle"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
