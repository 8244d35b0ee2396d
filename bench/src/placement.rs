//! Where the bench's processes run. With two cores or more, every redis-server it
//! starts runs on one core, and the bench, its worker processes and the demo on the
//! others, as with a Redis on a host of its own: every reply crosses cores. Left to
//! the kernel, the two sides sometimes shared a core and sometimes did not, and on a
//! virtual machine a round trip costs two to three times as much CPU when each reply
//! wakes an idle core: the hot-key figures jumped between the two from run to run.

use std::process::{Command, Stdio};
use std::sync::OnceLock;

use lock_tests::RedisServer;

#[derive(Debug, Clone)]
pub(crate) enum Placement {
    /// Every redis-server on core `server`, the rest on `clients` (a `taskset` list).
    Apart {
        cores: usize,
        server: usize,
        clients: String,
    },
    /// As the kernel places them, and why.
    Shared { cores: usize, why: String },
}

static PLACEMENT: OnceLock<Placement> = OnceLock::new();

/// Puts this process on the clients' cores, where it can, and says where things run.
/// Called first, before any thread or process starts, so that they all follow it.
pub(crate) fn settle() -> &'static Placement {
    PLACEMENT.get_or_init(|| {
        let allowed = allowed_cores();
        let cores = allowed.len();
        let [server, rest @ ..] = allowed.as_slice() else {
            return Placement::Shared {
                cores: std::thread::available_parallelism().map_or(0, usize::from),
                why: "the cores this process may use are unknown".to_owned(),
            };
        };
        if rest.is_empty() {
            return Placement::Shared {
                cores,
                why: "one core".to_owned(),
            };
        }
        let clients = rest
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(",");
        match pin(std::process::id(), &clients) {
            Ok(()) => Placement::Apart {
                cores,
                server: *server,
                clients,
            },
            Err(why) => Placement::Shared { cores, why },
        }
    })
}

impl Placement {
    pub(crate) fn cores(&self) -> usize {
        match self {
            Placement::Apart { cores, .. } | Placement::Shared { cores, .. } => *cores,
        }
    }

    /// What the report says of it.
    pub(crate) fn described(&self) -> String {
        match self {
            Placement::Apart {
                server, clients, ..
            } => {
                let plural = if clients.contains(',') { "s" } else { "" };
                format!(
                    "Every redis-server the bench starts runs on core {server}, and the bench, \
                     its worker processes and the demo on core{plural} {clients}, as with a Redis \
                     on a host of its own: every reply crosses cores. Left to the kernel, the two sides \
                     sometimes shared a core, where a round trip costs about a third of the \
                     CPU, and the hot-key figures jumped between the two placements from run \
                     to run."
                )
            }
            Placement::Shared { why, .. } => format!(
                "Everything runs where the kernel places it ({why}), so the hot-key figures \
                 may jump between runs: on a virtual machine a round trip costs two to three \
                 times as much CPU when each reply wakes an idle core as when both sides share \
                 one."
            ),
        }
    }
}

/// Moves `server`, all its threads, to the server's core.
pub(crate) fn serve(server: &RedisServer) {
    let (Some(Placement::Apart { server: core, .. }), Some(pid)) = (PLACEMENT.get(), server.pid())
    else {
        return;
    };
    if let Err(why) = pin(pid, &core.to_string()) {
        eprintln!("lock-bench: redis-server {pid} stays where it is: {why}");
    }
}

/// Puts every thread of `pid` on `cores` (a list as `taskset` takes it): by `taskset`,
/// of util-linux, as the workspace forbids the `unsafe` a direct call needs.
fn pin(pid: u32, cores: &str) -> Result<(), String> {
    let status = Command::new("taskset")
        .args([
            "--all-tasks",
            "--cpu-list",
            "--pid",
            cores,
            &pid.to_string(),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|error| format!("taskset: {error}"))?;
    match status.success() {
        true => Ok(()),
        false => Err(format!("taskset: {status}")),
    }
}

/// The cores this process may run on, from `Cpus_allowed_list` ("0-3,6").
fn allowed_cores() -> Vec<usize> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let Some(list) = status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
    else {
        return Vec::new();
    };
    let mut cores = Vec::new();
    for range in list.trim().split(',') {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        if let (Ok(first), Ok(last)) = (first.parse::<usize>(), last.parse::<usize>()) {
            cores.extend(first..=last);
        }
    }
    cores
}
