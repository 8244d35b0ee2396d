use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::acquisition::Ending;
use super::{Hold, scope};
use crate::LockError;
use crate::backend::Released;
use crate::options::MAX_LEASE;

/// A held lock. Release it with [`release`](Self::release); dropping it releases in
/// the background instead, on the runtime it was acquired on.
///
/// A guard owns its acquisition: only it can release, renew or extend the lock, and
/// a guard whose lease ran out can never change a later lock, the same task's
/// included. Code inside [`scope`](Self::scope) re-enters the key; the guards it
/// gets are views of this hold that end when it ends.
#[must_use = "dropping a `LockGuard` releases the lock at once"]
pub struct LockGuard {
    hold: Arc<Hold>,
    role: Role,
    /// The turn that sections re-entering the key inside this guard's scope take,
    /// one at a time.
    sections: Arc<Mutex<()>>,
}

enum Role {
    /// Holds the acquisition.
    Owner,
    /// `release` took the acquisition; dropping the guard does nothing more.
    Released,
    /// Re-entered an enclosing hold, during its turn among the sections there.
    View(OwnedMutexGuard<()>),
}

impl LockGuard {
    pub(super) fn owner(hold: Arc<Hold>) -> LockGuard {
        LockGuard {
            hold,
            role: Role::Owner,
            sections: Arc::default(),
        }
    }

    pub(crate) fn view(hold: Arc<Hold>, turn: OwnedMutexGuard<()>) -> LockGuard {
        LockGuard {
            hold,
            role: Role::View(turn),
            sections: Arc::default(),
        }
    }

    /// The key, as the caller gave it.
    pub fn key(&self) -> &str {
        &self.hold.name().key
    }

    /// The fencing token of this hold, when `fencing(true)` was asked for. Tokens of
    /// one key only grow, so a store that remembers the largest token it has seen can
    /// refuse the writes of a holder that lost the lock. A token is the counter Redis
    /// issued times 2^16 plus the number of hand-offs within the client before this
    /// hold; a re-entered guard shows its hold's token.
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.fence
    }

    /// True while the lease is known valid: not lost, not released, not run out by
    /// this process's clock (less an allowance for clock drift). Once false, false
    /// for good.
    pub fn is_held(&self) -> bool {
        self.hold.is_held()
    }

    /// Completes when the hold is over: a renewal was refused, the lease ran out
    /// without being renewed, or (for a re-entered guard) the outer hold ended.
    /// Never completes while the lock is held.
    pub async fn lost(&self) {
        self.hold.ended().await
    }

    /// Runs `future` inside this hold: acquiring the same key on the same client
    /// there re-enters it, with no round trip, and the guard that gives is a view of
    /// this hold. Re-entering sections take turns with each other; each nesting
    /// level has its own turn, so recursion never deadlocks.
    ///
    /// Only `future` is inside: a task it spawns is another owner, and waits for
    /// this hold to end like any other (it fails with `Timeout` if the hold outlasts
    /// its waiting budget).
    ///
    /// ```
    /// use lock_runtime::{LockClient, LockOptions};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), lock_runtime::LockError> {
    /// let locks = LockClient::memory();
    /// let options = LockOptions::new();
    /// let guard = locks.acquire("account:42", &options).await?;
    /// guard
    ///     .scope(async {
    ///         let again = locks.acquire("account:42", &options).await?;
    ///         again.release().await
    ///     })
    ///     .await?;
    /// let sibling = locks.try_acquire("account:42", &options).await?;
    /// assert!(sibling.is_none(), "outside the scope, the guard's own task waits");
    /// guard.release().await
    /// # }
    /// ```
    pub async fn scope<F: Future>(&self, future: F) -> F::Output {
        scope::enter(self.hold.clone(), self.sections.clone(), future).await
    }

    /// Sets the lease to `lease` from now, if this guard still holds the lock.
    /// `NotHeld` when it does not: nothing is changed then, and the guard stays lost.
    /// A re-entered guard cannot extend the hold it is a view of.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        let invalid = |reason: &str| LockError::InvalidOptions {
            key: self.key().to_owned(),
            reason: reason.to_owned(),
        };
        if lease < Duration::from_millis(1) || lease > MAX_LEASE {
            return Err(invalid("the lease must be from 1 ms to 2^52 ms"));
        }
        if let Role::View(_) = self.role {
            return Err(invalid(
                "this guard re-entered a lock held outside it; extend the outer guard",
            ));
        }
        if !self.hold.is_held() {
            return Err(LockError::NotHeld {
                key: self.key().to_owned(),
            });
        }
        self.hold.acquisition.extend(lease).await
    }

    /// Releases the lock, or, for a re-entered guard, ends its section. `NotHeld`
    /// when the lease had run out or the lock was taken over: nothing of another
    /// owner was deleted then.
    pub async fn release(mut self) -> Result<(), LockError> {
        let role = std::mem::replace(&mut self.role, Role::Released);
        let not_held = || LockError::NotHeld {
            key: self.key().to_owned(),
        };
        match role {
            Role::Owner => {
                let (was_held, ending) = self.hold.end();
                let freed = match ending {
                    Ending::HandedOn => true,
                    Ending::Releasing(releasing) => releasing.await? == Released::Freed,
                };
                if was_held && freed {
                    Ok(())
                } else {
                    Err(not_held())
                }
            }
            Role::View(turn) => {
                drop(turn);
                if self.hold.is_held() {
                    Ok(())
                } else {
                    Err(not_held())
                }
            }
            Role::Released => Ok(()),
        }
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if let Role::Owner = self.role {
            // Dropped unpolled, the release finishes in the background.
            drop(self.hold.end());
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("key", &self.key())
            .field("fencing_token", &self.fencing_token())
            .field("is_held", &self.is_held())
            .field("reentered", &matches!(self.role, Role::View(_)))
            .finish()
    }
}
