//! The cost of replica sync: the library's in-process scenarios on a primary with one
//! replica attached, which each grant waits for, beside the same runs on a primary
//! alone, and through Sentinel on a primary with one replica, where each round of
//! confirmations also asks the Sentinels whether that primary is still theirs: round
//! by round in one run.

use std::fmt::Write;
use std::time::{Duration, Instant};

use lock_tests::{RedisServer, SentinelGroup};

use crate::peers::{Peer, PeerKind};
use crate::placement;
use crate::scenarios::{Participant, Scenario, data_connection};
use crate::stats::median;

/// One scenario's medians alone, with the replica and through Sentinel, and what
/// the primary and the Sentinels were asked per section.
struct Cost {
    name: String,
    alone: Option<f64>,
    replicated: Option<f64>,
    through_sentinel: Option<f64>,
    waits_per_section: Option<f64>,
    sentinel_commands_per_section: Option<f64>,
}

/// Where one way runs, and what its sections cost there.
struct Way<'a> {
    participant: Participant,
    primary: &'a RedisServer,
    sentinels: &'a [RedisServer],
    rates: Vec<f64>,
    sections: u64,
    waits: u64,
    commands: u64,
}

/// The "Replica sync" section of the report; empty when no scenario applies.
pub(crate) async fn replica_sync(scenarios: &[Scenario], raw_retry: Duration) -> String {
    let scenarios: Vec<&Scenario> = scenarios.iter().filter(|s| s.processes == 1).collect();
    if scenarios.is_empty() {
        return String::new();
    }
    let alone = RedisServer::start();
    let primary = RedisServer::start();
    let port = primary.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    // Down-after long enough that no stall of this machine fails the primary over.
    let group = SentinelGroup::start(Duration::from_secs(30));
    let group_servers = [&group.primary, &group.replica];
    for server in [&alone, &primary, &replica]
        .into_iter()
        .chain(group_servers)
    {
        placement::serve(server);
    }
    group.sentinels.iter().for_each(placement::serve);
    wait_for_sync(&primary);
    let connect = async |server: &RedisServer| {
        Participant::connect(PeerKind::Library, &server.url(), raw_retry).await
    };
    let through_sentinel = async || {
        let urls = group.sentinel_urls();
        let peer = Peer::library_through_sentinel(&urls, group.name).await?;
        let data = data_connection(&group.primary.url()).await?;
        Participant::warmed_up(peer, data, "library-sentinel").await
    };
    let (on_alone, on_primary, on_sentinel) = match (
        connect(&alone).await,
        connect(&primary).await,
        through_sentinel().await,
    ) {
        (Ok(on_alone), Ok(on_primary), Ok(on_sentinel)) => (on_alone, on_primary, on_sentinel),
        (Err(error), _, _) | (_, Err(error), _) | (_, _, Err(error)) => {
            return format!("## Replica sync\n\nNot measured: {error}\n\n");
        }
    };
    let mut ways = [
        Way::new(on_alone, &alone, &[]),
        Way::new(on_primary, &primary, &[]),
        Way::new(on_sentinel, &group.primary, &group.sentinels),
    ];
    let labels = ["no replica", "1 replica", "sentinel"];
    let mut costs = Vec::new();
    for scenario in scenarios {
        ways.iter_mut().for_each(Way::reset);
        for round in 0..scenario.rounds {
            let prefix = format!("bench:replicas:{}:round-{round}", scenario.slug);
            // A different one first each round, to spread drift.
            for turn in 0..ways.len() {
                let which = (round + turn) % ways.len();
                let rate = ways[which].run(&prefix, scenario).await;
                eprintln!(
                    "replica sync: {:<15} {:<12} {rate:>9.0}/s",
                    scenario.slug, labels[which]
                );
            }
        }
        let [alone, replicated, sentinel] = &ways;
        costs.push(Cost {
            name: scenario.name.clone(),
            alone: median(&alone.rates),
            replicated: median(&replicated.rates),
            through_sentinel: median(&sentinel.rates),
            waits_per_section: replicated.per_section(replicated.waits),
            sentinel_commands_per_section: sentinel.per_section(sentinel.commands),
        });
    }
    markdown(&costs)
}

impl<'a> Way<'a> {
    fn new(
        participant: Participant,
        primary: &'a RedisServer,
        sentinels: &'a [RedisServer],
    ) -> Self {
        Way {
            participant,
            primary,
            sentinels,
            rates: Vec::new(),
            sections: 0,
            waits: 0,
            commands: 0,
        }
    }

    fn reset(&mut self) {
        self.rates.clear();
        (self.sections, self.waits, self.commands) = (0, 0, 0);
    }

    /// One round of `scenario`: its sections per second.
    async fn run(&mut self, prefix: &str, scenario: &Scenario) -> f64 {
        let (waits, commands) = (self.primary.calls("wait"), self.sentinel_commands());
        let (tally, elapsed) = self.participant.run_scenario(prefix, scenario).await;
        let rate = tally.completed as f64 / elapsed.as_secs_f64();
        self.rates.push(rate);
        self.sections += tally.completed;
        self.waits += self.primary.calls("wait") - waits;
        self.commands += self.sentinel_commands() - commands;
        rate
    }

    /// What the Sentinels have processed: they keep no `INFO commandstats`, so this
    /// counts their own pings and hellos to each other too.
    fn sentinel_commands(&self) -> u64 {
        self.sentinels.iter().map(commands_processed).sum()
    }

    fn per_section(&self, count: u64) -> Option<f64> {
        (self.sections > 0).then(|| count as f64 / self.sections as f64)
    }
}

fn markdown(costs: &[Cost]) -> String {
    let mut out = String::from("## Replica sync\n\n");
    out.push_str(
        "The library alone, on a primary with one replica attached (each grant and renewal \
         waits for it, one `WAIT` for the grants that arrive together), on a primary \
         without one (no wait), and through Sentinel (three Sentinels) on a primary with \
         one replica, where each round of confirmations also asks every Sentinel \
         `SENTINEL MASTER`: median sections per second of the same rounds. `WAIT`s per \
         section is counted from the primary's `INFO commandstats` (below 1 is the group \
         commit at work); the Sentinels keep no command statistics, so their count is every \
         command they processed, their own chatter included (about a dozen a second).\n\n",
    );
    out.push_str(
        "| Scenario | No replica | 1 replica | Ratio | Through Sentinel | ÷ 1 replica | \
         `WAIT`s per section | Sentinel commands per section |\n",
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let shown = |value: Option<f64>, format: fn(f64) -> String| value.map_or("–".into(), format);
    let rate = |rate: f64| format!("{rate:.0}");
    let ratio = |ratio: f64| format!("{ratio:.2}×");
    let count = |count: f64| format!("{count:.2}");
    for cost in costs {
        let over = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a / b);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            cost.name,
            shown(cost.alone, rate),
            shown(cost.replicated, rate),
            shown(over(cost.replicated, cost.alone), ratio),
            shown(cost.through_sentinel, rate),
            shown(over(cost.through_sentinel, cost.replicated), ratio),
            shown(cost.waits_per_section, count),
            shown(cost.sentinel_commands_per_section, count),
        );
    }
    out.push('\n');
    out
}

fn commands_processed(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut server.connection())
        .unwrap_or_default();
    info.lines()
        .find_map(|line| line.strip_prefix("total_commands_processed:"))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

fn wait_for_sync(primary: &RedisServer) {
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(10) {
        let info: redis::RedisResult<String> = redis::cmd("INFO")
            .arg("replication")
            .query(&mut primary.connection());
        if info.is_ok_and(|info| info.contains("state=online")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
