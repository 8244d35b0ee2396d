//! The cost of keeping many locks: one client takes thousands of locks on short
//! watchdog leases and holds them, while the bench measures what the renewals cost
//! each side, how many commands Redis runs for them, and the memory each held lock
//! takes in the client. Beside it, Redis's floor: what the same server spends when
//! each of as many keys gets one bare `PEXPIREAT` as often, with no owner check.

use std::fmt::Write;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lock_runtime::{LockClient, LockGuard, LockOptions};
use lock_tests::RedisServer;
use tokio::task::JoinSet;

use crate::placement;
use crate::scenarios::{Usage, data_connection, redis_cpu};
use crate::stats::{lowest_and_highest, median};

/// Each lock's lease, renewed by the watchdog every third of it.
const LEASE: Duration = Duration::from_secs(3);
/// How long the holding is measured, after the first renewals have begun.
const MEASURED: Duration = Duration::from_secs(6);
/// The goal: this many locks held cost each side at most this share of one core
/// (issue 19).
const GOAL_LOCKS: usize = 50_000;
const GOAL_PERCENT: f64 = 10.0;
/// How many `PEXPIREAT`s the floor sends in one write, as the keeper renews.
const FLOOR_BATCH: usize = 256;

struct Held {
    client_cpu: Duration,
    redis_cpu: Option<Duration>,
    redis_floor_cpu: Option<Duration>,
    commands: Option<u64>,
    bytes_per_lock: f64,
    still_held: usize,
}

/// The "Keeping many locks" section of the report: `rounds` rounds, each holding
/// every count in turn.
pub(crate) async fn keeping_many_locks(counts: &[usize], rounds: usize) -> String {
    let mut out = format!(
        "## Keeping many locks\n\n\
         One client takes this many locks, each on a 3 s lease renewed by the watchdog \
         every second, and holds them; measured over 6 s once the renewals run, on a \
         redis-server of its own. CPU is given as a share of one core: the median of \
         {rounds} rounds, with the lowest and highest in brackets. Memory: the bytes \
         the client's heap grew by per lock held, from before the locks were taken to \
         the end of the measured time (median). Redis's floor: a redis-server of its \
         own holding as many keys, each given one `PEXPIREAT` a second, {FLOOR_BATCH} \
         to a write, with no check of who holds it: about the least a lease kept per \
         key and renewed every second costs Redis here.\n\n\
         | Locks held | Client CPU | Redis CPU | Redis's floor | Redis commands/s | Memory per held lock | Still held at the end (fewest) |\n\
         |--:|--:|--:|--:|--:|--:|--:|\n",
    );
    let mut held: Vec<Vec<Held>> = counts.iter().map(|_| Vec::new()).collect();
    let mut failures: Vec<Option<String>> = counts.iter().map(|_| None).collect();
    for _ in 0..rounds {
        for (index, &locks) in counts.iter().enumerate() {
            match hold(locks).await {
                Ok(run) => held[index].push(run),
                Err(error) => failures[index] = Some(error),
            }
        }
    }
    let mut verdict = None;
    for ((&locks, runs), failure) in counts.iter().zip(held).zip(failures) {
        if let Some(error) = failure {
            let _ = writeln!(out, "| {locks} | failed: {error} | | | | | |");
            continue;
        }
        let percents = |cpu: &dyn Fn(&Held) -> Option<Duration>| -> Vec<f64> {
            runs.iter()
                .filter_map(cpu)
                .map(|cpu| 100.0 * cpu.as_secs_f64() / MEASURED.as_secs_f64())
                .collect()
        };
        let (client, redis, floor) = (
            percents(&|run| Some(run.client_cpu)),
            percents(&|run| run.redis_cpu),
            percents(&|run| run.redis_floor_cpu),
        );
        let of = |value: &dyn Fn(&Held) -> Option<f64>| {
            median(&runs.iter().filter_map(value).collect::<Vec<_>>())
        };
        let _ = writeln!(
            out,
            "| {locks} | {} | {} | {} | {} | {} | {} of {locks} |",
            share(&client),
            share(&redis),
            share(&floor),
            of(&|run| run.commands.map(|commands| commands as f64)).map_or(
                "n/a".to_owned(),
                |commands| format!("{:.0}", commands / MEASURED.as_secs_f64())
            ),
            of(&|run| Some(run.bytes_per_lock))
                .map_or("n/a".to_owned(), |bytes| format!("{bytes:.0} B")),
            runs.iter().map(|run| run.still_held).min().unwrap_or(0),
        );
        if locks == GOAL_LOCKS {
            verdict = goal_verdict(median(&client), median(&redis), median(&floor));
        }
    }
    if let Some(verdict) = verdict {
        let _ = write!(out, "\n{verdict}\n");
    }
    out.push('\n');
    out
}

/// A median share of one core, with the lowest and highest in brackets.
fn share(percents: &[f64]) -> String {
    let (lowest, highest) = lowest_and_highest(percents);
    median(percents).map_or("n/a".to_owned(), |median| {
        format!("{median:.1}% ({lowest:.1}–{highest:.1}%)")
    })
}

fn goal_verdict(client: Option<f64>, redis: Option<f64>, floor: Option<f64>) -> Option<String> {
    let (client, redis) = (client?, redis?);
    let met = client <= GOAL_PERCENT && redis <= GOAL_PERCENT;
    let mut verdict = format!(
        "{GOAL_LOCKS} locks held at {GOAL_PERCENT:.0}% of a core or less on each side, \
         the medians: **{}** (client {client:.1}%, Redis {redis:.1}%).",
        if met { "met" } else { "missed" }
    );
    if let Some(floor) = floor.filter(|&floor| floor > GOAL_PERCENT) {
        let _ = write!(
            verdict,
            " Redis's floor read {floor:.1}%: on this machine, one bare `PEXPIREAT` per \
             lock a second, with no check of who holds it, already costs Redis more than \
             the goal."
        );
    }
    Some(verdict)
}

async fn hold(locks: usize) -> Result<Held, String> {
    let server = RedisServer::start();
    placement::serve(&server);
    let checker = data_connection(&server.url()).await?;
    let client = LockClient::connect(&server.url())
        .await
        .map_err(|error| error.to_string())?;
    let options = LockOptions::new().lease(LEASE).watchdog(true);
    let heap_before = crate::heap_in_use();
    let guards = take(&client, &options, locks).await?;
    // The first renewals come a third of a lease after each lock was taken.
    tokio::time::sleep(LEASE / 2).await;
    let started = Instant::now();
    let (usage, cpu, commands) = (
        Usage::of_this_process(),
        redis_cpu(&checker).await,
        commands_processed(&checker).await,
    );
    tokio::time::sleep(MEASURED.saturating_sub(started.elapsed())).await;
    let client_cpu = Usage::of_this_process()
        .zip(usage)
        .map(|(after, before)| after.since(before).cpu)
        .ok_or("no CPU figures on this system")?;
    let redis_cpu = redis_cpu(&checker)
        .await
        .zip(cpu)
        .map(|(after, before)| after.saturating_sub(before));
    let commands = commands_processed(&checker)
        .await
        .zip(commands)
        .map(|(after, before)| after.saturating_sub(before));
    let bytes_per_lock = (crate::heap_in_use() - heap_before) as f64 / locks as f64;
    let still_held = guards.iter().filter(|guard| guard.is_held()).count();
    drop(guards);
    client.shutdown().await;
    Ok(Held {
        client_cpu,
        redis_cpu,
        redis_floor_cpu: redis_floor(locks).await?,
        commands,
        bytes_per_lock,
        still_held,
    })
}

/// What a redis-server of its own spends over `MEASURED` while each of `keys` keys,
/// set as a lock is, gets one bare `PEXPIREAT` every third of a lease.
async fn redis_floor(keys: usize) -> Result<Option<Duration>, String> {
    let server = RedisServer::start();
    placement::serve(&server);
    let mut connection = data_connection(&server.url()).await?;
    let names: Vec<String> = (0..keys).map(|key| format!("kept:{key}")).collect();
    let token = uuid::Uuid::new_v4().to_string();
    let lease_ms = LEASE.as_millis() as u64;
    let set = |name: &str| {
        let mut set = redis::cmd("SET");
        set.arg(name).arg(&token).arg("PX").arg(lease_ms);
        set
    };
    on_each_key(&mut connection, &names, set).await?;
    let (before, started) = (redis_cpu(&connection).await, Instant::now());
    for renewal in 1..=(MEASURED.as_millis() / (LEASE / 3).as_millis()) as u32 {
        let ends_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_err(|error| error.to_string())?
            .as_millis() as u64
            + lease_ms;
        let renew = |name: &str| {
            let mut renew = redis::cmd("PEXPIREAT");
            renew.arg(name).arg(ends_ms);
            renew
        };
        on_each_key(&mut connection, &names, renew).await?;
        tokio::time::sleep_until((started + LEASE / 3 * renewal).into()).await;
    }
    let after = redis_cpu(&connection).await;
    Ok(after
        .zip(before)
        .map(|(after, before)| after.saturating_sub(before)))
}

/// Sends `command` for each of `names`, `FLOOR_BATCH` to a write.
async fn on_each_key(
    connection: &mut redis::aio::MultiplexedConnection,
    names: &[String],
    command: impl Fn(&str) -> redis::Cmd,
) -> Result<(), String> {
    for chunk in names.chunks(FLOOR_BATCH) {
        let mut pipe = redis::pipe();
        for name in chunk {
            pipe.add_command(command(name)).ignore();
        }
        pipe.query_async::<()>(connection)
            .await
            .map_err(|error| error.to_string())?;
    }
    Ok(())
}

/// `locks` locks of one client, taken 500 at a time.
async fn take(
    client: &LockClient,
    options: &LockOptions,
    locks: usize,
) -> Result<Vec<LockGuard>, String> {
    let mut guards = Vec::with_capacity(locks);
    let mut taking = JoinSet::new();
    for lock in 0..locks {
        let (client, options) = (client.clone(), options.clone());
        taking.spawn(async move { client.acquire(&format!("kept:{lock}"), &options).await });
        if taking.len() == 500 || lock + 1 == locks {
            while let Some(taken) = taking.join_next().await {
                let guard = taken
                    .map_err(|panicked| panicked.to_string())?
                    .map_err(|error| error.to_string())?;
                guards.push(guard);
            }
        }
    }
    Ok(guards)
}

/// How many commands the server has run since it started.
async fn commands_processed(checker: &redis::aio::MultiplexedConnection) -> Option<u64> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut checker.clone())
        .await
        .ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("total_commands_processed:"))?
        .trim()
        .parse()
        .ok()
}
