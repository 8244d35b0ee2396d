//! The scenarios, run the same way for every implementation: tasks released together
//! by a barrier, each taking locks in turn, timed from the barrier to the last task.

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use lock_tests::{CommandCounts, CountingProxy};
use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

use crate::peers::{Peer, PeerKind};
use crate::stats::median;

/// Commands a client sends when it (re)connects, not for any one lock.
pub(crate) const SETUP_COMMANDS: &[&str] = &[
    "HELLO",
    "AUTH",
    "SELECT",
    "CLIENT SETINFO",
    "CLIENT SETNAME",
];
/// How long worker processes get to connect, and a round to finish, before the
/// bench gives up on them.
const WORKER_PATIENCE: Duration = Duration::from_secs(300);
/// The fewest sections in a round of the serial limit. The bursts' few hundred
/// sections take it tens of milliseconds, too short a round to tell by it whether
/// the machine's speed changed, which is what the goals' verdicts ask of it.
pub(crate) const SERIAL_LIMIT_SECTIONS: usize = 10_000;
/// Errors kept for the report; the rest are only counted.
const ERRORS_KEPT: usize = 3;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Contention {
    /// Each task locks a key of its own: acquire-and-release pairs, no section.
    DistinctKeys,
    /// Every task locks one key and runs a non-atomic GET-then-SET of a counter.
    HotKey,
}

#[derive(Debug, Clone)]
pub(crate) struct Scenario {
    pub(crate) name: String,
    pub(crate) slug: &'static str,
    /// 1: the tasks run in this process; more: in that many worker processes.
    pub(crate) processes: usize,
    /// Per process.
    pub(crate) tasks: usize,
    /// Per task.
    pub(crate) sections: usize,
    pub(crate) contention: Contention,
    pub(crate) rounds: usize,
}

impl Scenario {
    /// How `kind` runs this scenario: as it is, or, for the serial limit, its
    /// sections by one task in this process, and at least `SERIAL_LIMIT_SECTIONS`.
    /// `None` where it does not apply (the limit of a scenario without sections).
    pub(crate) fn as_run_by(&self, kind: PeerKind) -> Option<Scenario> {
        if kind != PeerKind::SerialLimit {
            return Some(self.clone());
        }
        (self.contention == Contention::HotKey).then(|| Scenario {
            processes: 1,
            tasks: 1,
            sections: (self.processes * self.tasks * self.sections).max(SERIAL_LIMIT_SECTIONS),
            ..self.clone()
        })
    }
}

/// What the tasks of one run did.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Acquire, section and release all succeeded.
    pub(crate) completed: u64,
    /// Sections whose SET went through: what the counter must show.
    pub(crate) increments: u64,
    pub(crate) failures: u64,
    pub(crate) waits: Vec<Duration>,
    /// When each section ended, from its task's start.
    pub(crate) ends: Vec<Duration>,
    /// With several processes: each one's share of the sections done while all of
    /// them ran (until the first finished), 1.0 being a fair share.
    pub(crate) shares: Vec<f64>,
    /// How long each release took; not reported by worker processes.
    pub(crate) releases: Vec<Duration>,
    /// What the implementation's processes used for the run, all threads; set for
    /// a whole run, not by `merge`.
    pub(crate) usage: Option<Usage>,
    pub(crate) errors: Vec<String>,
}

impl Tally {
    fn fail(&mut self, error: String) {
        self.failures += 1;
        if self.errors.len() < ERRORS_KEPT {
            self.errors.push(error);
        }
    }

    pub(crate) fn merge(&mut self, other: Tally) {
        self.completed += other.completed;
        self.increments += other.increments;
        for error in other.errors {
            if self.errors.len() < ERRORS_KEPT {
                self.errors.push(error);
            }
        }
        self.failures += other.failures;
        self.waits.extend(other.waits);
        self.ends.extend(other.ends);
        self.releases.extend(other.releases);
    }
}

/// Each process's sections done before the first process finished, against an
/// equal split of them.
fn shares(processes: &[Tally]) -> Vec<f64> {
    let Some(first_done) = processes
        .iter()
        .filter_map(|tally| tally.ends.iter().max())
        .min()
    else {
        return Vec::new();
    };
    let done: Vec<usize> = processes
        .iter()
        .map(|tally| tally.ends.iter().filter(|end| *end <= first_done).count())
        .collect();
    let fair = done.iter().sum::<usize>() as f64 / processes.len() as f64;
    done.iter().map(|&count| count as f64 / fair).collect()
}

/// One timed run.
#[derive(Debug)]
pub(crate) struct RunResult {
    pub(crate) tally: Tally,
    pub(crate) elapsed: Duration,
    pub(crate) counter: Option<CounterCheck>,
    /// CPU time redis-server used during the run.
    pub(crate) redis_cpu: Option<Duration>,
}

impl RunResult {
    pub(crate) fn failed(error: String) -> RunResult {
        let mut tally = Tally::default();
        tally.fail(error);
        RunResult {
            tally,
            elapsed: Duration::ZERO,
            counter: None,
            redis_cpu: None,
        }
    }

    pub(crate) fn throughput(&self) -> f64 {
        if self.elapsed.is_zero() {
            return 0.0;
        }
        self.tally.completed as f64 / self.elapsed.as_secs_f64()
    }
}

/// The hot key's counter after a run: exact when it shows every increment.
#[derive(Debug, Clone)]
pub(crate) struct CounterCheck {
    pub(crate) expected: u64,
    pub(crate) found: Result<u64, String>,
}

impl CounterCheck {
    pub(crate) fn is_exact(&self) -> bool {
        self.found
            .as_ref()
            .is_ok_and(|found| *found == self.expected)
    }
}

/// The counting pass: top-level requests sent while the scenario ran once.
#[derive(Debug)]
pub(crate) struct Counted {
    pub(crate) counts: CommandCounts,
    /// Redis's own time in the counted commands (scripts' inner commands included),
    /// from `INFO commandstats`; `None` when it could not be read.
    pub(crate) server_time: Option<Duration>,
    pub(crate) run: RunResult,
}

impl Counted {
    /// Requests per completed section (per pair when uncontended), connection
    /// set-up excluded.
    pub(crate) fn per_section(&self) -> Option<f64> {
        let requests = self.counts.total_excluding(SETUP_COMMANDS);
        (self.run.tally.completed > 0).then(|| requests as f64 / self.run.tally.completed as f64)
    }

    pub(crate) fn server_time_per_section(&self) -> Option<Duration> {
        let sections = u32::try_from(self.run.tally.completed)
            .ok()
            .filter(|&sections| sections > 0)?;
        Some(self.server_time? / sections)
    }
}

/// Everything one process needs to take part: a connected implementation and a
/// data connection for the sections.
pub(crate) struct Participant {
    pub(crate) peer: Arc<Peer>,
    pub(crate) data: MultiplexedConnection,
}

impl Participant {
    /// Connects and warms up (scripts loaded, connections open), so that neither
    /// the timing nor the request count includes connecting.
    pub(crate) async fn connect(
        kind: PeerKind,
        url: &str,
        raw_retry: Duration,
    ) -> Result<Participant, String> {
        let peer = Peer::connect(kind, url, raw_retry).await?;
        let data = data_connection(url).await?;
        Participant::warmed_up(peer, data, kind.id()).await
    }

    /// `peer`, with `data` for its sections, once warmed up under the name `id`.
    pub(crate) async fn warmed_up(
        peer: Peer,
        data: MultiplexedConnection,
        id: &str,
    ) -> Result<Participant, String> {
        let participant = Participant {
            peer: Arc::new(peer),
            data,
        };
        let warm_up = format!("bench:warm-up:{id}:{}", std::process::id());
        for _ in 0..2 {
            let held = participant.peer.acquire(&warm_up).await?;
            participant.peer.release(held).await?;
        }
        let _: Option<u64> = redis::cmd("GET")
            .arg(&warm_up)
            .query_async(&mut participant.data.clone())
            .await
            .map_err(|e| e.to_string())?;
        Ok(participant)
    }

    /// The median sections per second of each of `participants` in `scenario`,
    /// run back to back each round with a different one first, to spread drift;
    /// their keys under `bench:<section>:`.
    pub(crate) async fn median_rates_in_turn(
        participants: &[Participant],
        scenario: &Scenario,
        section: &str,
    ) -> Vec<Option<f64>> {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); participants.len()];
        for round in 0..scenario.rounds {
            for turn in 0..participants.len() {
                let which = (round + turn) % participants.len();
                let prefix = format!("bench:{section}:{}:{which}:round-{round}", scenario.slug);
                let (tally, elapsed) = participants[which].run_scenario(&prefix, scenario).await;
                rates[which].push(tally.completed as f64 / elapsed.as_secs_f64());
            }
        }
        rates.iter().map(|rates| median(rates)).collect()
    }

    /// `scenario` in this process.
    pub(crate) async fn run_scenario(
        &self,
        prefix: &str,
        scenario: &Scenario,
    ) -> (Tally, Duration) {
        self.run(
            prefix,
            scenario.tasks,
            scenario.sections,
            scenario.contention,
        )
        .await
    }

    /// `tasks` tasks, released together, each running `sections` sections.
    pub(crate) async fn run(
        &self,
        prefix: &str,
        tasks: usize,
        sections: usize,
        contention: Contention,
    ) -> (Tally, Duration) {
        let before = Usage::of_this_process();
        let start = Arc::new(Barrier::new(tasks + 1));
        let mut running = JoinSet::new();
        for task in 0..tasks {
            let (peer, data, start) = (self.peer.clone(), self.data.clone(), start.clone());
            let key = match contention {
                Contention::DistinctKeys => format!("{prefix}:lock:{task}"),
                Contention::HotKey => format!("{prefix}:lock"),
            };
            let counter = (contention == Contention::HotKey).then(|| format!("{prefix}:counter"));
            running.spawn(async move {
                start.wait().await;
                take_turns(&peer, data, &key, counter.as_deref(), sections).await
            });
        }
        // Gathered by a task on the runtime, not by this caller, which runs on a thread
        // of its own: there, each task that ended woke that thread, a thread switch
        // on the clients' core charged to the sections, once per task.
        let gathering = tokio::spawn(async move {
            let mut tally = Tally::default();
            while let Some(joined) = running.join_next().await {
                match joined {
                    Ok(task) => tally.merge(task),
                    Err(panicked) => tally.fail(format!("a task panicked: {panicked}")),
                }
            }
            tally
        });
        start.wait().await;
        let started = Instant::now();
        let mut tally = gathering.await.unwrap_or_else(|panicked| {
            let mut tally = Tally::default();
            tally.fail(format!("gathering the tasks panicked: {panicked}"));
            tally
        });
        let elapsed = started.elapsed();
        tally.usage = Usage::of_this_process()
            .zip(before)
            .map(|(after, before)| after.since(before));
        (tally, elapsed)
    }
}

/// CPU time and the number of times threads were put on a CPU, summed over a
/// process's threads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Usage {
    pub(crate) cpu: Duration,
    /// Each one a thread woken or preempted and scheduled again.
    pub(crate) switches: u64,
    /// Heap allocations, by every thread of the process.
    pub(crate) allocations: u64,
    /// Write system calls (`write`, `writev`, ...), by every thread of the process:
    /// each one sends what was queued on a socket.
    pub(crate) writes: u64,
}

impl Usage {
    /// From Linux's per-thread schedstat (nanoseconds on CPU, then time waiting,
    /// then timeslices run) and the process's I/O counts; `None` elsewhere.
    pub(crate) fn of_this_process() -> Option<Usage> {
        let mut usage = Usage::default();
        for thread in std::fs::read_dir("/proc/self/task").ok()? {
            let Ok(stat) = std::fs::read_to_string(thread.ok()?.path().join("schedstat")) else {
                // The thread ended meanwhile.
                continue;
            };
            let fields: Vec<u64> = stat
                .split_whitespace()
                .map(|field| field.parse().ok())
                .collect::<Option<_>>()?;
            usage.cpu += Duration::from_nanos(*fields.first()?);
            usage.switches += *fields.get(2)?;
        }
        usage.allocations = crate::ALLOCATOR.stats().allocations as u64;
        let io = std::fs::read_to_string("/proc/self/io").ok()?;
        usage.writes = io
            .lines()
            .find_map(|line| line.strip_prefix("syscw: "))?
            .parse()
            .ok()?;
        Some(usage)
    }

    pub(crate) fn since(self, earlier: Usage) -> Usage {
        Usage {
            cpu: self.cpu.saturating_sub(earlier.cpu),
            switches: self.switches.saturating_sub(earlier.switches),
            allocations: self.allocations.saturating_sub(earlier.allocations),
            writes: self.writes.saturating_sub(earlier.writes),
        }
    }

    fn plus(self, other: Usage) -> Usage {
        Usage {
            cpu: self.cpu + other.cpu,
            switches: self.switches + other.switches,
            allocations: self.allocations + other.allocations,
            writes: self.writes + other.writes,
        }
    }
}

/// The CPU time redis-server has used since it started, from `INFO cpu`.
pub(crate) async fn redis_cpu(checker: &MultiplexedConnection) -> Option<Duration> {
    let info: String = redis::cmd("INFO")
        .arg("cpu")
        .query_async(&mut checker.clone())
        .await
        .ok()?;
    let seconds = |field: &str| -> Option<f64> {
        info.lines()
            .find_map(|line| line.strip_prefix(field))?
            .trim()
            .parse()
            .ok()
    };
    Some(Duration::from_secs_f64(
        seconds("used_cpu_sys:")? + seconds("used_cpu_user:")?,
    ))
}

/// A plain connection for the sections' GET and SET, and for checking counters.
pub(crate) async fn data_connection(url: &str) -> Result<MultiplexedConnection, String> {
    data_connection_of(&Client::open(url).map_err(|e| e.to_string())?).await
}

pub(crate) async fn data_connection_of(client: &Client) -> Result<MultiplexedConnection, String> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| e.to_string())
}

async fn take_turns(
    peer: &Peer,
    mut data: MultiplexedConnection,
    key: &str,
    counter: Option<&str>,
    sections: usize,
) -> Tally {
    let mut tally = Tally::default();
    let began = Instant::now();
    for _ in 0..sections {
        let asked = Instant::now();
        let held = match peer.acquire(key).await {
            Ok(held) => held,
            Err(error) => {
                tally.fail(format!("acquire: {error}"));
                continue;
            }
        };
        tally.waits.push(asked.elapsed());
        let section = match counter {
            Some(counter) => increment(&mut data, counter).await,
            None => Ok(()),
        };
        if section.is_ok() && counter.is_some() {
            tally.increments += 1;
        }
        let releasing = Instant::now();
        let released = peer.release(held).await;
        tally.releases.push(releasing.elapsed());
        match (section, released) {
            (Ok(()), Ok(())) => {
                tally.completed += 1;
                tally.ends.push(began.elapsed());
            }
            (Err(error), _) => tally.fail(format!("section: {error}")),
            (_, Err(error)) => tally.fail(format!("release: {error}")),
        }
    }
    tally
}

/// The critical section: a read-modify-write that loses updates unless the lock
/// keeps every other holder out.
async fn increment(data: &mut MultiplexedConnection, counter: &str) -> Result<(), String> {
    let value: Option<u64> = redis::cmd("GET")
        .arg(counter)
        .query_async(data)
        .await
        .map_err(|e| e.to_string())?;
    redis::cmd("SET")
        .arg(counter)
        .arg(value.unwrap_or(0) + 1)
        .query_async::<()>(data)
        .await
        .map_err(|e| e.to_string())
}

/// One run of `scenario` by `kind`, against the server at `url`: what the tasks
/// did, and the time from starting them to the last one finishing.
pub(crate) async fn run_once(
    scenario: &Scenario,
    kind: PeerKind,
    participant: Option<&Participant>,
    url: &str,
    prefix: &str,
    raw_retry: Duration,
    before_start: impl FnOnce(),
) -> (Tally, Duration) {
    if scenario.processes > 1 {
        return run_processes(scenario, kind, url, prefix, raw_retry, before_start).await;
    }
    let Some(participant) = participant else {
        unreachable!("an in-process run needs a connected participant");
    };
    before_start();
    participant.run_scenario(prefix, scenario).await
}

/// Reads the hot key's counter after a run; `None` for scenarios without one.
pub(crate) async fn check_counter(
    scenario: &Scenario,
    checker: &MultiplexedConnection,
    prefix: &str,
    tally: &Tally,
) -> Option<CounterCheck> {
    if scenario.contention != Contention::HotKey {
        return None;
    }
    let found: Result<Option<u64>, _> = redis::cmd("GET")
        .arg(format!("{prefix}:counter"))
        .query_async(&mut checker.clone())
        .await;
    Some(CounterCheck {
        expected: tally.increments,
        found: found
            .map(|value| value.unwrap_or(0))
            .map_err(|e| e.to_string()),
    })
}

/// The counting pass: the same run through a [`CountingProxy`], counted from after
/// the clients have connected and warmed up until every request of the run is in.
pub(crate) async fn count_once(
    scenario: &Scenario,
    kind: PeerKind,
    redis_port: u16,
    checker: &MultiplexedConnection,
    prefix: &str,
    raw_retry: Duration,
) -> Result<Counted, String> {
    let proxy = CountingProxy::start(redis_port).await;
    let participant = if scenario.processes > 1 {
        None
    } else {
        Some(Participant::connect(kind, &proxy.url(), raw_retry).await?)
    };
    let server_before = command_times(checker).await;
    let (tally, elapsed) = run_once(
        scenario,
        kind,
        participant.as_ref(),
        &proxy.url(),
        prefix,
        raw_retry,
        || drop(proxy.take()),
    )
    .await;
    // Releases and unsubscribes that finish in the background count too.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let counts = proxy.take();
    let server_after = command_times(checker).await;
    let server_time = match (server_before, server_after) {
        (Ok(before), Ok(after)) => Some(server_time(&counts, &before, &after)),
        _ => None,
    };
    let counter = check_counter(scenario, checker, prefix, &tally).await;
    Ok(Counted {
        counts,
        server_time,
        run: RunResult {
            tally,
            elapsed,
            counter,
            redis_cpu: None,
        },
    })
}

/// Microseconds Redis spent in each command so far, by the proxy's names
/// (`cmdstat_client|setinfo` is `CLIENT SETINFO`).
async fn command_times(checker: &MultiplexedConnection) -> Result<BTreeMap<String, u64>, String> {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut checker.clone())
        .await
        .map_err(|e| e.to_string())?;
    Ok(info
        .lines()
        .filter_map(|line| {
            let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let usec = stats
                .split(',')
                .find_map(|field| field.strip_prefix("usec="))?
                .parse()
                .ok()?;
            Some((name.replace('|', " ").to_ascii_uppercase(), usec))
        })
        .collect())
}

/// Redis's time in the commands sent at top level during the pass. A script's
/// time includes the commands it runs; a command name sent both at top level and
/// inside a script would be counted twice, which the uncontended scenarios, where
/// this is reported, never do.
fn server_time(
    counts: &CommandCounts,
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> Duration {
    let usec: u64 = counts
        .iter()
        .filter(|(name, _)| !SETUP_COMMANDS.contains(name))
        .map(|(name, _)| {
            let was = before.get(name).copied().unwrap_or(0);
            after.get(name).copied().unwrap_or(0).saturating_sub(was)
        })
        .sum();
    Duration::from_micros(usec)
}

/// Worker processes, each running `scenario.tasks` tasks on the same hot key; the
/// run is timed from telling them all to start until the last one reports.
async fn run_processes(
    scenario: &Scenario,
    kind: PeerKind,
    url: &str,
    prefix: &str,
    raw_retry: Duration,
    before_start: impl FnOnce(),
) -> (Tally, Duration) {
    let failed = |error: String| {
        let mut tally = Tally::default();
        tally.fail(error);
        (tally, Duration::ZERO)
    };
    let mut workers = Vec::new();
    for _ in 0..scenario.processes {
        match Worker::spawn(scenario, kind, url, prefix, raw_retry) {
            Ok(worker) => workers.push(worker),
            Err(error) => return failed(error),
        }
    }
    for worker in &mut workers {
        match tokio::time::timeout(WORKER_PATIENCE, worker.next_line()).await {
            Ok(Ok(line)) if line == "READY" => {}
            Ok(Ok(line)) => return failed(format!("a worker said {line:?} instead of READY")),
            Ok(Err(error)) => return failed(error),
            Err(_) => return failed("a worker did not get ready in time".to_owned()),
        }
    }
    before_start();
    let started = Instant::now();
    for worker in &mut workers {
        if let Err(error) = worker.stdin.write_all(b"GO\n").await {
            return failed(format!("could not start a worker: {error}"));
        }
        let _ = worker.stdin.flush().await;
    }
    let mut tally = Tally::default();
    let mut usage = Some(Usage::default());
    let mut reports = Vec::new();
    for worker in &mut workers {
        match tokio::time::timeout(WORKER_PATIENCE, worker.report()).await {
            Ok(Ok(report)) => {
                usage = usage
                    .zip(report.usage)
                    .map(|(sum, worker)| sum.plus(worker));
                reports.push(report);
            }
            Ok(Err(error)) => {
                usage = None;
                tally.fail(error);
            }
            Err(_) => {
                usage = None;
                tally.fail("a worker did not finish in time".to_owned());
            }
        }
    }
    let elapsed = started.elapsed();
    if reports.len() == workers.len() {
        tally.shares = shares(&reports);
    }
    for report in reports {
        tally.merge(report);
    }
    tally.usage = usage;
    for mut worker in workers {
        let _ = worker.child.wait().await;
    }
    (tally, elapsed)
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: tokio::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn spawn(
        scenario: &Scenario,
        kind: PeerKind,
        url: &str,
        prefix: &str,
        raw_retry: Duration,
    ) -> Result<Worker, String> {
        let exe = std::env::current_exe().map_err(|e| format!("the bench's own path: {e}"))?;
        let mut child = Command::new(exe)
            .arg("worker")
            .args(["--peer", kind.id(), "--url", url, "--prefix", prefix])
            .args(["--tasks", &scenario.tasks.to_string()])
            .args(["--sections", &scenario.sections.to_string()])
            .args(["--raw-retry-ms", &raw_retry.as_millis().to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| format!("could not start a worker process: {e}"))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
        Ok(Worker {
            child,
            stdin,
            stdout,
        })
    }

    async fn next_line(&mut self) -> Result<String, String> {
        match self.stdout.next_line().await {
            Ok(Some(line)) => Ok(line),
            Ok(None) => Err("a worker exited early".to_owned()),
            Err(error) => Err(format!("reading a worker: {error}")),
        }
    }

    /// `ERROR <text>` lines, then `DONE <completed> <increments> <failures> <waits µs,...>`.
    async fn report(&mut self) -> Result<Tally, String> {
        let mut errors = Vec::new();
        loop {
            let line = self.next_line().await?;
            if let Some(error) = line.strip_prefix("ERROR ") {
                errors.push(error.to_owned());
                continue;
            }
            let Some(done) = line.strip_prefix("DONE ") else {
                return Err(format!("a worker said {line:?}"));
            };
            let mut tally = parse_done(done).ok_or_else(|| format!("a worker said {line:?}"))?;
            tally.errors = errors;
            return Ok(tally);
        }
    }
}

pub(crate) fn format_done(tally: &Tally) -> String {
    let waits: Vec<String> = tally
        .waits
        .iter()
        .map(|wait| wait.as_micros().to_string())
        .collect();
    let (cpu, switches, allocations, writes) = tally.usage.map_or((-1, -1, -1, -1), |usage| {
        (
            usage.cpu.as_micros() as i64,
            usage.switches as i64,
            usage.allocations as i64,
            usage.writes as i64,
        )
    });
    let ends: Vec<String> = tally
        .ends
        .iter()
        .map(|end| end.as_micros().to_string())
        .collect();
    format!(
        "DONE {} {} {} {cpu} {switches} {allocations} {writes} {} {}",
        tally.completed,
        tally.increments,
        tally.failures,
        waits.join(","),
        ends.join(",")
    )
}

fn parse_done(done: &str) -> Option<Tally> {
    let mut fields = done.split(' ');
    let mut number = || fields.next()?.parse::<u64>().ok();
    let (completed, increments, failures) = (number()?, number()?, number()?);
    let cpu: i64 = fields.next()?.parse().ok()?;
    let switches: i64 = fields.next()?.parse().ok()?;
    let allocations: i64 = fields.next()?.parse().ok()?;
    let writes: i64 = fields.next()?.parse().ok()?;
    let usage = (|| {
        Some(Usage {
            cpu: Duration::from_micros(u64::try_from(cpu).ok()?),
            switches: u64::try_from(switches).ok()?,
            allocations: u64::try_from(allocations).ok()?,
            writes: u64::try_from(writes).ok()?,
        })
    })();
    let mut durations = || {
        fields
            .next()
            .unwrap_or("")
            .split(',')
            .filter(|micros| !micros.is_empty())
            .map(|micros| micros.parse().ok().map(Duration::from_micros))
            .collect::<Option<Vec<_>>>()
    };
    let (waits, ends) = (durations()?, durations()?);
    Some(Tally {
        completed,
        increments,
        failures,
        waits,
        ends,
        shares: Vec::new(),
        releases: Vec::new(),
        usage,
        errors: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_reports_round_trip() {
        let tally = Tally {
            completed: 3,
            increments: 3,
            failures: 1,
            waits: vec![Duration::from_micros(5), Duration::from_micros(70)],
            ends: vec![Duration::from_micros(90), Duration::from_micros(300)],
            shares: Vec::new(),
            releases: Vec::new(),
            usage: Some(Usage {
                cpu: Duration::from_micros(1_234),
                switches: 56,
                allocations: 789,
                writes: 12,
            }),
            errors: Vec::new(),
        };
        let line = format_done(&tally);
        let parsed = parse_done(line.strip_prefix("DONE ").unwrap()).unwrap();
        assert_eq!(
            (parsed.completed, parsed.increments, parsed.failures),
            (3, 3, 1)
        );
        assert_eq!(parsed.waits, tally.waits);
        assert_eq!(parsed.ends, tally.ends);
        assert_eq!(parsed.usage, tally.usage);
    }
}
