//! Chaos: worker processes take fenced, watchdog-renewed locks on a few hot keys
//! while the test injects faults. No two sections whose holders still believed them
//! held at their end overlap; per key, no token is issued twice and a section that
//! ended before another asked for the lock has the smaller token, lost sections
//! included; the faults did make holders lose sections; and every key makes
//! progress once the faults stop. The workers also take a read-write lock and, but on
//! Redlock (which refuses semaphores), a semaphore of two permits: of the sections
//! held to their end, never more than two hold a permit at once, and an exclusive one
//! overlaps no other of its key. One fenced key is taken fail-fast with a
//! `hold_at_least` window, as a job run once per window is: a section whose release
//! answered counts as held until its window ended, so a window cut short overlaps.
//! On Sentinel and Cluster, every worker's client counted a replica for every
//! primary (its INFO event says what it counted) before it asked for a lock.
//!
//! It runs on every topology that crosses processes: one Redis, a 3+3 Cluster, a
//! Sentinel group and Redlock over 5 masters (the memory store lives in one process,
//! so it has no place here). The faults, one kind after another:
//! - a worker is paused (`SIGSTOP`) past its lease, the holder of the slow key when
//!   there is one, so that it comes back to a section others have taken since;
//! - a worker is killed and another started;
//! - on one Redis, Cluster and Redlock: Redis is frozen past the lease (the server;
//!   the primary serving every key's lock; a minority, 2 of 5, of the masters);
//! - on Sentinel: the replica is cut off for a while and comes back;
//! - on Sentinel and Cluster: the keys' primary fails over: its replica is cut off,
//!   so that grants made from then on exist on the primary alone, the primary is
//!   killed, the replica is promoted (by the Sentinels; by the Cluster's other
//!   primaries), and the old primary comes back as a replica;
//! - on Cluster: the keys' primary is frozen until its replica takes over, and
//!   comes back, its data kept, as the new primary's replica;
//! - on Sentinel and Cluster: a planned failover (`SENTINEL FAILOVER`, `CLUSTER
//!   FAILOVER`), the old primary alive throughout, until it is the new one's
//!   replica. After each failover the test waits until every key is held again.
//!
//! At least 10,000 sections by default on one Redis, 5,000 on Cluster and Sentinel,
//! 2,000 on Redlock; `LOCK_CHAOS_SECTIONS=100000` runs more, with faults until most
//! of them are done (`scripts/chaos`). `LOCK_CHAOS_REPLICAS=0` turns the workers'
//! replica sync off, to watch the Sentinel and Cluster runs fail.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::history::{History, Holding, Violation};
use lock_tests::{RedisCluster, RedisServer, SentinelGroup};
use tokio::task::block_in_place;
use tokio::time::Instant;

/// Every key's lock is served by one Cluster primary, the one the faults hit (see
/// `Servers::keys`). A lock's slot is its whole key's (the client escapes braces),
/// so these names were picked for theirs.
const FAST_KEYS: [&str; 2] = ["quake:a", "quake:b"];
/// Held for `SLOW_HOLD` in each section: past the 300 ms lease, so only the
/// watchdog keeps it, and a fault that stops renewals loses it.
const SLOW_KEY: &str = "quake:slow";
const SLOW_HOLD: Duration = Duration::from_millis(400);
/// A semaphore of `PERMITS`, held for `SLOW_HOLD` like the slow key.
const PERMITS_KEY: &str = "quake:permits";
const PERMITS: usize = 2;
/// Taken shared, and exclusive every fourth section, for `READ_WRITE_HOLD` each: long
/// enough that a paused worker is often inside, and that its sections, readers
/// sharing it, do not outnumber the fast keys' and so end the faults early.
const READ_WRITE_KEY: &str = "quake:rw";
const READ_WRITE_HOLD: Duration = Duration::from_millis(100);
/// Taken as a job run once per window is: fail-fast, each section holding the lock
/// at least `WINDOW` from its grant (`hold_at_least`), the release that keeps it so
/// meeting the faults. A section whose release answered counts as held until
/// `WINDOW` after it asked, a lower bound of its window's end, for the checks.
const WINDOWED_KEY: &str = "quake:window";
const WINDOW: Duration = Duration::from_millis(40);
const WORKERS: usize = 4;
const TASKS_PER_KEY: usize = 2;
/// The workers' lease: how long after a fault a holder may still learn it lost.
const LEASE: Duration = Duration::from_millis(300);
/// Longer than the workers' lease, so a paused holder loses its lock.
const FAULT: Duration = Duration::from_millis(600);
/// How long grants exist on the primary alone before it is killed.
const UNREPLICATED: Duration = Duration::from_millis(300);
/// A key that held no section to its end for this long has stalled: far longer than
/// any fault or failover takes, however slow the machine. How fast the run goes is
/// for benchmarks; the run only has to keep going.
const STALL: Duration = Duration::from_secs(60);

/// The keys taken exclusive, with fencing tokens.
fn fenced_keys() -> impl Iterator<Item = &'static str> {
    FAST_KEYS.into_iter().chain([SLOW_KEY, WINDOWED_KEY])
}

/// How a worker is told to take `key`.
fn worker_spec(key: &str) -> String {
    let hold = SLOW_HOLD.as_millis();
    match key {
        SLOW_KEY => format!("{key}={hold}"),
        PERMITS_KEY => format!("{key}={hold}/permits={PERMITS}"),
        READ_WRITE_KEY => format!("{key}={}/read-write", READ_WRITE_HOLD.as_millis()),
        WINDOWED_KEY => format!("{key}/window={}", WINDOW.as_millis()),
        key => key.to_owned(),
    }
}

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
    /// `exclusive`, `shared` or `permit`.
    kind: String,
}

/// An acquisition that failed, as its worker reported it.
#[derive(Clone)]
struct Failure {
    key: String,
    at: SystemTime,
    what: String,
}

/// A warning a worker's client logged about a key.
#[derive(Clone)]
struct Warning {
    worker: usize,
    key: String,
    at: SystemTime,
    what: String,
}

/// The replicas a worker's client counted, as its INFO event said them: one count,
/// or each range of slots with its count.
#[derive(Clone)]
struct ReplicaCount {
    worker: usize,
    at: SystemTime,
    replicas: String,
}

impl ReplicaCount {
    /// The fewest replicas it counted for any primary listed, as a slot left out of a
    /// listing waits for the most any primary has; none for an empty listing.
    fn fewest(&self) -> usize {
        let unreadable = format!("a chaos worker counted {:?}", self.replicas);
        let listed = self.replicas.strip_prefix("slots ");
        let counts = listed.map_or(vec![self.replicas.as_str()], |ranges| {
            let ranges = ranges.split(", ").filter(|range| !range.is_empty());
            ranges
                .map(|range| range.rsplit_once(": ").expect(&unreadable).1)
                .collect()
        });
        let counts = counts
            .iter()
            .map(|count| count.parse::<usize>().expect(&unreadable));
        counts.min().unwrap_or(0)
    }
}

/// What the workers reported on `keys`: their sections, their failed acquisitions,
/// their clients' warnings and replica counts, and who is inside the slow key.
#[derive(Default)]
struct Reports {
    keys: Vec<&'static str>,
    sections: Mutex<Vec<Section>>,
    failures: Mutex<Vec<Failure>>,
    warnings: Mutex<Vec<Warning>>,
    counts: Mutex<Vec<ReplicaCount>>,
    slow_holder: Mutex<Option<usize>>,
}

impl Reports {
    fn count(&self) -> usize {
        self.sections.lock().unwrap().len()
    }

    /// A key that held no section to its end within the last `STALL`, counting from
    /// `started` for a key that has held none yet.
    fn stalled_key(&self, started: SystemTime) -> Option<&'static str> {
        let sections = self.sections.lock().unwrap();
        let now = SystemTime::now();
        self.keys.iter().copied().find(|key| {
            let held = sections.iter().filter(|s| s.key == *key && s.held);
            let last_held = held.map(|s| s.until).max().unwrap_or(started);
            now.duration_since(last_held)
                .is_ok_and(|quiet| quiet > STALL)
        })
    }

    /// Fails the run if a key has stalled, saying how far each key got.
    fn assert_progress(&self, started: SystemTime, phase: &str) {
        let Some(stalled) = self.stalled_key(started) else {
            return;
        };
        let sections = self.sections.lock().unwrap().clone();
        let by_key: Vec<String> = self
            .keys
            .iter()
            .copied()
            .map(|key| {
                let of_key = sections.iter().filter(|s| s.key == key);
                let held = of_key.clone().filter(|s| s.held).count();
                format!("`{key}` {held} held, {} lost", of_key.count() - held)
            })
            .collect();
        panic!(
            "`{stalled}` held no section to its end for {STALL:?} {phase}; so far {}",
            by_key.join(", ")
        );
    }

    /// Whether every key has a section held to its end that began after `after`.
    fn every_key_held_since(&self, after: SystemTime, at_least: impl Fn(&str) -> usize) -> bool {
        let sections = self.sections.lock().unwrap();
        self.keys.iter().copied().all(|key| {
            let held = sections
                .iter()
                .filter(|s| s.key == key && s.held && s.from > after);
            held.count() >= at_least(key)
        })
    }
}

struct Worker {
    number: usize,
    child: Child,
}

impl Worker {
    fn start(number: usize, topology: &[String], reports: &Arc<Reports>) -> Worker {
        let keys: Vec<String> = reports.keys.iter().map(|key| worker_spec(key)).collect();
        let mut child = Command::new(env!("CARGO_BIN_EXE_chaos-worker"))
            .args([keys.join(","), TASKS_PER_KEY.to_string()])
            .args(topology)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a chaos worker");
        let stdout = child.stdout.take().expect("piped");
        let reports = reports.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(key) = line.strip_prefix("enter ") {
                    if key == SLOW_KEY {
                        *reports.slow_holder.lock().unwrap() = Some(number);
                    }
                    continue;
                }
                if let Some(failure) = line.strip_prefix("failed ") {
                    reports
                        .failures
                        .lock()
                        .unwrap()
                        .push(parse_failure(failure));
                    continue;
                }
                if let Some(count) = line.strip_prefix("counted ") {
                    let (at, replicas) = count.split_once(' ').expect("`counted <at> <replicas>`");
                    reports.counts.lock().unwrap().push(ReplicaCount {
                        worker: number,
                        at: time(at),
                        replicas: replicas.to_owned(),
                    });
                    continue;
                }
                if let Some(warning) = line.strip_prefix("warned ") {
                    reports
                        .warnings
                        .lock()
                        .unwrap()
                        .push(parse_warning(number, warning));
                    continue;
                }
                let section = parse(number, &line);
                if section.key == SLOW_KEY {
                    let mut holder = reports.slow_holder.lock().unwrap();
                    if *holder == Some(number) {
                        *holder = None;
                    }
                }
                reports.sections.lock().unwrap().push(section);
            }
        });
        Worker { number, child }
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

fn time(nanos: &str) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(nanos.parse().expect("ns"))
}

fn parse_failure(line: &str) -> Failure {
    let fields: Vec<&str> = line.split(' ').collect();
    let [key, at, what] = fields[..] else {
        panic!("a chaos worker said `failed {line}`");
    };
    Failure {
        key: key.to_owned(),
        at: time(at),
        what: what.to_owned(),
    }
}

fn parse_warning(worker: usize, line: &str) -> Warning {
    let fields: Vec<&str> = line.splitn(3, ' ').collect();
    let [key, at, what] = fields[..] else {
        panic!("a chaos worker said `warned {line}`");
    };
    Warning {
        worker,
        key: key.to_owned(),
        at: time(at),
        what: what.to_owned(),
    }
}

fn parse(worker: usize, line: &str) -> Section {
    let fields: Vec<&str> = line.split(' ').collect();
    let [key, token, asked, from, until, held, kind] = fields[..] else {
        panic!("a chaos worker said {line:?}");
    };
    Section {
        worker,
        key: key.to_owned(),
        token: token.parse().expect("a token"),
        asked: time(asked),
        from: time(from),
        until: time(until),
        held: held == "true",
        kind: kind.to_owned(),
    }
}

/// Every worker counted a replica of every primary before it asked for a lock, as each
/// primary has one: a client that counts none on a shard grants there unconfirmed,
/// and a replica promoted without the grant may make it again. Returns how many
/// counts were said, for the summary.
fn check_replicas_counted(
    counts: &[ReplicaCount],
    sections: &[Section],
    injected: &[Injected],
    started: SystemTime,
) -> String {
    let since = |at: SystemTime| at.duration_since(started).unwrap_or_default().as_secs_f64();
    let last_fault = |at: SystemTime| {
        let before = injected.iter().rfind(|fault| fault.from <= at);
        before.map_or("none".to_owned(), |fault| {
            format!("{:?} from {:.3} s", fault.fault, since(fault.from))
        })
    };
    if let Some(none) = counts.iter().find(|count| count.fewest() == 0) {
        panic!(
            "worker {} counted no replica for a primary ({}) at {:.3} s, so its grants \
             there went unconfirmed; the last fault begun: {}",
            none.worker,
            none.replicas,
            since(none.at),
            last_fault(none.at)
        );
    }
    for section in sections {
        let counted = counts
            .iter()
            .any(|count| count.worker == section.worker && count.at <= section.asked);
        assert!(
            counted,
            "worker {} asked for `{}` at {:.3} s with no count of replicas said before",
            section.worker,
            section.key,
            since(section.asked)
        );
    }
    format!("; replicas counted {} times, never none", counts.len())
}

/// Per key: no token twice, and every section's token is above the tokens of all
/// sections that ended before it asked for the lock, whether they kept their
/// lease or not. `report` says what led to a violation between two of them.
fn check_token_order(sections: &[Section], report: impl Fn(&Section, &Section) -> String) {
    for key in fenced_keys() {
        let mut by_end: Vec<&Section> = sections.iter().filter(|s| s.key == key).collect();
        by_end.sort_by_key(|section| section.until);
        let mut by_ask = by_end.clone();
        by_ask.sort_by_key(|section| section.asked);
        let mut by_token = by_end.clone();
        by_token.sort_by_key(|section| section.token);
        if let Some(twice) = by_token
            .windows(2)
            .find(|pair| pair[0].token == pair[1].token)
        {
            let (earlier, later) = match twice[0].from <= twice[1].from {
                true => (twice[0], twice[1]),
                false => (twice[1], twice[0]),
            };
            panic!(
                "`{key}`: token {:#x} was issued twice: to {earlier:?} and to {later:?}\n{}",
                earlier.token,
                report(earlier, later)
            );
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
                     no larger\n{}",
                    report(earlier, section)
                );
            }
        }
    }
}

/// Of the sections held to their end on the family's keys among `keys`: never more
/// than `PERMITS` inside the semaphore at once, and on the read-write lock no
/// exclusive section beside another. Fails too unless each key did hold two sections
/// at once somewhere in the run.
/// Returns the most each held at once.
fn check_family(keys: &[&str], sections: &[Section]) -> String {
    let mut most = Vec::new();
    for key in [PERMITS_KEY, READ_WRITE_KEY]
        .into_iter()
        .filter(|key| keys.contains(key))
    {
        let held = sections
            .iter()
            .filter(|s| s.key == key && s.held && s.from < s.until);
        // Ends before beginnings at the same instant: sections that touch do not overlap.
        let mut events: Vec<(SystemTime, bool, &Section)> = held
            .flat_map(|s| [(s.from, true, s), (s.until, false, s)])
            .collect();
        events.sort_by_key(|&(at, begins, _)| (at, begins));
        let mut inside: Vec<&Section> = Vec::new();
        let mut most_together = 0;
        for (_, begins, section) in events {
            if !begins {
                inside.retain(|other| !std::ptr::eq(*other, section));
                continue;
            }
            inside.push(section);
            let exclusive = inside.iter().any(|s| s.kind == "exclusive");
            if (key == PERMITS_KEY && inside.len() > PERMITS) || (exclusive && inside.len() > 1) {
                panic!("`{key}`: held at once by {inside:#?}");
            }
            most_together = most_together.max(inside.len());
        }
        assert!(
            most_together >= 2,
            "`{key}`: no two sections were held at once, so the run proves little"
        );
        most.push(format!("{key} {most_together}"));
    }
    format!("most held at once: {}", most.join(", "))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    PauseWorker,
    RestartWorker,
    FreezeRedis,
    CutOffReplica,
    FailOver,
    FailOverFromSilent,
    SwitchOver,
}

impl Fault {
    /// Whether it moves the keys' primary: a failover, planned or not.
    fn moves_the_primary(self) -> bool {
        matches!(
            self,
            Fault::FailOver | Fault::FailOverFromSilent | Fault::SwitchOver
        )
    }
}

/// A fault as injected: when it began and ended, and the worker it hit, if it hit one.
struct Injected {
    fault: Fault,
    worker: Option<usize>,
    from: SystemTime,
    until: SystemTime,
}

/// The servers of one topology, kept alive for the run.
enum Servers {
    Redis(RedisServer),
    Cluster(RedisCluster),
    Sentinel(Box<SentinelGroup>),
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

    /// The keys the workers take: the fenced ones, the read-write lock, and the
    /// semaphore but on Redlock. On a Cluster, all served by the primary the faults
    /// hit.
    fn keys(&self) -> Vec<&'static str> {
        let mut keys: Vec<&'static str> = fenced_keys().chain([READ_WRITE_KEY]).collect();
        if !matches!(self, Servers::Redlock(_)) {
            keys.push(PERMITS_KEY);
        }
        if let Servers::Cluster(cluster) = self {
            let faulted = cluster.shard_for(cluster.slot_of(SLOW_KEY));
            for key in &keys {
                assert!(
                    !key.contains('{') && cluster.shard_for(cluster.slot_of(key)) == faulted,
                    "`{key}`'s lock is not on the primary the faults hit: name it anew"
                );
            }
        }
        keys
    }

    /// Whether every primary has a replica, which grants wait for.
    fn replicated(&self) -> bool {
        matches!(self, Servers::Cluster(_) | Servers::Sentinel(_))
    }

    /// The kinds of fault injected in turn, and how many rounds of them at least.
    fn faults(&self) -> (&'static [Fault], usize) {
        use Fault::*;
        match self {
            Servers::Sentinel(_) => (
                &[
                    PauseWorker,
                    RestartWorker,
                    CutOffReplica,
                    FailOver,
                    SwitchOver,
                ],
                2,
            ),
            Servers::Cluster(_) => (
                &[
                    PauseWorker,
                    RestartWorker,
                    FreezeRedis,
                    FailOver,
                    FailOverFromSilent,
                    SwitchOver,
                ],
                2,
            ),
            _ => (&[PauseWorker, RestartWorker, FreezeRedis], 3),
        }
    }

    /// Injects one of the faults on the servers, and returns once it is over.
    fn inject(&mut self, fault: Fault) {
        match (fault, self) {
            (Fault::FreezeRedis, servers) => {
                let frozen = servers.to_freeze();
                frozen.iter().for_each(|server| server.freeze());
                std::thread::sleep(FAULT);
                frozen.iter().for_each(|server| server.thaw());
            }
            (Fault::CutOffReplica, Servers::Sentinel(group)) => {
                group.cut_off_replica();
                std::thread::sleep(FAULT);
                group.reconnect_replica();
            }
            (Fault::FailOver, Servers::Sentinel(group)) => {
                group.cut_off_replica();
                std::thread::sleep(UNREPLICATED);
                group.fail_over();
            }
            (Fault::FailOver, Servers::Cluster(cluster)) => {
                let slot = cluster.slot_of(SLOW_KEY);
                let shard = cluster.shard_for(slot);
                cluster.cut_off_replica(shard);
                std::thread::sleep(UNREPLICATED);
                cluster.kill_primary(shard);
                let shard = cluster.promote_replica(shard, slot, Duration::from_secs(30));
                cluster.restore_old_primary(shard);
            }
            (Fault::FailOverFromSilent, Servers::Cluster(cluster)) => {
                let slot = cluster.slot_of(SLOW_KEY);
                cluster.fail_over_from_silent(cluster.shard_for(slot), slot);
            }
            (Fault::SwitchOver, Servers::Sentinel(group)) => group.switch_over(),
            (Fault::SwitchOver, Servers::Cluster(cluster)) => {
                let slot = cluster.slot_of(SLOW_KEY);
                cluster.switch_over(cluster.shard_for(slot), slot);
            }
            (fault, _) => panic!("{fault:?} is not a fault of the servers here"),
        }
    }

    /// The servers a Redis fault freezes.
    fn to_freeze(&self) -> Vec<&RedisServer> {
        match self {
            Servers::Redis(redis) => vec![redis],
            Servers::Cluster(cluster) => vec![cluster.primary_for(cluster.slot_of(SLOW_KEY))],
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
async fn cluster_keeps_sections_apart_and_tokens_growing_through_failovers() {
    run(Servers::Cluster(RedisCluster::start()), 5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_keeps_sections_apart_and_tokens_growing_through_failovers() {
    let group = SentinelGroup::start(Duration::from_secs(1));
    run(Servers::Sentinel(Box::new(group)), 5_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redlock_keeps_sections_apart_and_tokens_growing_under_faults() {
    let masters = (0..5).map(|_| RedisServer::start()).collect();
    run(Servers::Redlock(masters), 2_000).await;
}

/// A step of the wall clock against the monotonic one, as a VM restored from a
/// snapshot or a clock set by hand makes one: the workers time their sections by the
/// wall clock, and Redis ends its leases by it, so a step may show sections apart as
/// overlapping, or end a lease early.
struct ClockStep {
    at: SystemTime,
    by: Duration,
    forward: bool,
}

impl fmt::Display for ClockStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sign = if self.forward { '+' } else { '-' };
        write!(f, "{sign}{:.3} ms", self.by.as_secs_f64() * 1e3)
    }
}

/// The steps of the wall clock, on a line of their own, if there were any.
fn stepped(steps: &[ClockStep]) -> String {
    if steps.is_empty() {
        return String::new();
    }
    let steps: Vec<String> = steps.iter().map(ClockStep::to_string).collect();
    format!("\n  the wall clock stepped: {}", steps.join(", "))
}

/// Watches the wall clock for steps of over 1 ms until `stop` is set. A sample whose
/// two monotonic reads lie far apart (the thread was preempted between them) is
/// skipped: it would show a step that is not there.
fn watch_the_clock(stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<ClockStep>> {
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let epoch = SystemTime::now();
        // The wall clock's lead over the monotonic one, since `start`, in ns.
        let lead = |wall: SystemTime, monotonic: std::time::Instant| {
            let wall = match wall.duration_since(epoch) {
                Ok(after) => after.as_nanos() as i128,
                Err(before) => -(before.duration().as_nanos() as i128),
            };
            wall - monotonic.duration_since(start).as_nanos() as i128
        };
        let (mut steps, mut last) = (Vec::new(), 0);
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(2));
            let before = std::time::Instant::now();
            let wall = SystemTime::now();
            let after = std::time::Instant::now();
            if after - before > Duration::from_micros(100) {
                continue;
            }
            let now = lead(wall, before);
            let step = now - last;
            if step.unsigned_abs() > 1_000_000 {
                steps.push(ClockStep {
                    at: wall,
                    by: Duration::from_nanos(step.unsigned_abs() as u64),
                    forward: step > 0,
                });
            }
            last = now;
        }
        steps
    })
}

async fn run(mut servers: Servers, default_target: usize) {
    let target: usize = std::env::var("LOCK_CHAOS_SECTIONS")
        .ok()
        .and_then(|sections| sections.parse().ok())
        .unwrap_or(default_target);
    let started = SystemTime::now();
    let stop_watching = Arc::new(AtomicBool::new(false));
    let watcher = watch_the_clock(stop_watching.clone());
    let topology = servers.worker_args();
    let reports = Arc::new(Reports {
        keys: servers.keys(),
        ..Reports::default()
    });
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|number| Worker::start(number, &topology, &reports))
        .collect();
    let mut next_worker = WORKERS;

    // Faults, one kind after another, until most of the sections are done.
    let (kinds, rounds) = servers.faults();
    let mut injected: Vec<Injected> = Vec::new();
    while injected.len() < kinds.len() * rounds || reports.count() < target * 4 / 5 {
        reports.assert_progress(started, "under faults");
        let fault = kinds[injected.len() % kinds.len()];
        let victim = injected.len() % workers.len();
        let from = SystemTime::now();
        let worker = match fault {
            Fault::PauseWorker => {
                let slow_holder = *reports.slow_holder.lock().unwrap();
                let victim = slow_holder
                    .and_then(|number| workers.iter().position(|w| w.number == number))
                    .unwrap_or(victim);
                workers[victim].signal("-STOP");
                tokio::time::sleep(FAULT).await;
                workers[victim].signal("-CONT");
                Some(workers[victim].number)
            }
            Fault::RestartWorker => {
                let replaced = workers[victim].number;
                workers[victim] = Worker::start(next_worker, &topology, &reports);
                next_worker += 1;
                Some(replaced)
            }
            fault => {
                block_in_place(|| servers.inject(fault));
                None
            }
        };
        let until = SystemTime::now();
        injected.push(Injected {
            fault,
            worker,
            from,
            until,
        });
        if fault.moves_the_primary() {
            // Recovered: every key is held again, by grants the new primary's
            // replica acknowledged.
            let waiting = Instant::now();
            while !reports.every_key_held_since(until, |_| 1) {
                assert!(
                    waiting.elapsed() < Duration::from_secs(30),
                    "a key was not held again within 30 s of a failover"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let calm_from = SystemTime::now();

    // Progress: every key is held again, in sections that began after the faults.
    let at_least = |key: &str| match key {
        SLOW_KEY | PERMITS_KEY => 3,
        _ => 20,
    };
    while reports.count() < target || !reports.every_key_held_since(calm_from, at_least) {
        reports.assert_progress(started, "after the faults");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(workers);
    stop_watching.store(true, Ordering::Relaxed);
    let steps = watcher.join().expect("the clock's watcher");

    let sections = reports.sections.lock().unwrap().clone();
    let failures = reports.failures.lock().unwrap().clone();
    let warnings = reports.warnings.lock().unwrap().clone();
    let counts = reports.counts.lock().unwrap().clone();
    let counted = match servers.replicated() && std::env::var_os("LOCK_CHAOS_REPLICAS").is_none() {
        true => check_replicas_counted(&counts, &sections, &injected, started),
        false => String::new(),
    };
    let history = History::new();
    let fenced = |section: &&Section| fenced_keys().any(|key| key == section.key);
    for section in sections
        .iter()
        .filter(|section| section.held)
        .filter(fenced)
    {
        history.record(holding(section));
    }
    let report =
        |violation: &Violation| before(violation, &sections, &injected, &warnings, &counts, &steps);
    if let Err(violation) = history.check() {
        panic!("{violation}\n{}", report(&violation));
    }
    check_token_order(&sections, |earlier, later| {
        report(&Violation::TokenOrder {
            earlier: Box::new(holding(earlier)),
            later: Box::new(holding(later)),
        })
    });
    let family = check_family(&reports.keys, &sections);
    let lost = sections.iter().filter(|section| !section.held).count();
    eprintln!(
        "{}",
        summary(
            &topology[0],
            &reports.keys,
            &sections,
            &failures,
            &warnings,
            &injected,
            started.elapsed().unwrap_or_default()
        )
    );
    eprintln!("  {family}{counted}{}", stepped(&steps));
    assert!(sections.len() >= target);
    assert!(
        lost > 0,
        "no holder lost a section: the faults never hit a holder, so the run proves little"
    );
}

fn holding(section: &Section) -> Holding {
    Holding {
        holder: format!("worker {}", section.worker),
        key: section.key.clone(),
        from: section.from,
        until: section.until,
        fence: Some(section.token),
    }
}

/// What led to `violation`, to read first: the faults, and the sections and warnings
/// on its key, from 10 s before the later holding began (or 1 s before the earlier,
/// if sooner) until both ended, timed from the later's start; and the replicas each
/// of the two holders' clients counted.
fn before(
    violation: &Violation,
    sections: &[Section],
    injected: &[Injected],
    warnings: &[Warning],
    counts: &[ReplicaCount],
    steps: &[ClockStep],
) -> String {
    let (Violation::Overlap { first, second }
    | Violation::TokenOrder {
        earlier: first,
        later: second,
    }) = violation;
    let (key, start, end) = (&second.key, second.from, second.until.max(first.until));
    let window_from = (start - Duration::from_secs(10)).min(first.from - Duration::from_secs(1));
    let at = |time: SystemTime| match time.duration_since(start) {
        Ok(after) => format!("{:+.3} s", after.as_secs_f64()),
        Err(before) => format!("-{:.3} s", before.duration().as_secs_f64()),
    };
    let within = |from: SystemTime, until: SystemTime| until >= window_from && from <= end;
    let mut lines = vec![format!(
        "before it, timed from {} taking the lock:",
        second.holder
    )];
    for fault in injected.iter().filter(|f| within(f.from, f.until)) {
        let worker = fault
            .worker
            .map_or(String::new(), |w| format!(" of worker {w}"));
        lines.push(format!(
            "  fault {:?}{worker} {} .. {}",
            fault.fault,
            at(fault.from),
            at(fault.until)
        ));
    }
    let on_key = sections
        .iter()
        .filter(|s| &s.key == key && within(s.from, s.until))
        .collect::<Vec<_>>();
    for section in &on_key[on_key.len().saturating_sub(60)..] {
        lines.push(format!(
            "  worker {} token {:#x} asked {} held {} .. {}{}",
            section.worker,
            section.token,
            at(section.asked),
            at(section.from),
            at(section.until),
            if section.held { "" } else { ", lost" }
        ));
    }
    // All of them: rare, and each one may explain the violation.
    let holders = [&first.holder, &second.holder];
    for count in counts
        .iter()
        .filter(|c| holders.contains(&&format!("worker {}", c.worker)))
    {
        lines.push(format!(
            "  worker {} counted replicas {}: {}",
            count.worker,
            at(count.at),
            count.replicas
        ));
    }
    for step in steps {
        lines.push(format!("  the wall clock stepped {step} {}", at(step.at)));
    }
    for warning in warnings
        .iter()
        .filter(|w| &w.key == key && within(w.at, w.at))
    {
        lines.push(format!(
            "  worker {} warned {}: {}",
            warning.worker,
            at(warning.at),
            warning.what
        ));
    }
    lines.join("\n")
}

/// How long after a failover ended every key had a section, begun since, held to its
/// end, and the last key to have one: when it was asked for, when it began, and the
/// acquisitions of that key that failed in between.
fn recovery(
    keys: &[&str],
    sections: &[Section],
    failures: &[Failure],
    failover_ended: SystemTime,
) -> String {
    let since = |at: SystemTime| match at.duration_since(failover_ended) {
        Ok(after) => after.as_secs_f64(),
        Err(before) => -before.duration().as_secs_f64(),
    };
    let first_held = |key: &str| {
        sections
            .iter()
            .filter(|s| s.key == key && s.held && s.from > failover_ended)
            .min_by_key(|s| s.until)
    };
    let Some(last) = keys
        .iter()
        .filter_map(|key| first_held(key))
        .max_by_key(|s| s.until)
    else {
        return "(not held again)".to_owned();
    };
    let failed = tally(
        failures
            .iter()
            .filter(|f| f.key == last.key && f.at > failover_ended && f.at <= last.from)
            .map(|f| f.what.as_str()),
    );
    format!(
        "{:.1} s ({}: asked {:+.1} s, began {:+.1} s{})",
        since(last.until),
        last.key,
        since(last.asked),
        since(last.from),
        failed
            .map(|failed| format!("; failed: {failed}"))
            .unwrap_or_default()
    )
}

/// Things counted by what they are, as `timeout 3, IoError 1`; none if there were
/// none.
fn tally<'a>(whats: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for what in whats {
        *counts.entry(what).or_default() += 1;
    }
    let counts: Vec<String> = counts
        .iter()
        .map(|(what, times)| format!("{what} {times}"))
        .collect();
    (!counts.is_empty()).then(|| counts.join(", "))
}

/// What the worker's client logged about a lost section's key while the section
/// lasted or within a lease after: each kind of warning once, in order.
fn logged_about(section: &Section, warnings: &[Warning]) -> String {
    let mut logged: Vec<&str> = Vec::new();
    let about = warnings.iter().filter(|w| {
        w.worker == section.worker
            && w.key == section.key
            && w.at > section.asked
            && w.at < section.until + LEASE
    });
    for warning in about {
        if !logged.contains(&warning.what.as_str()) {
            logged.push(&warning.what);
        }
    }
    match logged.is_empty() {
        true => "nothing logged".to_owned(),
        false => format!("logged {}", logged.join(" then ")),
    }
}

/// The last fault that a lost section overlapped, or that ended within a lease before
/// the section did: what made it lost, as far as timing tells. A fault that hit a
/// worker counts for that worker's sections only.
fn cause(section: &Section, injected: &[Injected]) -> Option<Fault> {
    injected
        .iter()
        .rev()
        .find(|f| {
            f.worker.is_none_or(|worker| worker == section.worker)
                && section.from < f.until + LEASE
                && section.until > f.from
        })
        .map(|f| f.fault)
}

/// The run in a few lines: sections held and lost by worker and key, the faults,
/// what each key's lost sections overlapped (with no fault near, what their worker
/// logged), and how long each failover took to recover from.
fn summary(
    topology: &str,
    keys: &[&str],
    sections: &[Section],
    failures: &[Failure],
    warnings: &[Warning],
    injected: &[Injected],
    took: Duration,
) -> String {
    let lost = sections.iter().filter(|s| !s.held).count();
    let mut faults: BTreeMap<Fault, usize> = BTreeMap::new();
    for fault in injected {
        *faults.entry(fault.fault).or_default() += 1;
    }
    let faults: Vec<String> = faults
        .iter()
        .map(|(fault, times)| format!("{fault:?} {times}"))
        .collect();
    let lost_in_failovers = sections
        .iter()
        .filter(|s| {
            !s.held
                && injected
                    .iter()
                    .any(|f| f.fault.moves_the_primary() && s.from < f.until && s.until > f.from)
        })
        .count();
    let mut text = format!(
        "chaos {topology}: {} sections, {} held to the end, {lost} lost; faults: {}; \
         violations: 0; {:.1} s",
        sections.len(),
        sections.len() - lost,
        faults.join(", "),
        took.as_secs_f64()
    );
    if let Some(failed) = tally(failures.iter().map(|f| f.what.as_str())) {
        text.push_str(&format!("\n  acquisitions failed: {failed}"));
    }
    let extends = warnings.iter().map(|w| w.what.strip_prefix("extend: "));
    if let Some(failed) = tally(extends.flatten()) {
        text.push_str(&format!("\n  extends failed: {failed}"));
    }
    let recoveries: Vec<String> = injected
        .iter()
        .filter(|f| f.fault.moves_the_primary())
        .map(|failover| {
            let planned = if failover.fault == Fault::SwitchOver {
                "planned: "
            } else {
                ""
            };
            format!(
                "{planned}{}",
                recovery(keys, sections, failures, failover.until)
            )
        })
        .collect();
    if !recoveries.is_empty() {
        text.push_str(&format!(
            "\n  failovers: {lost_in_failovers} sections lost across them; every key held \
             again after {}",
            recoveries.join(", ")
        ));
    }
    // Worker by worker while that stays readable; long runs start many.
    let workers = sections
        .iter()
        .map(|s| s.worker)
        .max()
        .map_or(0, |last| last + 1);
    for &key in keys {
        let mut by_worker: BTreeMap<usize, (usize, usize)> = BTreeMap::new();
        for section in sections.iter().filter(|s| s.key == key) {
            let counts = by_worker.entry(section.worker).or_default();
            if section.held {
                counts.0 += 1;
            } else {
                counts.1 += 1;
            }
        }
        let (held, lost) = by_worker.values().fold((0, 0), |(held, lost), counts| {
            (held + counts.0, lost + counts.1)
        });
        text.push_str(&format!("\n  {key}: {held} held, {lost} lost"));
        let causes: Vec<String> = sections
            .iter()
            .filter(|s| s.key == key && !s.held)
            .map(|s| match cause(s, injected) {
                Some(fault) => format!("{fault:?}"),
                None => format!("no fault: {}", logged_about(s, warnings)),
            })
            .collect();
        if let Some(causes) = tally(causes.iter().map(String::as_str)) {
            text.push_str(&format!(" ({causes})"));
        }
        if workers <= 12 {
            text.push_str("; held/lost by worker:");
            for (worker, (held, lost)) in by_worker {
                text.push_str(&format!(" {worker}: {held}/{lost}"));
            }
        }
    }
    text
}
