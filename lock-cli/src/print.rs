//! What `locks` prints: text for people, JSON for scripts.

use std::fmt::Write;
use std::time::Duration;

use lock_runtime::{LockKind, LockState};
use serde_json::{Value, json};

/// `ls`: one line a lock, columns aligned; or a JSON array.
pub(crate) fn list(locks: &[LockState], json: bool) -> String {
    if json {
        let locks: Vec<Value> = locks.iter().map(summary_json).collect();
        return format!("{}\n", Value::Array(locks));
    }
    let rows: Vec<[String; 5]> = locks
        .iter()
        .map(|lock| {
            [
                shown(&lock.key),
                kind(lock),
                format!("lease {}", lease(lock.lease_left)),
                format!("{} waiting", lock.queue.len()),
                format!("fence {}", fence(lock.fence)),
            ]
        })
        .collect();
    let mut widths = [0; 5];
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// `show`: the holders, the queue in order and the fencing counter; or a JSON
/// object.
pub(crate) fn details(lock: &LockState, json: bool) -> String {
    if json {
        let holders: Vec<Value> = lock
            .holders
            .iter()
            .map(|holder| {
                json!({
                    "token": holder.token,
                    "client": holder.client,
                    "lease_left_ms": millis(holder.lease_left),
                })
            })
            .collect();
        let queue: Vec<Value> = lock
            .queue
            .iter()
            .map(|waiter| {
                json!({
                    "token": waiter.token,
                    "client": waiter.client,
                    "kind": kind_name(waiter.kind),
                    "permits": permits(waiter.kind),
                    "waited_ms": waiter.waited.as_millis() as u64,
                })
            })
            .collect();
        let mut object = summary_json(lock);
        object["holders"] = Value::Array(holders);
        object["queue"] = Value::Array(queue);
        return format!("{object}\n");
    }
    let mut out = String::new();
    let _ = writeln!(out, "key      {}", shown(&lock.key));
    let _ = writeln!(out, "kind     {}", kind(lock));
    let _ = writeln!(out, "lease    {} left", lease(lock.lease_left));
    let _ = writeln!(out, "fence    {}", fence(lock.fence));
    let _ = writeln!(out, "holders  {}", lock.holders.len());
    for holder in &lock.holders {
        let _ = writeln!(
            out,
            "  {}  client {}  lease {}",
            holder.token,
            holder.client,
            lease(holder.lease_left)
        );
    }
    let _ = writeln!(out, "queue    {} waiting", lock.queue.len());
    for (place, waiter) in lock.queue.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {}. {}  client {}  {}  waiting {}",
            place + 1,
            waiter.token,
            waiter.client,
            kind_name(waiter.kind),
            duration(waiter.waited)
        );
    }
    out
}

/// What `unlock` asks before it frees `lock`.
pub(crate) fn unlock_question(lock: &LockState) -> String {
    let next = match lock.queue.first() {
        Some(first) => format!("pass it to client {}", first.client),
        None => "nobody waits for it".to_owned(),
    };
    format!(
        "Free `{}` from its {} holder(s) ({next})?",
        shown(&lock.key),
        lock.holders.len()
    )
}

fn summary_json(lock: &LockState) -> Value {
    json!({
        "key": lock.key,
        "kind": kind_name(lock.kind),
        "permits": permits(lock.kind),
        "holders": lock.holders.len(),
        "lease_left_ms": millis(lock.lease_left),
        "waiters": lock.queue.len(),
        "fence": lock.fence,
    })
}

/// `lock`, `shared ×3`, `semaphore 2/5` or `legacy`.
fn kind(lock: &LockState) -> String {
    let holders = lock.holders.len();
    match lock.kind {
        LockKind::Shared => format!("shared ×{holders}"),
        LockKind::Semaphore { permits } => format!("semaphore {holders}/{permits}"),
        other => kind_name(other).to_owned(),
    }
}

fn kind_name(kind: LockKind) -> &'static str {
    match kind {
        LockKind::Exclusive => "lock",
        LockKind::Shared => "shared",
        LockKind::Semaphore { .. } => "semaphore",
        LockKind::Legacy => "legacy",
        _ => "unknown",
    }
}

fn permits(kind: LockKind) -> Option<u32> {
    match kind {
        LockKind::Semaphore { permits } => Some(permits),
        _ => None,
    }
}

fn fence(fence: Option<u64>) -> String {
    fence.map_or_else(|| "-".to_owned(), |fence| fence.to_string())
}

fn lease(lease: Option<Duration>) -> String {
    lease.map_or_else(|| "none".to_owned(), duration)
}

fn millis(lease: Option<Duration>) -> Option<u64> {
    lease.map(|lease| lease.as_millis() as u64)
}

/// `850ms`, `29.1s`, `2m05s`, `3h07m`.
fn duration(duration: Duration) -> String {
    let ms = duration.as_millis();
    let s = duration.as_secs();
    match ms {
        0..1_000 => format!("{ms}ms"),
        1_000..60_000 => format!("{:.1}s", duration.as_secs_f64()),
        60_000..3_600_000 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s / 60 % 60),
    }
}

/// A key as written, but for control characters, which would break the line.
fn shown(key: &str) -> String {
    key.chars()
        .flat_map(|c| {
            let escaped: Vec<char> = match c.is_control() {
                true => c.escape_default().collect(),
                false => vec![c],
            };
            escaped
        })
        .collect()
}
