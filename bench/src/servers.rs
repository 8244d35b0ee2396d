//! Newer servers beside Redis 7: the in-process scenarios again, ours with a fixed
//! lease and the careful raw protocol, on a redis-server (Debian's Redis 7), a
//! valkey-server (Valkey 9) and a redis-server-8 (Redis 8.4 or newer) of their own,
//! round by round in one run. The newer two have the native commands that Redis 7
//! lacks: ours releases a lock held alone with `DELIFEQ` or `DELEX` (and renews one
//! with `SET … IFEQ`), where raw runs its compare-and-delete script everywhere.

use std::fmt::Write;
use std::time::Duration;

use lock_tests::RedisServer;

use crate::peers::PeerKind;
use crate::placement;
use crate::scenarios::{Participant, Scenario};
use crate::stats::ours_and_raw_cells;

/// Each server's binary, and its name in the report.
const SERVERS: [(&str, &str); 3] = [
    ("redis-server", "Redis 7"),
    ("valkey-server", "Valkey 9"),
    ("redis-server-8", "Redis 8"),
];
const PEERS: [PeerKind; 2] = [PeerKind::LibraryFixed, PeerKind::RawCareful];

/// The "Newer servers beside Redis 7" section of the report; names the servers it
/// found missing.
pub(crate) async fn newer_servers_beside_redis(
    scenarios: &[Scenario],
    raw_retry: Duration,
) -> String {
    let scenarios: Vec<&Scenario> = scenarios.iter().filter(|s| s.processes == 1).collect();
    if scenarios.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "## Newer servers beside Redis 7\n\n\
         Ours with a fixed 10 s lease and the careful raw protocol, each on a server of \
         its own, the servers started side by side and every round running them all \
         back to back: median sections per second, and ours over raw on each server. \
         On Valkey 9 and Redis 8 ours releases a lock held alone with the server's own \
         compare-and-delete (`DELIFEQ`, `DELEX … IFEQ`); raw runs its script on each. \
         Redis 8 is the build `scripts/ensure-redis` makes, with libc's malloc where \
         packaged builds have jemalloc.\n\n",
    );
    let (present, missing): (Vec<_>, Vec<_>) = SERVERS.into_iter().partition(|(binary, _)| {
        std::process::Command::new(binary)
            .arg("--version")
            .output()
            .is_ok()
    });
    for (binary, name) in &missing {
        let _ = writeln!(
            out,
            "{name} not measured: no {binary} on PATH (scripts/ensure-redis installs it).\n"
        );
    }
    let servers: Vec<RedisServer> = present
        .iter()
        .map(|&(binary, _)| RedisServer::start_binary(binary))
        .collect();
    servers.iter().for_each(placement::serve);
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
    out.push_str("| Scenario |");
    for (_, name) in &present {
        let _ = write!(out, " {name}: ours | {name}: raw | {name}: ours ÷ raw |");
    }
    out.push_str("\n|---|");
    out.push_str(&"--:|".repeat(3 * present.len()));
    out.push('\n');
    for scenario in scenarios {
        let medians = Participant::median_rates_in_turn(&participants, scenario, "servers").await;
        let _ = write!(out, "| {} |", scenario.name);
        // Ours then raw, server by server, as `participants` was filled.
        for pair in medians.chunks(PEERS.len()) {
            out.push_str(&ours_and_raw_cells(pair[0], pair[1]));
        }
        out.push('\n');
        eprintln!("newer servers beside redis 7: {} done", scenario.slug);
    }
    out.push('\n');
    out
}
