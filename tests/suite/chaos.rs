//! Chaos: worker processes take fenced, watchdog-renewed locks on a few hot keys
//! while the test pauses them (`SIGSTOP` past their lease), kills them and freezes
//! Redis. No two sections whose holders still believed them held at their end
//! overlap; per key, no token is issued twice and a section that ended before
//! another asked for the lock has the smaller token, lost sections included; and
//! every key makes progress once the faults stop.
//!
//! It runs on every topology that crosses processes: one Redis, a 3+3 Cluster, a
//! Sentinel group and Redlock over 5 masters (the memory store lives in one process,
//! so it has no place here). Freezing Redis means: the server on one Redis; the
//! primary serving the keys' slot on Cluster; the primary on Sentinel, for less than
//! the Sentinels' down-after, since a failover may lose an unreplicated lock by design;
//! a minority, 2 of 5, of the masters on Redlock.
//!
//! At least 10,000 sections by default on one Redis, 5,000 on Cluster and Sentinel,
//! 2,000 on Redlock, and nine faults; `LOCK_CHAOS_SECTIONS=100000` runs more.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::history::{History, Holding};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup};
use tokio::time::Instant;

/// In one hash slot, so that freezing one Cluster primary freezes all of them.
const KEYS: [&str; 3] = ["{chaos}:a", "{chaos}:b", "{chaos}:c"];
const WORKERS: usize = 4;
const TASKS_PER_KEY: usize = 2;
/// Longer than the workers' 300 ms lease, so a paused holder loses its lock.
const FAULT: Duration = Duration::from_millis(600);
/// The longest the test runs; the workers stop by themselves after it too.
const AT_MOST: Duration = Duration::from_secs(150);

/// One critical section as its worker reported it.
#[derive(Debug, Clone)]
struct Section {
    worker: usize,
    key: String,
    token: u64,
    asked: SystemTime,
    from: SystemTime,
    until: SystemTime,
    held: bool,
}

type Sections = Arc<Mutex<Vec<Section>>>;

struct Worker {
    child: Child,
}

impl Worker {
    fn start(number: usize, topology: &[String], sections: &Sections) -> Worker {
        let mut child = Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
            .args([
                KEYS.join(","),
                TASKS_PER_KEY.to_string(),
                AT_MOST.as_millis().to_string(),
            ])
            .args(topology)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a chaos worker");
        let stdout = child.stdout.take().expect("piped");
        let sections = sections.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let section = parse(number, &line);
                sections.lock().unwrap().push(section);
            }
        });
        Worker { child }
    }

    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .arg(signal)
            .arg(self.child.id().to_string())
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill {signal} a chaos worker");
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn parse(worker: usize, line: &str) -> Section {
    let fields: Vec<&str> = line.split(' ').collect();
    let [key, token, asked, from, until, held] = fields[..] else {
        panic!("a chaos worker said {line:?}");
    };
    let time = |nanos: &str| UNIX_EPOCH + Duration::from_nanos(nanos.parse().expect("ns"));
    Section {
        worker,
        key: key.to_owned(),
        token: token.parse().expect("a token"),
        asked: time(asked),
        from: time(from),
        until: time(until),
        held: held == "true",
    }
}

/// Per key: no token twice, and every section's token is above the tokens of all
/// sections that ended before it asked for the lock, whether they kept their
/// lease or not.
fn check_token_order(sections: &[Section]) {
    for key in KEYS {
        let mut by_end: Vec<&Section> = sections.iter().filter(|s| s.key == key).collect();
        by_end.sort_by_key(|section| section.until);
        let mut by_ask = by_end.clone();
        by_ask.sort_by_key(|section| section.asked);
        let mut tokens: Vec<u64> = by_end.iter().map(|section| section.token).collect();
        tokens.sort_unstable();
        if let Some(twice) = tokens.windows(2).find(|pair| pair[0] == pair[1]) {
            panic!("`{key}`: token {} was issued twice", twice[0]);
        }
        let (mut ended, mut highest): (usize, Option<&Section>) = (0, None);
        for section in by_ask {
            while ended < by_end.len() && by_end[ended].until < section.asked {
                if highest.is_none_or(|highest| by_end[ended].token > highest.token) {
                    highest = Some(by_end[ended]);
                }
                ended += 1;
            }
            if let Some(earlier) = highest
                && earlier.token >= section.token
            {
                panic!(
                    "`{key}`: {section:?} asked after {earlier:?} had ended, yet has a token \
                     no larger"
                );
            }
        }
    }
}

fn count(sections: &Sections) -> usize {
    sections.lock().unwrap().len()
}

/// The servers of one topology, kept alive for the run.
enum Servers {
    Redis(RedisServer),
    Cluster(RedisCluster),
    Sentinel(SentinelGroup),
    Redlock(Vec<RedisServer>),
}

impl Servers {
    /// The worker's arguments that name this topology.
    fn worker_args(&self) -> Vec<String> {
        let list = |servers: &[RedisServer]| {
            servers
                .iter()
                .map(RedisServer::url)
                .collect::<Vec<_>>()
                .join(",")
        };
        match self {
            Servers::Redis(redis) => vec!["redis".into(), redis.url()],
            Servers::Cluster(cluster) => vec!["cluster".into(), cluster.urls().join(",")],
            Servers::Sentinel(group) => vec![
                "sentinel".into(),
                group.sentinel_urls().join(","),
                group.name.into(),
            ],
            Servers::Redlock(masters) => vec!["redlock".into(), list(masters)],
        }
    }

    /// The servers a Redis fault freezes.
    fn to_freeze(&self) -> Vec<&RedisServer> {
        match self {
            Servers::Redis(redis) => vec![redis],
            Servers::Cluster(cluster) => {
                let slot: u16 = redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(KEYS[0])
                    .query(&mut cluster.primaries()[0].connection())
                    .expect("CLUSTER KEYSLOT");
                vec![cluster.primary_for(slot)]
            }
            Servers::Sentinel(group) => vec![&group.primary],
            Servers::Redlock(masters) => masters[..2].iter().collect(),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_redis_keeps_sections_apart_and_tokens_growing_under_faults() {
    run(Servers::Redis(RedisServer::start()), 10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_sections_apart_and_tokens_growing_under_faults() {
    run(Servers::Cluster(RedisCluster::start()), 5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_keeps_sections_apart_and_tokens_growing_under_faults() {
    // Far above `FAULT`: a frozen primary is never failed over.
    let group = SentinelGroup::start(Duration::from_secs(5));
    run(Servers::Sentinel(group), 5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_sections_apart_and_tokens_growing_under_faults() {
    let masters = (0..5).map(|_| RedisServer::start()).collect();
    run(Servers::Redlock(masters), 2_000).await;
}

async fn run(servers: Servers, default_target: usize) {
    let target: usize = std::env::var("LOCK_CHAOS_SECTIONS")
        .ok()
        .and_then(|sections| sections.parse().ok())
        .unwrap_or(default_target);
    let started = Instant::now();
    let topology = servers.worker_args();
    let frozen = servers.to_freeze();
    let sections: Sections = Arc::default();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|number| Worker::start(number, &topology, &sections))
        .collect();
    let mut next_worker = WORKERS;

    // Faults, one kind after another, until most of the sections are done.
    let mut faults = 0;
    while faults < 9 || count(&sections) < target * 4 / 5 {
        assert!(started.elapsed() < AT_MOST / 2, "too slow under faults");
        let victim = faults % workers.len();
        match faults % 3 {
            0 => {
                workers[victim].signal("-STOP");
                tokio::time::sleep(FAULT).await;
                workers[victim].signal("-CONT");
            }
            1 => {
                workers[victim] = Worker::start(next_worker, &topology, &sections);
                next_worker += 1;
            }
            _ => {
                frozen.iter().for_each(|server| server.freeze());
                tokio::time::sleep(FAULT).await;
                frozen.iter().for_each(|server| server.thaw());
            }
        }
        faults += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let calm_from = SystemTime::now();

    // Progress: every key is held again, in sections that began after the faults.
    loop {
        let done = count(&sections) >= target
            && KEYS.iter().all(|key| {
                let sections = sections.lock().unwrap();
                let after = sections
                    .iter()
                    .filter(|s| s.key == *key && s.held && s.from > calm_from);
                after.count() >= 20
            });
        if done {
            break;
        }
        assert!(
            started.elapsed() < AT_MOST,
            "a key made no progress after the faults"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(workers);

    let sections = sections.lock().unwrap().clone();
    let history = History::new();
    for section in sections.iter().filter(|section| section.held) {
        history.record(Holding {
            holder: format!("worker {}", section.worker),
            key: section.key.clone(),
            from: section.from,
            until: section.until,
            fence: Some(section.token),
        });
    }
    let held = history
        .check()
        .unwrap_or_else(|violation| panic!("{violation}"));
    check_token_order(&sections);
    let lost = sections.len() - held;
    eprintln!(
        "chaos {}: {} sections ({held} held to the end, {lost} lost), {faults} faults, {} workers, {:.1} s",
        topology[0],
        sections.len(),
        next_worker,
        started.elapsed().as_secs_f64()
    );
    assert!(sections.len() >= target);
}
