//! The cost of replica sync: the library's in-process scenarios on a primary with one
//! replica attached, which each grant waits for, beside the same runs on a primary
//! alone, round by round in one run.

use std::fmt::Write;
use std::time::{Duration, Instant};

use lock_tests::RedisServer;

use crate::peers::PeerKind;
use crate::placement;
use crate::scenarios::{Participant, Scenario};
use crate::stats::median;

/// One scenario's medians, alone and with the replica, and the `WAIT`s per section.
struct Cost {
    name: String,
    alone: Option<f64>,
    replicated: Option<f64>,
    waits_per_section: Option<f64>,
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
    for server in [&alone, &primary, &replica] {
        placement::serve(server);
    }
    wait_for_sync(&primary);
    let connect = |server: &RedisServer| {
        let url = server.url();
        async move { Participant::connect(PeerKind::Library, &url, raw_retry).await }
    };
    let (on_alone, on_primary) = match (connect(&alone).await, connect(&primary).await) {
        (Ok(on_alone), Ok(on_primary)) => (on_alone, on_primary),
        (Err(error), _) | (_, Err(error)) => {
            return format!("## Replica sync\n\nNot measured: {error}\n\n");
        }
    };
    let mut costs = Vec::new();
    for scenario in scenarios {
        let (mut alone_rates, mut replicated_rates) = (Vec::new(), Vec::new());
        let (mut sections, mut waits) = (0, 0);
        for round in 0..scenario.rounds {
            let prefix = format!("bench:replicas:{}:round-{round}", scenario.slug);
            // Alternate which goes first, to spread drift.
            for replicated in [round % 2 == 0, round % 2 == 1] {
                let (participant, server) = match replicated {
                    true => (&on_primary, &primary),
                    false => (&on_alone, &alone),
                };
                let waits_before = server.calls("wait");
                let (tally, elapsed) = participant.run_scenario(&prefix, scenario).await;
                let rate = tally.completed as f64 / elapsed.as_secs_f64();
                eprintln!(
                    "replica sync: {:<15} {:<12} {rate:>9.0}/s",
                    scenario.slug,
                    if replicated {
                        "1 replica"
                    } else {
                        "no replica"
                    }
                );
                if replicated {
                    replicated_rates.push(rate);
                    sections += tally.completed;
                    waits += server.calls("wait") - waits_before;
                } else {
                    alone_rates.push(rate);
                }
            }
        }
        costs.push(Cost {
            name: scenario.name.clone(),
            alone: median(&alone_rates),
            replicated: median(&replicated_rates),
            waits_per_section: (sections > 0).then(|| waits as f64 / sections as f64),
        });
    }
    markdown(&costs)
}

fn markdown(costs: &[Cost]) -> String {
    let mut out = String::from("## Replica sync\n\n");
    out.push_str(
        "The library alone, on a primary with one replica attached (each grant and renewal \
         waits for it, one `WAIT` for the grants that arrive together) and on a primary \
         without one (no wait), median sections per second of the same rounds. `WAIT`s per \
         section is counted from the primary's `INFO commandstats`: below 1 is the group \
         commit at work.\n\n",
    );
    out.push_str("| Scenario | No replica | 1 replica | Ratio | `WAIT`s per section |\n");
    out.push_str("|---|---:|---:|---:|---:|\n");
    let shown = |value: Option<f64>, format: fn(f64) -> String| value.map_or("–".into(), format);
    for cost in costs {
        let ratio = cost
            .replicated
            .zip(cost.alone)
            .map(|(replicated, alone)| replicated / alone);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            cost.name,
            shown(cost.alone, |rate| format!("{rate:.0}")),
            shown(cost.replicated, |rate| format!("{rate:.0}")),
            shown(ratio, |ratio| format!("{ratio:.2}×")),
            shown(cost.waits_per_section, |waits| format!("{waits:.2}")),
        );
    }
    out.push('\n');
    out
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
