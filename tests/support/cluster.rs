use std::process::Command;
use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::{RedisServer, TestCa};

/// A Redis Cluster of three primaries, each with a replica unless started without, on
/// loopback ports, made with `redis-cli --cluster create`. Its servers stop when it
/// is dropped.
pub struct RedisCluster {
    pub servers: Vec<RedisServer>,
    /// Whether every primary has a replica, as `wait_until_ok` then waits for.
    replicated: bool,
}

/// How each node of a cluster of ours runs. A replica that lost its link syncs again
/// at once, not after the 5 s a diskless primary waits for more replicas by default.
const NODE_CONFIG: [&str; 6] = [
    "--cluster-enabled",
    "yes",
    "--cluster-node-timeout",
    "2000",
    "--repl-diskless-sync-delay",
    "0",
];

/// A primary and its replica, by their places in [`RedisCluster::servers`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub primary: usize,
    pub replica: usize,
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        Self::start_as(None, None, 1)
    }

    /// Three primaries and no replica, until [`add_replica`](Self::add_replica).
    pub fn start_without_replicas() -> RedisCluster {
        Self::start_as(None, None, 0)
    }

    /// One primary serving every slot, with no replica, as a developer's Cluster
    /// often is. Never having met another node, it does not know its own address, so
    /// it lists itself with an empty one.
    pub fn start_alone() -> RedisCluster {
        let server = RedisServer::start_with(&NODE_CONFIG);
        let () = redis::cmd("CLUSTER")
            .arg("ADDSLOTSRANGE")
            .arg(0)
            .arg(16383)
            .query(&mut server.connection())
            .expect("CLUSTER ADDSLOTSRANGE");
        let cluster = RedisCluster {
            servers: vec![server],
            replicated: false,
        };
        cluster.wait_until_ok();
        cluster
    }

    /// Starts a node and makes it a replica of the primary `servers[primary]`, as an
    /// operator scales a shard out; waits until it is in sync and every node lists
    /// it. Returns its place in `servers`.
    pub fn add_replica(&mut self, primary: usize) -> usize {
        let replica = RedisServer::start_with(&NODE_CONFIG);
        let primary_id = node_id(&self.servers[primary]);
        let added = Command::new("redis-cli")
            .args(["--cluster", "add-node"])
            .arg(format!("127.0.0.1:{}", replica.port()))
            .arg(format!("127.0.0.1:{}", self.servers[primary].port()))
            .args(["--cluster-slave", "--cluster-master-id", &primary_id])
            .output()
            .expect("run redis-cli (Debian package redis-tools)");
        assert!(
            added.status.success(),
            "redis-cli --cluster add-node failed: {}",
            String::from_utf8_lossy(&added.stdout)
        );
        let started = Instant::now();
        while replicating(&replica).as_deref() != Some(primary_id.as_str()) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the new node did not become a replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        replica.wait_until_in_sync(Duration::from_secs(20));
        let address = format!("127.0.0.1:{}@", replica.port());
        for server in &self.servers {
            while !cluster_nodes(server)
                .iter()
                .any(|node| node.address.starts_with(&address) && node.primary == primary_id)
            {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "port {} did not list the new replica",
                    server.port()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        self.servers.push(replica);
        self.servers.len() - 1
    }

    /// Like [`start`](Self::start), with every node requiring `password`.
    pub fn start_with_password(password: &str) -> RedisCluster {
        Self::start_as(Some(password), None, 1)
    }

    /// Like [`start`](Self::start), with every node speaking TLS only (the Cluster
    /// bus too), with certificates `ca` signed.
    pub fn start_with_tls(ca: &Arc<TestCa>) -> RedisCluster {
        Self::start_as(None, Some(ca), 1)
    }

    /// With `replicas` replicas of each of the three primaries.
    fn start_as(
        password: Option<&str>,
        tls: Option<&Arc<TestCa>>,
        replicas: usize,
    ) -> RedisCluster {
        let server = || match (password, tls) {
            (Some(password), _) => RedisServer::start_with_password(password, &NODE_CONFIG),
            (None, Some(ca)) => {
                let config: Vec<&str> = NODE_CONFIG
                    .iter()
                    .chain(&["--tls-cluster", "yes"])
                    .copied()
                    .collect();
                RedisServer::start_with_tls(ca, &config)
            }
            (None, None) => RedisServer::start_with(&NODE_CONFIG),
        };
        let servers: Vec<RedisServer> = (0..3 * (1 + replicas)).map(|_| server()).collect();
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
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("run redis-cli (Debian package redis-tools)");
        assert!(
            created.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&created.stdout)
        );
        let cluster = RedisCluster {
            servers,
            replicated: replicas > 0,
        };
        cluster.wait_until_ok();
        cluster
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The primary that serves `slot`.
    pub fn primary_for(&self, slot: u16) -> &RedisServer {
        let port = slot_owner(&self.servers[0], slot).expect("every slot is served");
        self.servers
            .iter()
            .find(|server| server.port() == port)
            .expect("a server of ours")
    }

    /// The hash slot of `key`.
    pub fn slot_of(&self, key: &str) -> u16 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.servers[0].connection())
            .expect("CLUSTER KEYSLOT")
    }

    /// The primary that serves `slot` and its replica.
    pub fn shard_for(&self, slot: u16) -> Shard {
        let primary_port = slot_owner(&self.servers[0], slot).expect("every slot is served");
        let primary = self
            .servers
            .iter()
            .position(|server| server.port() == primary_port)
            .expect("a server of ours");
        let primary_id = node_id(&self.servers[primary]);
        let replica = self
            .servers
            .iter()
            .position(|server| replicating(server).as_deref() == Some(primary_id.as_str()))
            .expect("the primary has a replica");
        Shard { primary, replica }
    }

    /// Cuts `shard`'s replica off: freezes it (`SIGSTOP`) and makes its primary
    /// drop the link, so that nothing written from now on reaches it.
    pub fn cut_off_replica(&self, shard: Shard) {
        self.servers[shard.replica].freeze();
        self.servers[shard.primary].drop_replica_links();
    }

    /// Waits until every other node flags `failed` (frozen, say) `fail`: from then
    /// on `CLUSTER SLOTS` leaves it out.
    pub fn wait_until_flagged_failed(&self, failed: &RedisServer) {
        let address = format!("127.0.0.1:{}@", failed.port());
        let started = Instant::now();
        for server in self
            .servers
            .iter()
            .filter(|server| server.port() != failed.port())
        {
            loop {
                let flagged = cluster_nodes(server).into_iter().any(|node| {
                    node.address.starts_with(&address) && node.flags.iter().any(|f| f == "fail")
                });
                if flagged {
                    break;
                }
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "port {} was not flagged failed within 30 s",
                    failed.port()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// `SIGKILL`s `shard`'s primary: whatever its replica does not have is gone.
    pub fn kill_primary(&mut self, shard: Shard) {
        self.servers[shard.primary].kill();
    }

    /// After [`kill_primary`](Self::kill_primary): thaws the replica if it was cut
    /// off, and waits until it has taken over `slot` by itself (an automatic
    /// failover, once the other primaries agree that its primary failed) and every
    /// live node serves with it as the slot's owner. Returns the shard as it is
    /// now: the old primary, dead, as its replica.
    pub fn promote_replica(&self, shard: Shard, slot: u16, at_most: Duration) -> Shard {
        self.servers[shard.replica].thaw();
        let promoted = self.wait_until_failed_over(shard.primary, slot, at_most);
        assert_eq!(
            promoted, shard.replica,
            "another node took slot {slot} over"
        );
        Shard {
            primary: shard.replica,
            replica: shard.primary,
        }
    }

    /// Waits until a replica of `servers[old]`, which serves `slot`, has taken it
    /// over, and every node but the old primary (dead or silent) serves with it as
    /// the slot's owner. Returns the new primary's place in `servers`.
    pub fn wait_until_failed_over(&self, old: usize, slot: u16, at_most: Duration) -> usize {
        let started = Instant::now();
        let live = || {
            self.servers
                .iter()
                .enumerate()
                .filter(move |(place, _)| *place != old)
                .map(|(_, server)| server)
        };
        loop {
            let owner = slot_owner(live().next().expect("a live node"), slot);
            let promoted = self
                .servers
                .iter()
                .position(|server| Some(server.port()) == owner)
                .filter(|place| *place != old);
            if let Some(promoted) = promoted
                && self.servers[promoted].role() == "master"
                && live()
                    .all(|server| slot_owner(server, slot) == owner && cluster_state_ok(server))
            {
                return promoted;
            }
            assert!(
                started.elapsed() < at_most,
                "no replica took over slot {slot} within {at_most:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// After [`promote_replica`](Self::promote_replica), with the shard it returned:
    /// starts the old primary again on its port, with nothing of its old data but
    /// its Cluster identity; the Cluster makes it a replica of the new primary.
    /// Waits until it is in sync and every node is fine.
    pub fn restore_old_primary(&mut self, shard: Shard) {
        self.servers[shard.replica].restart();
        self.wait_until_replica_in_sync(shard);
    }

    /// A failover from a silent primary, as when its host stalls or drops off the
    /// network: `shard`'s primary is frozen until its replica has taken `slot` over,
    /// then thawed, and the test waits until it is the new primary's replica, in
    /// sync. Returns the shard as it is now.
    pub fn fail_over_from_silent(&self, shard: Shard, slot: u16) -> Shard {
        let old = &self.servers[shard.primary];
        old.freeze();
        let promoted = self.wait_until_failed_over(shard.primary, slot, Duration::from_secs(30));
        old.thaw();
        let shard = Shard {
            primary: promoted,
            replica: shard.primary,
        };
        self.wait_until_replica_in_sync(shard);
        shard
    }

    /// A planned failover of `shard`, as an operator makes one before maintenance:
    /// `CLUSTER FAILOVER` on the replica, which has the primary pause its writers
    /// until the replica has all it wrote, and then takes `slot` over; the old
    /// primary becomes its replica. Waits until every node serves `slot` from the
    /// new primary and the old one is in sync, and returns the shard as it is now.
    pub fn switch_over(&self, shard: Shard, slot: u16) -> Shard {
        let () = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut self.servers[shard.replica].connection())
            .expect("CLUSTER FAILOVER");
        let shard = self.promote_replica(shard, slot, Duration::from_secs(30));
        self.wait_until_replica_in_sync(shard);
        shard
    }

    /// Waits until `shard`'s replica replicates, in sync, and every node is fine.
    fn wait_until_replica_in_sync(&self, shard: Shard) {
        let old = &self.servers[shard.replica];
        let started = Instant::now();
        while old.role() != "slave" {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the old primary did not become a replica"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        old.wait_until_in_sync(Duration::from_secs(10));
        self.wait_until_ok();
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

    /// Waits until every node serves, knows a replica for every range of slots, and
    /// every replica is in sync.
    fn wait_until_ok(&self) {
        let started = Instant::now();
        for server in &self.servers {
            while !cluster_state_ok(server)
                || (self.replicated && !every_range_has_a_replica(server))
            {
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the cluster did not come up on port {}",
                    server.port()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
            if server.role() == "slave" {
                server.wait_until_in_sync(Duration::from_secs(20));
            }
        }
    }
}

fn cluster_state_ok(server: &RedisServer) -> bool {
    let info: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query(&mut server.connection())
        .expect("CLUSTER INFO");
    info.contains("cluster_state:ok")
}

fn node_id(server: &RedisServer) -> String {
    redis::cmd("CLUSTER")
        .arg("MYID")
        .query(&mut server.connection())
        .expect("CLUSTER MYID")
}

/// The id of the primary `server` replicates, by its own account.
fn replicating(server: &RedisServer) -> Option<String> {
    cluster_nodes(server)
        .into_iter()
        .find(|node| node.flags.iter().any(|flag| flag == "myself"))
        .map(|node| node.primary)
        .filter(|primary| primary != "-")
}

/// A line of `CLUSTER NODES`: `<id> <ip:port@bus port> <flags> <primary id or -> ...`.
struct Node {
    address: String,
    flags: Vec<String>,
    primary: String,
}

/// Every node as `asked` sees it.
fn cluster_nodes(asked: &RedisServer) -> Vec<Node> {
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut asked.connection())
        .expect("CLUSTER NODES");
    nodes
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .filter(|fields| fields.len() > 3)
        .map(|fields| Node {
            address: fields[1].to_owned(),
            flags: fields[2].split(',').map(str::to_owned).collect(),
            primary: fields[3].to_owned(),
        })
        .collect()
}

/// `CLUSTER SLOTS` as `asked` sees it: `[start, end, [ip, port, id], replicas...]`
/// per range of slots.
fn slot_ranges(asked: &RedisServer) -> Vec<Vec<redis::Value>> {
    redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut asked.connection())
        .expect("CLUSTER SLOTS")
}

fn every_range_has_a_replica(asked: &RedisServer) -> bool {
    slot_ranges(asked).iter().all(|range| range.len() > 3)
}

/// The port of the primary that serves `slot`, as `asked` sees the Cluster.
fn slot_owner(asked: &RedisServer, slot: u16) -> Option<u16> {
    let ranges = slot_ranges(asked);
    let number = |value: Option<&redis::Value>| match value {
        Some(redis::Value::Int(number)) => *number as u16,
        other => panic!("CLUSTER SLOTS answered {other:?} for a number"),
    };
    ranges
        .iter()
        .find(|range| (number(range.first())..=number(range.get(1))).contains(&slot))
        .map(|range| match range.get(2) {
            Some(redis::Value::Array(node)) => number(node.get(1)),
            other => panic!("CLUSTER SLOTS answered {other:?} for a node"),
        })
}
