use std::time::{Duration, Instant};

use std::sync::Arc;

use crate::{RedisServer, TestCa};

/// A primary, its replica, and three Sentinels watching them, on loopback ports.
pub struct SentinelGroup {
    pub name: &'static str,
    pub primary: RedisServer,
    pub replica: RedisServer,
    /// Replicas beyond `replica`: none unless started by
    /// [`start_with_replicas`](Self::start_with_replicas) or
    /// [`start_with_a_replica_left_behind`](Self::start_with_a_replica_left_behind).
    /// The helpers that fail over take `replica` for the one promoted, so they are for
    /// groups without, but for [`switch_over`](Self::switch_over), which takes the one
    /// the Sentinels promote.
    pub more_replicas: Vec<RedisServer>,
    pub sentinels: Vec<RedisServer>,
}

impl SentinelGroup {
    /// Sentinels declare the primary down after `down_after`.
    pub fn start(down_after: Duration) -> SentinelGroup {
        Self::start_as(down_after, &[], None, None)
    }

    /// Like [`start`](Self::start), with `replicas` replicas (at least 1).
    pub fn start_with_replicas(down_after: Duration, replicas: usize) -> SentinelGroup {
        let more = vec![&[][..]; replicas.saturating_sub(1)];
        Self::start_as(down_after, &more, None, None)
    }

    /// Like [`start`](Self::start), with a second replica that the Sentinels can
    /// neither promote (`replica-priority 0`) nor move to another primary (its
    /// `REPLICAOF` and `SLAVEOF` renamed): through a failover it stays linked to the
    /// old primary, and acknowledges what that one writes until they demote it.
    pub fn start_with_a_replica_left_behind(down_after: Duration) -> SentinelGroup {
        let left_behind = [
            "--replica-priority",
            "0",
            "--rename-command",
            "REPLICAOF",
            "left-behind-replicaof",
            "--rename-command",
            "SLAVEOF",
            "left-behind-slaveof",
        ];
        Self::start_as(down_after, &[&left_behind], None, None)
    }

    /// Like [`start`](Self::start), with every server and Sentinel requiring
    /// `password`.
    pub fn start_with_password(down_after: Duration, password: &str) -> SentinelGroup {
        Self::start_as(down_after, &[], Some(password), None)
    }

    /// Like [`start`](Self::start), with every server and Sentinel speaking TLS only,
    /// with certificates `ca` signed.
    pub fn start_with_tls(down_after: Duration, ca: &Arc<TestCa>) -> SentinelGroup {
        Self::start_as(down_after, &[], None, Some(ca))
    }

    /// With `replica`, and one replica more for each of `more_replicas`, started with
    /// those arguments.
    fn start_as(
        down_after: Duration,
        more_replicas: &[&[&str]],
        password: Option<&str>,
        tls: Option<&Arc<TestCa>>,
    ) -> SentinelGroup {
        let name = "locks";
        let server = |args: &[&str]| match (password, tls) {
            (Some(password), _) => RedisServer::start_with_password(password, args),
            (None, Some(ca)) => RedisServer::start_with_tls(ca, args),
            (None, None) => RedisServer::start_with(args),
        };
        // A replica that lost its link syncs again at once, not after the 5 s
        // a diskless primary waits for more replicas by default.
        let quick_sync = ["--repl-diskless-sync-delay", "0"];
        let primary = server(&quick_sync);
        let port = primary.port().to_string();
        let replica_of_primary = ["--replicaof", "127.0.0.1", &port];
        let replica =
            |args: &[&str]| server(&[&quick_sync[..], &replica_of_primary, args].concat());
        let (replica, more_replicas) = (
            replica(&[]),
            more_replicas.iter().map(|args| replica(args)).collect(),
        );
        let down_after_ms = down_after.as_millis() as u64;
        let sentinels = (0..3)
            .map(|_| {
                RedisServer::start_sentinel(name, primary.port(), down_after_ms, password, tls)
            })
            .collect();
        let mut group = SentinelGroup {
            name,
            primary,
            replica,
            more_replicas,
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
        self.primary_port_named_by(0)
    }

    /// The port of the primary the Sentinel at `index` names now: for when another
    /// is frozen.
    pub fn primary_port_named_by(&self, index: usize) -> u16 {
        primary_named_by(&self.sentinels[index], self.name).expect("the Sentinel names a primary")
    }

    /// The server the Sentinels name the primary now.
    pub fn named_primary(&self) -> &RedisServer {
        let port = self.primary_port();
        self.servers()
            .find(|server| server.port() == port)
            .expect("the Sentinels name one of the group's servers")
    }

    /// The primary and the replicas.
    pub fn servers(&self) -> impl Iterator<Item = &RedisServer> {
        std::iter::once(&self.primary).chain(self.replicas())
    }

    /// `replica` and `more_replicas`.
    pub fn replicas(&self) -> impl Iterator<Item = &RedisServer> {
        std::iter::once(&self.replica).chain(&self.more_replicas)
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

    /// Cuts the replica off: freezes it (`SIGSTOP`) and makes the primary drop its
    /// link, so that nothing written from now on reaches it, until
    /// [`reconnect_replica`](Self::reconnect_replica) or, after the primary is
    /// killed, [`promote_replica`](Self::promote_replica).
    ///
    /// A failover the Sentinels made on their own since the last fault (a primary
    /// slow to answer on a loaded machine) is followed first, so that what is cut
    /// off is the replica.
    pub fn cut_off_replica(&mut self) {
        self.follow_the_sentinels();
        self.replica.freeze();
        self.primary.drop_replica_links();
    }

    /// Thaws a replica that was cut off and waits until it is in sync again.
    pub fn reconnect_replica(&self) {
        self.replica.thaw();
        self.replica.wait_until_in_sync(Duration::from_secs(10));
    }

    /// `SIGKILL`s the primary: whatever its replica does not have is gone.
    pub fn kill_primary(&mut self) {
        self.primary.kill();
    }

    /// After [`kill_primary`](Self::kill_primary): thaws the replica if it was cut
    /// off, waits until every Sentinel names it the primary and it serves as one,
    /// and then swaps `primary` and `replica`, so that `replica` is the dead old
    /// primary.
    pub fn promote_replica(&mut self, at_most: Duration) {
        self.replica.thaw();
        let started = Instant::now();
        let port = self.replica.port();
        loop {
            let named = self
                .sentinels
                .iter()
                .all(|sentinel| primary_named_by(sentinel, self.name) == Some(port));
            if named && self.replica.role() == "master" {
                break;
            }
            assert!(
                started.elapsed() < at_most,
                "the Sentinels did not promote the replica within {at_most:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::mem::swap(&mut self.primary, &mut self.replica);
    }

    /// After [`promote_replica`](Self::promote_replica): starts the old primary
    /// again, on its port and with nothing of its old data, as a replica of the new
    /// primary, and waits until it is in sync and every Sentinel sees it up. The
    /// Sentinels would make it a replica by themselves, but only after 8 s.
    ///
    /// Until it is in sync, the Sentinels may fail over to it, empty, if the new
    /// primary is slow for `down_after` on a loaded machine; then it is the primary.
    pub fn restore_old_primary(&mut self) {
        self.replica.restart();
        let () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(self.primary.port())
            .query(&mut self.replica.connection())
            .expect("REPLICAOF");
        self.wait_until_watching();
    }

    /// A planned failover, as an operator makes one before maintenance: `SENTINEL
    /// FAILOVER` promotes a replica while the primary lives on, answering as one
    /// until the Sentinels demote it, seconds later, and drop its clients. Waits
    /// until then, and until the old primary replicates the new one in sync, and
    /// takes the promoted replica for the primary.
    pub fn switch_over(&mut self) {
        self.begin_switch_over();
        assert!(self.take_promoted(), "every Sentinel names a replica");
        self.wait_until_watching();
    }

    /// `SENTINEL FAILOVER`, until every Sentinel names a replica the primary: the
    /// old primary still answers as one then, for seconds.
    pub fn begin_switch_over(&self) {
        let old_port = self.primary.port();
        let () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(self.name)
            .query(&mut self.sentinels[0].connection())
            .expect("SENTINEL FAILOVER");
        let started = Instant::now();
        while (0..self.sentinels.len()).any(|index| self.primary_port_named_by(index) == old_port) {
            assert!(
                started.elapsed() < Duration::from_secs(30),
                "the Sentinels did not switch over from port {old_port} within 30 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A whole failover: kills the primary, waits for the Sentinels to promote the
    /// replica, and brings the old primary back as its replica.
    pub fn fail_over(&mut self) {
        self.kill_primary();
        self.promote_replica(Duration::from_secs(30));
        self.restore_old_primary();
    }

    /// Waits until the replicas are in sync and every Sentinel knows them, up, and the
    /// other Sentinels. Sentinels read a replica's state every 10 s, so on a loaded
    /// machine this can take most of a minute.
    ///
    /// On a loaded machine a primary slow to answer for `down_after` is failed over
    /// too: when every Sentinel names the replica, it is the primary from then on.
    fn wait_until_watching(&mut self) {
        let started = Instant::now();
        loop {
            self.follow_the_sentinels();
            let views: Vec<SentinelView> = self
                .sentinels
                .iter()
                .map(|sentinel| self.view_of(sentinel))
                .collect();
            let linked = self.replicas().all(|replica| {
                let synced: String = replica.ask_through_reconfiguring(&["INFO", "replication"]);
                synced.contains("master_link_status:up")
            });
            if linked && views.iter().all(SentinelView::ready) {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "the Sentinels did not settle within 60 s: replica linked {linked}, \
                 Sentinels saw {views:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Takes a replica for the primary once every Sentinel names it: they failed
    /// over on their own. They make the old primary a replica themselves, after a
    /// few seconds, and drop its clients as they do (`CLIENT KILL`), so that the
    /// clients find the new primary; a `REPLICAOF` from here would leave them
    /// writing to a replica.
    fn follow_the_sentinels(&mut self) {
        let old_port = self.primary.port();
        if self.take_promoted() {
            eprintln!(
                "the Sentinels failed over from port {old_port} to {} on their own",
                self.primary.port()
            );
        }
    }

    /// Takes the replica every Sentinel names for the primary, if one is named, and
    /// says whether one was.
    fn take_promoted(&mut self) -> bool {
        let (sentinels, name) = (&self.sentinels, self.name);
        let named = |replica: &&mut RedisServer| {
            let port = Some(replica.port());
            sentinels
                .iter()
                .all(|sentinel| primary_named_by(sentinel, name) == port)
        };
        let mut replicas = std::iter::once(&mut self.replica).chain(&mut self.more_replicas);
        let Some(promoted) = replicas.find(named) else {
            return false;
        };
        std::mem::swap(&mut self.primary, promoted);
        true
    }

    /// What `sentinel` knows of this group.
    fn view_of(&self, sentinel: &RedisServer) -> SentinelView {
        let mut connection = sentinel.connection();
        let primary: Vec<String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(self.name)
            .query(&mut connection)
            .unwrap_or_default();
        let field = |fields: &[String], name: &str| {
            fields
                .chunks(2)
                .find(|pair| pair[0] == name)
                .map(|pair| pair[1].clone())
                .unwrap_or_default()
        };
        let replicas: Vec<Vec<String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg(self.name)
            .query(&mut connection)
            .unwrap_or_default();
        let listed = self
            .replicas()
            .map(|replica| {
                let port = replica.port().to_string();
                let fields = replicas
                    .iter()
                    .find(|fields| field(fields, "port") == port)?;
                Some((field(fields, "flags"), field(fields, "master-port")))
            })
            .collect();
        SentinelView {
            replicas: field(&primary, "num-slaves"),
            other_sentinels: field(&primary, "num-other-sentinels"),
            listed,
            primary_named: primary_named_by(sentinel, self.name),
            primary_port: self.primary.port(),
        }
    }
}

/// One Sentinel's view of the group, as `wait_until_watching` reads it.
#[derive(Debug)]
struct SentinelView {
    replicas: String,
    other_sentinels: String,
    /// Each of the group's replicas as the Sentinel lists it: its flags and its
    /// primary's port.
    listed: Vec<Option<(String, String)>>,
    primary_named: Option<u16>,
    primary_port: u16,
}

impl SentinelView {
    fn ready(&self) -> bool {
        let primary_port = self.primary_port.to_string();
        self.replicas == self.listed.len().to_string()
            && self.other_sentinels == "2"
            && self.listed.iter().all(|listed| {
                listed
                    .as_ref()
                    .is_some_and(|(flags, of)| flags == "slave" && *of == primary_port)
            })
            && self.primary_named == Some(self.primary_port)
    }
}

/// The port of the primary that `sentinel` names for `name`.
fn primary_named_by(sentinel: &RedisServer, name: &str) -> Option<u16> {
    let address: Option<Vec<String>> = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(name)
        .query(&mut sentinel.connection())
        .expect("SENTINEL GET-MASTER-ADDR-BY-NAME");
    address.map(|address| address[1].parse().expect("a port"))
}
