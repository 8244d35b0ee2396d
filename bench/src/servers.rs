//! Valkey beside Redis: the in-process scenarios again, ours with a fixed lease and
//! the careful raw protocol, each on a redis-server and on a valkey-server of its own,
//! round by round in one run. Valkey has the native commands (`SET … IFEQ` renews
//! without a script) that Redis 7 lacks.

use std::fmt::Write;
use std::time::Duration;

use lock_tests::RedisServer;

use crate::peers::PeerKind;
use crate::scenarios::{Participant, Scenario};
use crate::stats::median;

const SERVERS: [&str; 2] = ["redis-server", "valkey-server"];
const PEERS: [PeerKind; 2] = [PeerKind::LibraryFixed, PeerKind::RawCareful];

/// The "Valkey beside Redis" section of the report; says so when Valkey is missing.
pub(crate) async fn valkey_beside_redis(scenarios: &[Scenario], raw_retry: Duration) -> String {
    let scenarios: Vec<&Scenario> = scenarios.iter().filter(|s| s.processes == 1).collect();
    if scenarios.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "## Valkey beside Redis\n\n\
         Ours with a fixed 10 s lease and the careful raw protocol, on a redis-server \
         and on a valkey-server started side by side, every round running all four \
         back to back: median sections per second, and ours over raw on each server.\n\n",
    );
    if std::process::Command::new("valkey-server")
        .arg("--version")
        .output()
        .is_err()
    {
        out.push_str(
            "Not measured: no valkey-server on PATH (scripts/ensure-redis installs it).\n\n",
        );
        return out;
    }
    let servers: Vec<RedisServer> = SERVERS.into_iter().map(RedisServer::start_binary).collect();
    let mut participants = Vec::new();
    for server in &servers {
        for kind in PEERS {
            match Participant::connect(kind, &server.url(), raw_retry).await {
                Ok(participant) => participants.push(participant),
                Err(error) => {
                    let _ = writeln!(out, "Not measured: {error}\n");
                    return out;
                }
            }
        }
    }
    out.push_str(
        "| Scenario | Redis: ours | Redis: raw | Redis: ours ÷ raw | Valkey: ours | Valkey: raw | Valkey: ours ÷ raw |\n\
         |---|--:|--:|--:|--:|--:|--:|\n",
    );
    for scenario in scenarios {
        let mut rates: Vec<Vec<f64>> = vec![Vec::new(); participants.len()];
        for round in 0..scenario.rounds {
            for turn in 0..participants.len() {
                // A different one goes first each round, to spread drift.
                let which = (round + turn) % participants.len();
                let prefix = format!("bench:servers:{}:{which}:round-{round}", scenario.slug);
                let (tally, elapsed) = participants[which].run_scenario(&prefix, scenario).await;
                rates[which].push(tally.completed as f64 / elapsed.as_secs_f64());
            }
        }
        let medians: Vec<Option<f64>> = rates.iter().map(|rates| median(rates)).collect();
        let shown = |rate: Option<f64>| rate.map_or("n/a".to_owned(), |rate| format!("{rate:.0}"));
        let ratio = |ours: Option<f64>, raw: Option<f64>| {
            ours.zip(raw).map_or("n/a".to_owned(), |(ours, raw)| {
                format!("{:.2}×", ours / raw)
            })
        };
        eprintln!("valkey beside redis: {} done", scenario.slug);
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            scenario.name,
            shown(medians[0]),
            shown(medians[1]),
            ratio(medians[0], medians[1]),
            shown(medians[2]),
            shown(medians[3]),
            ratio(medians[2], medians[3]),
        );
    }
    out.push('\n');
    out
}
