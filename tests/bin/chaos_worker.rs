//! A worker of the chaos test: tasks that take watchdog-renewed locks on a few hot
//! keys until the worker's stdin closes (the test ended, or died), and print each
//! section as `<key> <token> <asked ns> <from ns> <until ns> <held> <kind>`, times
//! since the Unix epoch, `held` being `is_held()` at the section's end (read after
//! `until`, so a yes covers it), `kind` being `exclusive`, `shared` or `permit`. A
//! key given as `<key>=<ms>` is held that long in each section (past the lease for
//! one that only the watchdog should keep); its sections also print `enter <key>` as
//! they begin. Other keys are held for 1 ms. Every other section extends its lease
//! halfway through, so that `extend` (one `SET … IFEQ` on servers that have it) meets
//! the faults as the watchdog's renewals do. Keys are taken exclusive, with a fencing
//! token; one ending in `/permits=<n>` is a semaphore of that many permits, and one
//! ending in `/read-write` is taken shared, but exclusive every fourth section: those
//! have no token, and print 0. One ending in `/window=<ms>` is taken as a job run
//! once per window is: fail-fast, held at least that long (`hold_at_least`), tried
//! again a quarter window after `Busy`; a section whose release answered `Ok` prints
//! as its end the window's, counted from when it asked, unless it ended later. An
//! acquisition that fails prints
//! `failed <key> <at ns> <what>`, `what` being the error's kind in one word. Each
//! warning the client logs about a key prints `warned <key> <at ns> <what>`, `what`
//! being the message up to its first `;` and, in parentheses, the same of the error's
//! innermost cause when the warning carries an error; an `extend` that fails prints
//! `warned <key> <at ns> extend: <what>`, `what` as for an acquisition. The replicas
//! the client counted, at connect and whenever a count went up, print
//! `counted <at ns> <replicas>`, as the client's INFO event says them.
//!
//! Usage: `chaos-worker <keys,comma,separated> <tasks per key> <topology>`,
//! the topology being one of `redis <url>`, `cluster <url,url,..>`,
//! `sentinel <sentinel url,url,..> <primary name>` or `redlock <url,url,..>`.
//! `LOCK_CHAOS_REPLICAS=<n>` sets `ClientConfig::replicas` instead of its default.

use std::io::{Read, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use lock_runtime::{ClientConfig, LockClient, LockError, LockOptions};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

const LEASE: Duration = Duration::from_millis(300);

const USAGE: &str = "usage: chaos-worker <key[=ms][/permits=N|/read-write|/window=ms],..> <tasks per key> \
                     (redis <url> | cluster <urls> | sentinel <urls> <primary name> | redlock <urls>)";

fn nanos_now() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_nanos()
}

fn say(line: &str) {
    let _ = std::io::stdout().lock().write_all(line.as_bytes());
}

/// The kind of a failed acquisition, in one word: a Redis error by its code or kind.
fn what_failed(error: &LockError) -> String {
    let what = match error {
        LockError::Timeout { .. } => "timeout".to_owned(),
        LockError::Replication { .. } => "unreplicated".to_owned(),
        LockError::Quorum { .. } => "no-quorum".to_owned(),
        LockError::Backend { source, .. } => match source.code() {
            Some(code) => code.to_owned(),
            None => format!("{:?}", source.kind()),
        },
        other => {
            let shown = format!("{other:?}");
            shown
                .split([' ', '{', '('])
                .next()
                .unwrap_or_default()
                .to_owned()
        }
    };
    what.split_whitespace().collect::<Vec<_>>().join("_")
}

/// Prints the client's warnings about keys, as `warned` lines, and the replicas it
/// counted, as `counted` lines.
struct PrintWarnings;

impl Subscriber for PrintWarnings {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= Level::INFO
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut warning = Warning::default();
        event.record(&mut warning);
        if let Some(replicas) = warning.replicas {
            say(&format!("counted {} {replicas}\n", nanos_now()));
        }
        if let Some(key) = warning.key {
            let cause = warning.cause.map(|cause| format!(" ({cause})"));
            let what = format!("{}{}", warning.message, cause.unwrap_or_default());
            say(&format!("warned {key} {} {what}\n", nanos_now()));
        }
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}

/// A warning's key, and the heads of its message and of its error's innermost cause;
/// or the replicas counted.
#[derive(Default)]
struct Warning {
    key: Option<String>,
    replicas: Option<String>,
    message: String,
    cause: Option<String>,
}

/// What `text` says before its first `;`, on one line.
fn head(text: &str) -> String {
    let head = text.split(';').next().unwrap_or_default();
    head.split_whitespace().collect::<Vec<_>>().join(" ")
}

impl Visit for Warning {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "key" {
            self.key = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "message" => self.message = head(&format!("{value:?}")),
            "replicas" => self.replicas = Some(format!("{value:?}")),
            _ => {}
        }
    }

    fn record_error(&mut self, _: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut cause = value;
        while let Some(source) = cause.source() {
            cause = source;
        }
        self.cause = Some(head(&cause.to_string()));
    }
}

/// How a key's sections take it.
#[derive(Clone, Copy)]
enum Take {
    Exclusive,
    Permits(u32),
    /// Shared, and exclusive every fourth section.
    ReadWrite,
    /// Fail-fast, and held at least this long.
    Window(Duration),
}

impl Take {
    fn parse(kind: &str) -> Take {
        match kind {
            "exclusive" => Take::Exclusive,
            "read-write" => Take::ReadWrite,
            window if window.starts_with("window=") => Take::Window(Duration::from_millis(
                window["window=".len()..].parse().expect("window=<ms>"),
            )),
            permits => Take::Permits(
                permits
                    .strip_prefix("permits=")
                    .and_then(|permits| permits.parse().ok())
                    .unwrap_or_else(|| panic!("{permits:?}: a kind is permits=<n> or read-write")),
            ),
        }
    }

    /// The options of the `number`th section, from the exclusive and fenced
    /// `options`, and what it holds.
    fn section(self, options: &LockOptions, number: u64) -> (LockOptions, &'static str) {
        let patient = || {
            options
                .clone()
                .retry_wait(Duration::from_millis(20))
                .timeout(Duration::from_secs(2))
        };
        let family = || patient().fencing(false);
        match self {
            Take::Exclusive => (patient(), "exclusive"),
            Take::Window(window) => (
                options.clone().spin(false).hold_at_least(window),
                "exclusive",
            ),
            Take::Permits(permits) => (family().permits(permits), "permit"),
            Take::ReadWrite if number % 4 == 3 => (family(), "exclusive"),
            Take::ReadWrite => (family().shared(true), "shared"),
        }
    }
}

async fn connect(topology: &[String], config: ClientConfig) -> Result<LockClient, LockError> {
    let urls = |urls: &str| urls.split(',').map(str::to_owned).collect::<Vec<_>>();
    match topology {
        [kind, url] if kind == "redis" => LockClient::connect_with(url, config).await,
        [kind, list] if kind == "cluster" => LockClient::cluster_with(urls(list), config).await,
        [kind, list, name] if kind == "sentinel" => {
            LockClient::sentinel_with(urls(list), name, config).await
        }
        [kind, list] if kind == "redlock" => LockClient::redlock_with(urls(list), config).await,
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [keys, tasks, topology @ ..] = args.as_slice() else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    let tasks: usize = tasks.parse().expect("tasks per key");
    tracing::subscriber::set_global_default(PrintWarnings).expect("the only subscriber");
    // The test decides how long a run lasts, and however it ends, no worker outlives it.
    std::thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0);
    });
    // A short bound on calls, so that a frozen Redis gives errors and lost leases,
    // not stalls.
    let mut config = ClientConfig::new().command_timeout(Duration::from_millis(200));
    if let Ok(replicas) = std::env::var("LOCK_CHAOS_REPLICAS") {
        config = config.replicas(replicas.parse().expect("LOCK_CHAOS_REPLICAS, a number"));
    }
    // Started during the faults, a worker may find Redis frozen: it tries again.
    let client = loop {
        match connect(topology, config.clone()).await {
            Ok(client) => break client,
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let options = LockOptions::new().fencing(true).lease(LEASE).watchdog(true);
    let mut workers = tokio::task::JoinSet::new();
    for key in keys.split(',') {
        let (key, kind) = key.split_once('/').unwrap_or((key, "exclusive"));
        let (key, hold) = match key.split_once('=') {
            Some((key, ms)) => (key, Some(Duration::from_millis(ms.parse().expect("ms")))),
            None => (key, None),
        };
        let take = Take::parse(kind);
        for _ in 0..tasks {
            let (client, options, key) = (client.clone(), options.clone(), key.to_owned());
            workers.spawn(async move {
                for section in 0.. {
                    let (options, kind) = take.section(&options, section);
                    let asked = nanos_now();
                    let guard = match client.acquire(&key, &options).await {
                        Ok(guard) => guard,
                        Err(error) => {
                            if let (LockError::Busy { .. }, Take::Window(window)) = (&error, take) {
                                tokio::time::sleep(window / 4).await;
                                continue;
                            }
                            let what = what_failed(&error);
                            say(&format!("failed {key} {} {what}\n", nanos_now()));
                            // As a service would: a client whose Redis is down fails
                            // at once, and a loop without a pause only burns the
                            // cores the servers share with it.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    let from = nanos_now();
                    if hold.is_some() {
                        say(&format!("enter {key}\n"));
                    }
                    let hold = hold.unwrap_or(Duration::from_millis(1));
                    tokio::time::sleep(hold / 2).await;
                    if section % 2 == 1
                        && let Err(error) = guard.extend(LEASE).await
                    {
                        let what = what_failed(&error);
                        say(&format!("warned {key} {} extend: {what}\n", nanos_now()));
                    }
                    tokio::time::sleep(hold - hold / 2).await;
                    let mut until = nanos_now();
                    let held = guard.is_held();
                    let token = guard.fencing_token().unwrap_or(0);
                    let released = guard.release().await;
                    if let (Take::Window(window), Ok(())) = (take, released) {
                        until = until.max(asked + window.as_nanos());
                    }
                    say(&format!(
                        "{key} {token} {asked} {from} {until} {held} {kind}\n"
                    ));
                }
            });
        }
    }
    // The tasks end only by panicking, which ends the worker too.
    if let Some(Err(ended)) = workers.join_next().await {
        std::panic::resume_unwind(ended.into_panic());
    }
}
