//! Every option, and the combinations that are allowed.

use lock_runtime::{LockError, distributed_lock};

#[distributed_lock(
    prefix = "order",
    keys = "id",
    spin = true,
    retries = 5,
    wait_ms = 20,
    timeout_ms = 1_000,
    expire_ms = 3_000,
    watchdog = true,
    max_hold_ms = 60_000,
    reentrant = false,
    fencing = true,
    guard = lock,
    on_lost = "continue",
    crate = "::lock_runtime",
)]
async fn everything(id: u64) -> Result<Option<u64>, LockError> {
    let _ = id;
    Ok(lock.fencing_token())
}

#[distributed_lock(spin = false, on_lost = "cancel")]
async fn fail_fast() -> Result<(), LockError> {
    Ok(())
}

// With no `expire_ms`, the 30 s default lease applies and simply is not renewed.
#[distributed_lock(watchdog = false)]
async fn unrenewed() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(max_hold_ms = 600_000)]
async fn capped_watchdog() -> Result<(), LockError> {
    Ok(())
}

// Once per window: with the watchdog, and within a fixed lease.
#[distributed_lock(spin = false, hold_at_least_ms = 60_000)]
async fn once_a_minute() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(spin = false, expire_ms = 90_000, hold_at_least_ms = 60_000)]
async fn once_a_minute_within_a_lease() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(timeout_ms = 500)]
async fn deadline_only() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(guard = held)]
async fn r#type() -> Result<bool, LockError> {
    Ok(held.is_held())
}

mod runtime {
    pub use lock_runtime as reexported;
}

#[distributed_lock(crate = "runtime::reexported")]
async fn through_a_reexport() -> Result<(), LockError> {
    Ok(())
}

mod limits {
    pub const RETRIES: u32 = 5;
    pub const SEATS: u32 = 3;
}
const WAIT_MS: u64 = 20;
const TIMEOUT_MS: u64 = 1_000;
const LEASE_MS: u64 = 3_000;
const MAX_HOLD_MS: u64 = 60_000;

// Counts and times named by constants, a path to one among them.
#[distributed_lock(
    retries = limits::RETRIES,
    wait_ms = WAIT_MS,
    timeout_ms = TIMEOUT_MS,
    expire_ms = LEASE_MS,
    watchdog = true,
    max_hold_ms = MAX_HOLD_MS,
    hold_at_least_ms = WAIT_MS,
    permits = limits::SEATS,
)]
async fn named() -> Result<(), LockError> {
    Ok(())
}

mod switches {
    pub const FAIL_FAST: bool = false;
    pub const READS: bool = true;
}
const RENEWED: bool = true;
const REENTRANT: bool = false;
const FENCED: bool = true;

// Switches named by constants.
#[distributed_lock(
    spin = switches::FAIL_FAST,
    watchdog = RENEWED,
    reentrant = REENTRANT,
    fencing = FENCED
)]
async fn switched() -> Result<(), LockError> {
    Ok(())
}

#[distributed_lock(shared = switches::READS)]
async fn switched_to_reading() -> Result<(), LockError> {
    Ok(())
}

fn assert_send<T: Send>(_: T) {}

fn main() {
    assert_send(everything(1));
    assert_send(fail_fast());
    assert_send(unrenewed());
    assert_send(capped_watchdog());
    assert_send(deadline_only());
    assert_send(r#type());
    assert_send(named());
    assert_send(switched());
    assert_send(switched_to_reading());
    assert_send(through_a_reexport());
}

