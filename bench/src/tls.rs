//! Over TLS: the in-process scenarios on a redis-server (Redis 7) that serves only
//! TLS, with a private CA, round by round in one run: ours with a fixed lease and the
//! careful raw protocol. There ours sends its requests on redis-rs' connection, as
//! raw does, not on its own (`backend/pipe.rs`).

use std::fmt::Write;
use std::sync::Arc;
use std::time::Duration;

use lock_runtime::{ClientConfig, LockClient};
use lock_tests::{RedisServer, TestCa, binary_serves_tls, server_binary};
use redis::Client;

use crate::peers::Peer;
use crate::placement;
use crate::scenarios::{Participant, Scenario, data_connection_of};
use crate::stats::ours_and_raw_cells;

/// The "Over TLS" section of the report.
pub(crate) async fn over_tls(scenarios: &[Scenario], raw_retry: Duration) -> String {
    let scenarios: Vec<&Scenario> = scenarios.iter().filter(|s| s.processes == 1).collect();
    if scenarios.is_empty() {
        return String::new();
    }
    let mut out = String::from(
        "## Over TLS\n\n\
         The same scenarios on a redis-server of its own (Redis 7) that serves only \
         TLS, with a private CA (`LockClient::connect_with` and the CA as \
         `tls_certificates`), ours with a fixed 10 s lease and the careful raw \
         protocol run back to back each round: median sections per second. Over TLS \
         ours sends its requests on redis-rs' connection, as raw does.\n\n",
    );
    if !binary_serves_tls() {
        let _ = writeln!(out, "Not measured: {} serves no TLS.\n", server_binary());
        return out;
    }
    let ca = Arc::new(TestCa::new());
    let server = RedisServer::start_with_tls(&ca, &[]);
    placement::serve(&server);
    let participants = match connect(&server, &ca, raw_retry).await {
        Ok(participants) => participants,
        Err(error) => {
            let _ = writeln!(out, "Not measured: {error}\n");
            return out;
        }
    };
    out.push_str("| Scenario | Ours | Raw, careful | Ours ÷ raw |\n|---|--:|--:|--:|\n");
    for scenario in scenarios {
        let medians = Participant::median_rates_in_turn(&participants, scenario, "tls").await;
        let cells = ours_and_raw_cells(medians[0], medians[1]);
        let _ = writeln!(out, "| {} |{cells}", scenario.name);
        eprintln!("over tls: {} done", scenario.slug);
    }
    out.push('\n');
    out
}

/// Ours, then raw, each warmed up.
async fn connect(
    server: &RedisServer,
    ca: &TestCa,
    raw_retry: Duration,
) -> Result<Vec<Participant>, String> {
    let url = server.url();
    let client =
        Client::build_with_tls(url.as_str(), ca.certificates()).map_err(|e| e.to_string())?;
    let config = ClientConfig::new().tls_certificates(ca.certificates());
    let ours = LockClient::connect_with(&url, config)
        .await
        .map_err(|e| e.to_string())?;
    let peers = [
        (Peer::library_fixed(ours), "tls-library-fixed"),
        (
            Peer::raw_careful(&client, raw_retry).await?,
            "tls-raw-careful",
        ),
    ];
    let mut participants = Vec::new();
    for (peer, id) in peers {
        let data = data_connection_of(&client).await?;
        participants.push(Participant::warmed_up(peer, data, id).await?);
    }
    Ok(participants)
}
