//! `locks`: what holds a lock, who waits for it, and freeing one that is stuck,
//! without redis-cli or knowing how the locks are kept in Redis.

mod print;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use lock_runtime::{ClientConfig, LockClient, LockError, LockInspector, redis};
use tokio::io::AsyncBufReadExt;

#[derive(Parser)]
#[command(
    name = "locks",
    version,
    about = "See and free the distributed locks of lock-runtime in Redis",
    after_help = "Without --url, --sentinel or --cluster, the URL comes from REDIS_URL."
)]
struct Cli {
    #[command(flatten)]
    redis: Endpoint,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args)]
struct Endpoint {
    #[arg(
        long,
        value_name = "URL",
        global = true,
        help = "One Redis: redis://[user][:password]@host[:port][/db], or rediss:// for TLS"
    )]
    url: Option<String>,
    /// The Sentinels' URLs, with --primary: repeat the option or separate with commas
    #[arg(
        long,
        value_name = "URL",
        value_delimiter = ',',
        global = true,
        conflicts_with = "url",
        requires = "primary"
    )]
    sentinel: Vec<String>,
    /// The name of the primary the Sentinels watch
    #[arg(long, value_name = "NAME", requires = "sentinel", global = true)]
    primary: Option<String>,
    /// A Redis Cluster's node URLs: repeat the option or separate with commas
    #[arg(long, value_name = "URL", value_delimiter = ',', global = true, conflicts_with_all = ["url", "sentinel"])]
    cluster: Vec<String>,
    /// A PEM file with the CA that signed the servers' certificates (rediss://)
    #[arg(long, value_name = "FILE", global = true)]
    tls_ca: Option<PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// List the held locks whose keys start with PREFIX, one a line
    Ls {
        /// The start of the keys, as the application writes them (`order:`)
        #[arg(default_value = "")]
        prefix: String,
        /// Print JSON, for scripts
        #[arg(long)]
        json: bool,
    },
    /// Show a lock's holders, its queue and its fencing counter
    Show {
        /// The key, as the application writes it (`order:42`)
        key: String,
        /// Print JSON, for scripts
        #[arg(long)]
        json: bool,
    },
    /// Free a lock whoever holds it and pass it to the first in its queue
    Unlock {
        /// The key, as the application writes it
        key: String,
        /// Do not ask for confirmation
        #[arg(long, short)]
        yes: bool,
    },
}

/// Where the locks are, from the options.
enum Redis {
    Server(String),
    Sentinel { urls: Vec<String>, primary: String },
    Cluster(Vec<String>),
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("locks: {}", one_line(&message));
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), String> {
    let (redis, config) = endpoint(cli.redis)?;
    match cli.command {
        Command::Ls { prefix, json } => {
            let locks = inspector(&redis, config).await?.locks(&prefix).await;
            let locks = locks.map_err(|error| failure(&error))?;
            print!("{}", print::list(&locks, json));
        }
        Command::Show { key, json } => {
            let lock = inspector(&redis, config).await?.lock(&key).await;
            match lock.map_err(|error| failure(&error))? {
                Some(lock) => print!("{}", print::details(&lock, json)),
                None => return Err(not_held(&key)),
            }
        }
        Command::Unlock { key, yes } => {
            if !yes {
                let lock = inspector(&redis, config.clone()).await?.lock(&key).await;
                let lock = lock
                    .map_err(|error| failure(&error))?
                    .ok_or_else(|| not_held(&key))?;
                eprint!("{}", print::details(&lock, false));
                if !confirmed(&print::unlock_question(&lock)).await {
                    return Err(format!("`{key}` was left locked"));
                }
            }
            let unlocked = client(&redis, config).await?.force_unlock(&key).await;
            match unlocked.map_err(|error| failure(&error))? {
                true => println!("unlocked `{key}`"),
                false => return Err(not_held(&key)),
            }
        }
    }
    Ok(())
}

fn endpoint(options: Endpoint) -> Result<(Redis, ClientConfig), String> {
    let redis = if !options.cluster.is_empty() {
        Redis::Cluster(options.cluster)
    } else if !options.sentinel.is_empty() {
        Redis::Sentinel {
            urls: options.sentinel,
            primary: options
                .primary
                .ok_or("--sentinel needs --primary NAME, the primary the Sentinels watch")?,
        }
    } else {
        match options.url.or_else(|| std::env::var("REDIS_URL").ok()) {
            Some(url) => Redis::Server(url),
            None => {
                return Err(
                    "no Redis given: pass --url, --sentinel with --primary, or --cluster, or set REDIS_URL"
                        .to_owned(),
                );
            }
        }
    };
    let mut config = ClientConfig::new();
    if let Some(file) = options.tls_ca {
        let ca = std::fs::read(&file)
            .map_err(|error| format!("cannot read the CA file {}: {error}", file.display()))?;
        config = config.tls_certificates(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        });
    }
    Ok((redis, config))
}

async fn inspector(redis: &Redis, config: ClientConfig) -> Result<LockInspector, String> {
    match redis {
        Redis::Server(url) => LockInspector::connect_with(url, config).await,
        Redis::Sentinel { urls, primary } => {
            LockInspector::sentinel_with(urls, primary, config).await
        }
        Redis::Cluster(urls) => LockInspector::cluster_with(urls, config).await,
    }
    .map_err(|error| failure(&error))
}

async fn client(redis: &Redis, config: ClientConfig) -> Result<LockClient, String> {
    match redis {
        Redis::Server(url) => LockClient::connect_with(url, config).await,
        Redis::Sentinel { urls, primary } => LockClient::sentinel_with(urls, primary, config).await,
        Redis::Cluster(urls) => LockClient::cluster_with(urls, config).await,
    }
    .map_err(|error| failure(&error))
}

/// The error and its cause, as one line.
fn failure(error: &LockError) -> String {
    match std::error::Error::source(error) {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}

fn not_held(key: &str) -> String {
    format!("no lock is held on `{key}`; `locks ls` lists the held ones")
}

fn one_line(message: &str) -> String {
    message.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Asks on the terminal; only `y` or `yes` confirms.
async fn confirmed(question: &str) -> bool {
    eprint!("{question} [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    let mut input = tokio::io::BufReader::new(tokio::io::stdin());
    if input.read_line(&mut answer).await.is_err() {
        return false;
    }
    matches!(answer.trim().to_lowercase().as_str(), "y" | "yes")
}
