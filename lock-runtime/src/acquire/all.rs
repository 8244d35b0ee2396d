//! Several keys, all or none. Every client takes keys in one global order, that of
//! their locks' Redis names, one at a time through the single-key way, so two callers
//! that list the same keys in different orders never wait for each other in a circle.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::Acquirer;
use crate::LockError;
use crate::hold::{Level, LockGuard};
use crate::key::LockName;
use crate::options::LockOptions;

impl Acquirer {
    /// Takes every key in `keys` (each distinct lock once) in the global order, all
    /// within one time budget, or, when one fails, frees those already taken and
    /// returns that key's error.
    pub(crate) async fn acquire_all(
        &self,
        keys: &[String],
        options: &LockOptions,
    ) -> Result<LockGuard, LockError> {
        let mut ordered = BTreeMap::new();
        for key in keys {
            let name = LockName::new(key)?;
            ordered
                .entry(name.hash().to_owned())
                .or_insert_with(|| key.clone());
        }
        let Some(first) = ordered.values().next() else {
            return Err(LockError::InvalidOptions {
                key: String::new(),
                reason: "`acquire_all` needs at least one key; pass the keys to lock, or \
                         skip locking when there are none"
                    .to_owned(),
            });
        };
        let plan = options.plan(first)?;
        if let Some(level) = Level::any(self.id) {
            return Err(LockError::InvalidOptions {
                key: first.clone(),
                reason: format!(
                    "`acquire_all` was called inside a hold of `{}` on this client; taking more \
                     locks while holding one breaks the one order that keeps multi-key locks \
                     from deadlocking, so take every key in one `acquire_all` before entering \
                     the hold",
                    level.hold.name().key()
                ),
            });
        }
        let deadline = Instant::now() + plan.patience();
        let mut taken = Vec::with_capacity(ordered.len());
        for key in ordered.values() {
            // Boxed, as the waiting loop's future nests too deep to lay out inline here.
            let started = Instant::now();
            match Box::pin(self.acquire_by(key, &plan, started, deadline)).await {
                Ok(guard) => taken.push(guard),
                Err(error) => {
                    if let Some(taken) = LockGuard::joined(taken) {
                        // The error of the key that failed is the one that matters.
                        let _ = taken.undo().await;
                    }
                    return Err(error);
                }
            }
        }
        Ok(LockGuard::joined(taken).expect("at least one key was taken"))
    }
}
