//! Guarding a write with a fencing token.
//!
//! A lease can run out while its holder is paused (a GC pause, a stalled network),
//! and the holder may wake up and write after the next holder did. Fencing tokens
//! order the holders: the store remembers the largest token it has seen and refuses
//! writes that carry a smaller one.

use std::sync::LazyLock;

use redis::Script;
use redis::aio::ConnectionLike;

use crate::LockError;

static FENCED_SET: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("backend/scripts/fenced_set.lua")));

/// Writes `value` to the Redis hash `key` (fields `value` and `fence`), unless a write
/// with a larger fencing token got there first. Returns whether it wrote.
///
/// Read the value back with `HGET key value`. The same token may write again; an
/// older one is refused, however late it arrives.
///
/// ```no_run
/// # async fn demo(locks: lock_runtime::LockClient, mut redis: redis::aio::MultiplexedConnection)
/// # -> Result<(), lock_runtime::LockError> {
/// use lock_runtime::{fenced_set, LockOptions};
///
/// let guard = locks.acquire("account:42", &LockOptions::new().fencing(true)).await?;
/// let token = guard.fencing_token().expect("asked for one");
/// if !fenced_set(&mut redis, "account:42:balance", "90", token).await? {
///     // A later holder wrote already: this holder's lease had run out.
/// }
/// # Ok(()) }
/// ```
#[must_use = "a refused write returns false"]
pub async fn fenced_set<C: ConnectionLike>(
    redis: &mut C,
    key: &str,
    value: &str,
    token: u64,
) -> Result<bool, LockError> {
    let written: i64 = FENCED_SET
        .key(key)
        .arg(value)
        .arg(token)
        .invoke_async(redis)
        .await
        .map_err(|source| LockError::backend(key, source))?;
    Ok(written == 1)
}
