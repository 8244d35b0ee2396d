//! `lock-bench`: this library side by side with the raw two-round-trip protocol and
//! rslock, on a redis-server of its own. `scripts/bench` runs it and it writes
//! BENCHMARKS.md. See `--help`.

mod chart;
mod demo;
mod holding;
mod peers;
mod placement;
mod replicas;
mod report;
mod scenarios;
mod servers;
mod stats;
mod tls;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use lock_tests::RedisServer;
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};

use crate::peers::PeerKind;
use crate::report::{Measured, Report, ScenarioResult};
use crate::scenarios::{
    Contention, Participant, RunResult, Scenario, check_counter, count_once, data_connection,
    redis_cpu, run_once,
};

const USAGE: &str = "\
lock-bench: lock-runtime against the raw SET NX protocol and rslock, on its own redis-server

usage: lock-bench [--out PATH] [--quick] [--rounds N] [--raw-retry-ms MS] [--only SLUG,...]
                  [--peers ID,...]

  --out PATH         write the report there (default BENCHMARKS.md; with --quick, stdout only)
  --quick            small counts and one round, to try the bench out
  --rounds N         rounds of every scenario (default 7 uncontended, 5 contended,
                     3 keeping, 5 demo)
  --raw-retry-ms MS  the raw protocol's sleep between tries (default 10)
  --only SLUGS       run only these scenarios: uncontended-1, uncontended-64, hot-16,
                     hot-256, steady-256 (hot-256 in rounds four times as long),
                     hot-1000, processes-4x64, keeping (10,000 and 50,000
                     locks held by one client), demo (the flash sale in memory,
                     over Redis, with only its locks in Redis, and with its stock
                     in Redis under a local mutex: its serial limit)
  --peers IDS        run only these implementations: library, library-fixed (a fixed
                     10 s lease, no watchdog), raw, raw-careful (one connection, no
                     timeout, uuid tokens), rslock, rslock-fast, serial (no lock: the
                     hot-key section by one task, the ceiling)
";

/// The allocator, counting, so that each run can report its allocations.
#[global_allocator]
static ALLOCATOR: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// The bytes the process has allocated and not freed.
fn heap_in_use() -> isize {
    let stats = ALLOCATOR.stats();
    stats.bytes_allocated as isize - stats.bytes_deallocated as isize
}

struct Options {
    out: Option<PathBuf>,
    quick: bool,
    rounds: Option<usize>,
    raw_retry: Duration,
    only: Option<Vec<String>>,
    peers: Vec<PeerKind>,
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|arg| arg == "worker") {
        return worker::main(&args[1..]);
    }
    if args.iter().any(|arg| arg == "--help" || arg == "-h") {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    let options = match parse(&args) {
        Ok(options) => options,
        Err(error) => {
            eprintln!("lock-bench: {error}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    placement::settle();
    let runtime = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let report = runtime.block_on(bench(&options));
    let markdown = report.markdown();
    println!("{markdown}");
    if let Some(out) = &options.out {
        if let Err(error) = std::fs::write(out, &markdown) {
            eprintln!("lock-bench: could not write {}: {error}", out.display());
            return ExitCode::FAILURE;
        }
        eprintln!("lock-bench: wrote {}", out.display());
        let folder = out.parent().unwrap_or(std::path::Path::new(""));
        match chart::write(&report, folder) {
            Ok(charts) => {
                for chart in charts {
                    eprintln!("lock-bench: drew {}", chart.display());
                }
            }
            Err(error) => {
                eprintln!("lock-bench: {error}");
                return ExitCode::FAILURE;
            }
        }
    }
    if report.counters_exact() {
        ExitCode::SUCCESS
    } else {
        eprintln!("lock-bench: !!! A COUNTER CAME OUT WRONG: see the table !!!");
        ExitCode::FAILURE
    }
}

fn parse(args: &[String]) -> Result<Options, String> {
    let mut options = Options {
        out: Some(PathBuf::from("BENCHMARKS.md")),
        quick: false,
        rounds: None,
        raw_retry: Duration::from_millis(10),
        only: None,
        peers: PeerKind::ALL.to_vec(),
    };
    let mut out = None;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} takes a value"));
        match arg.as_str() {
            "--out" => out = Some(PathBuf::from(value()?)),
            "--quick" => options.quick = true,
            "--rounds" => {
                let rounds = value()?.parse().map_err(|_| "--rounds takes a number")?;
                if rounds == 0 {
                    return Err("--rounds must be at least 1".to_owned());
                }
                options.rounds = Some(rounds);
            }
            "--raw-retry-ms" => {
                let ms: u64 = value()?
                    .parse()
                    .map_err(|_| "--raw-retry-ms takes a number")?;
                options.raw_retry = Duration::from_millis(ms.max(1));
            }
            "--peers" => {
                options.peers = value()?
                    .split(',')
                    .map(|id| PeerKind::from_id(id).ok_or_else(|| format!("unknown peer {id}")))
                    .collect::<Result<_, _>>()?;
            }
            "--only" => {
                options.only = Some(value()?.split(',').map(str::to_owned).collect());
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if options.quick {
        options.out = None;
    }
    if out.is_some() {
        options.out = out;
    }
    Ok(options)
}

fn scenarios(options: &Options) -> Vec<Scenario> {
    let quick = options.quick;
    let (uncontended_rounds, contended_rounds) = match (options.rounds, quick) {
        (Some(rounds), _) => (rounds, rounds),
        (None, true) => (1, 1),
        (None, false) => (7, 5),
    };
    let scenario = |slug, name: &str, processes, tasks, sections: usize, contention| Scenario {
        name: name.to_owned(),
        slug,
        processes,
        tasks,
        sections,
        contention,
        rounds: match contention {
            Contention::DistinctKeys => uncontended_rounds,
            Contention::HotKey => contended_rounds,
        },
    };
    let pick = |full: usize, small: usize| if quick { small } else { full };
    let all = vec![
        scenario(
            "uncontended-1",
            "Uncontended, 1 task",
            1,
            1,
            pick(10_000, 200),
            Contention::DistinctKeys,
        ),
        scenario(
            "uncontended-64",
            "Uncontended, 64 tasks",
            1,
            64,
            pick(4_000, 10),
            Contention::DistinctKeys,
        ),
        scenario(
            "hot-16",
            "Hot key, 16 tasks",
            1,
            16,
            pick(20, 5),
            Contention::HotKey,
        ),
        scenario(
            "hot-256",
            "Hot key, 256 tasks",
            1,
            256,
            pick(4, 1),
            Contention::HotKey,
        ),
        scenario(
            "steady-256",
            "Hot key, 256 tasks, steady",
            1,
            256,
            pick(16, 1),
            Contention::HotKey,
        ),
        scenario(
            "hot-1000",
            "Hot key, 1,000 tasks",
            1,
            1_000,
            1,
            Contention::HotKey,
        ),
        scenario(
            "processes-4x64",
            "Hot key, 4 processes × 64 tasks",
            4,
            64,
            pick(4, 1),
            Contention::HotKey,
        ),
    ];
    all.into_iter()
        .filter(|scenario| {
            options
                .only
                .as_ref()
                .is_none_or(|only| only.iter().any(|slug| slug == scenario.slug))
        })
        .collect()
}

async fn bench(options: &Options) -> Report {
    let began = Instant::now();
    let server = RedisServer::start();
    placement::serve(&server);
    let url = server.url();
    let checker = data_connection(&url)
        .await
        .expect("a connection to the bench's own redis-server");
    let mut participants = Vec::new();
    for kind in options.peers.iter().copied() {
        let connected = Participant::connect(kind, &url, options.raw_retry).await;
        if let Err(error) = &connected {
            eprintln!("lock-bench: {} could not connect: {error}", kind.id());
        }
        participants.push((kind, connected));
    }
    let mut results = Vec::new();
    let scenarios = scenarios(options);
    for scenario in scenarios.iter().cloned() {
        let mut measured: Vec<Measured> = PeerKind::ALL.into_iter().map(Measured::new).collect();
        for round in 0..scenario.rounds {
            // A different implementation goes first each round, to spread drift.
            for turn in 0..participants.len() {
                let (kind, participant) = &participants[(round + turn) % participants.len()];
                let index = PeerKind::ALL
                    .iter()
                    .position(|known| known == kind)
                    .expect("a known implementation");
                let Some(run_by) = scenario.as_run_by(*kind) else {
                    continue;
                };
                let prefix = format!("bench:{}:{}:round-{round}", scenario.slug, kind.id());
                let run = match participant {
                    Ok(participant) => {
                        timed_run(
                            &run_by,
                            *kind,
                            participant,
                            &url,
                            &checker,
                            &prefix,
                            options,
                        )
                        .await
                    }
                    Err(error) => RunResult::failed(format!("connect: {error}")),
                };
                progress(
                    &scenario,
                    *kind,
                    &format!("round {}", round + 1),
                    &run,
                    began,
                );
                measured[index].rounds.push(run);
            }
        }
        for (index, kind) in PeerKind::ALL.into_iter().enumerate() {
            let Some(run_by) = scenario.as_run_by(kind) else {
                continue;
            };
            if !options.peers.contains(&kind) {
                continue;
            }
            let prefix = format!("bench:{}:{}:counted", scenario.slug, kind.id());
            let counted = count_once(
                &run_by,
                kind,
                server.port(),
                &checker,
                &prefix,
                options.raw_retry,
            )
            .await;
            match &counted {
                Ok(counted) => progress(&scenario, kind, "counted", &counted.run, began),
                Err(error) => eprintln!("lock-bench: counting {}: {error}", kind.id()),
            }
            measured[index].counted = Some(counted);
        }
        results.push(ScenarioResult {
            scenario,
            peers: measured,
        });
    }
    let replica_sync = match options.peers.contains(&PeerKind::Library) {
        true => replicas::replica_sync(&scenarios, options.raw_retry).await,
        false => String::new(),
    };
    let newer_servers = match options.peers.contains(&PeerKind::LibraryFixed)
        && options.peers.contains(&PeerKind::RawCareful)
    {
        true => servers::newer_servers_beside_redis(&scenarios, options.raw_retry).await,
        false => String::new(),
    };
    let over_tls = match options.peers.contains(&PeerKind::LibraryFixed)
        && options.peers.contains(&PeerKind::RawCareful)
    {
        true => tls::over_tls(&scenarios, options.raw_retry).await,
        false => String::new(),
    };
    let keeping = options
        .only
        .as_ref()
        .is_none_or(|only| only.iter().any(|slug| slug == "keeping"));
    let keeping = match (keeping, options.quick) {
        (false, _) => String::new(),
        (true, true) => holding::keeping_many_locks(&[1_000], options.rounds.unwrap_or(1)).await,
        (true, false) => {
            holding::keeping_many_locks(&[10_000, 50_000], options.rounds.unwrap_or(3)).await
        }
    };
    let demo = match options
        .only
        .as_ref()
        .is_none_or(|only| only.iter().any(|slug| slug == "demo"))
    {
        true => demo::flash_sale(options.rounds.unwrap_or(if options.quick { 1 } else { 5 })),
        false => String::new(),
    };
    Report {
        results,
        replica_sync,
        newer_servers,
        over_tls,
        keeping,
        demo,
        raw_retry: options.raw_retry,
        redis_version: redis_version(&server),
        placement: placement::settle().clone(),
        took: began.elapsed(),
        quick: options.quick,
        charts: options.out.is_some(),
    }
}

async fn timed_run(
    scenario: &Scenario,
    kind: PeerKind,
    participant: &Participant,
    url: &str,
    checker: &redis::aio::MultiplexedConnection,
    prefix: &str,
    options: &Options,
) -> RunResult {
    let redis_before = redis_cpu(checker).await;
    let (tally, elapsed) = run_once(
        scenario,
        kind,
        Some(participant),
        url,
        prefix,
        options.raw_retry,
        || {},
    )
    .await;
    let redis_after = redis_cpu(checker).await;
    let counter = check_counter(scenario, checker, prefix, &tally).await;
    RunResult {
        tally,
        elapsed,
        counter,
        redis_cpu: redis_after
            .zip(redis_before)
            .map(|(after, before)| after.saturating_sub(before)),
    }
}

fn progress(scenario: &Scenario, kind: PeerKind, pass: &str, run: &RunResult, began: Instant) {
    let counter = match &run.counter {
        None => String::new(),
        Some(check) if check.is_exact() => ", counter exact".to_owned(),
        Some(check) => {
            eprintln!(
                "lock-bench: !!! COUNTER WRONG: {} / {}: expected {}, found {:?} !!!",
                scenario.slug,
                kind.id(),
                check.expected,
                check.found
            );
            ", COUNTER WRONG".to_owned()
        }
    };
    eprintln!(
        "[{:>5.1} s] {:<15} {:<12} {:<8} {:>9.0}/s in {:>7.1} ms, {} failed{counter}",
        began.elapsed().as_secs_f64(),
        scenario.slug,
        kind.id(),
        pass,
        run.throughput(),
        run.elapsed.as_secs_f64() * 1e3,
        run.tally.failures,
    );
    for error in &run.tally.errors {
        eprintln!("           {error}");
    }
}

fn redis_version(server: &RedisServer) -> String {
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("server")
        .query(&mut server.connection());
    info.ok()
        .and_then(|info| {
            info.lines()
                .find_map(|line| line.strip_prefix("redis_version:"))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "unknown".to_owned())
}
