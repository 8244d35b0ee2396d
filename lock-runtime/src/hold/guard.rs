use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::Poll;
use std::time::Duration;

use tokio::sync::{Mutex, OwnedMutexGuard};

use super::acquisition::Ending;
use super::{Hold, scope};
use crate::LockError;
use crate::backend::Released;
use crate::options::{MAX_LEASE, MIN_LEASE};

/// A held lock. Release it with [`release`](Self::release); dropping it releases in
/// the background instead, on the runtime it was acquired on.
///
/// A guard owns its acquisition: only it can release, renew or extend the lock, and
/// a guard whose lease ran out can never change a later lock, the same task's
/// included. Code inside [`scope`](Self::scope) re-enters the key; the guards it
/// gets are views of this hold that end when it ends.
///
/// A guard from [`LockClient::acquire_all`](crate::LockClient::acquire_all) holds
/// several locks, one per key in [`keys`](Self::keys), and each method below says
/// what it does with all of them.
#[must_use = "dropping a `LockGuard` releases the lock at once"]
pub struct LockGuard {
    hold: Arc<Hold>,
    role: Role,
    /// The turn that sections re-entering the key inside this guard's scope take,
    /// one at a time; made by the first scope.
    sections: OnceLock<Arc<Mutex<()>>>,
    /// The guards of the other keys of a multi-key guard, in the order taken; each
    /// holds one key and no others.
    others: Vec<LockGuard>,
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
            sections: OnceLock::new(),
            others: Vec::new(),
        }
    }

    pub(crate) fn view(hold: Arc<Hold>, turn: OwnedMutexGuard<()>) -> LockGuard {
        LockGuard {
            hold,
            role: Role::View(turn),
            sections: OnceLock::new(),
            others: Vec::new(),
        }
    }

    /// One guard for all of `taken`, single-key guards in the order taken.
    pub(crate) fn joined(taken: Vec<LockGuard>) -> Option<LockGuard> {
        let mut taken = taken.into_iter();
        let mut first = taken.next()?;
        first.others.extend(taken);
        Some(first)
    }

    /// This guard's one-key parts: itself, then the other keys' guards.
    fn parts(&self) -> impl Iterator<Item = &LockGuard> {
        std::iter::once(self).chain(&self.others)
    }

    /// The key, as the caller gave it; for a multi-key guard, the first key taken.
    pub fn key(&self) -> &str {
        self.hold.name().key()
    }

    /// Every key this guard holds, as the caller gave them, in the order taken: for a
    /// guard from [`acquire_all`](crate::LockClient::acquire_all), each distinct key
    /// once, in the one order all clients take keys in; otherwise just
    /// [`key`](Self::key).
    pub fn keys(&self) -> Vec<&str> {
        self.parts().map(LockGuard::key).collect()
    }

    /// The fencing token of this hold, when `fencing(true)` was asked for. Tokens of
    /// one key only grow, so a store that remembers the largest token it has seen can
    /// refuse the writes of a holder that lost the lock. A token is the counter Redis
    /// issued times 2^16 plus the number of hand-offs within the client before this
    /// hold; a re-entered guard shows its hold's token. For a multi-key guard, the
    /// token of the first key taken, [`key`](Self::key).
    pub fn fencing_token(&self) -> Option<u64> {
        self.hold.fence
    }

    /// True while the lease is known valid: not lost, not released, not run out by
    /// this process's clock (less an allowance for clock drift). Once false, false
    /// for good. For a multi-key guard, true while every key is held.
    pub fn is_held(&self) -> bool {
        self.parts().all(|part| part.hold.is_held())
    }

    /// Completes when the hold is over: a renewal was refused, the lease ran out
    /// without being renewed, or (for a re-entered guard) the outer hold ended.
    /// Never completes while the lock is held. For a multi-key guard, completes when
    /// the hold of any of its keys is over.
    pub async fn lost(&self) {
        let mut endings: Vec<Pin<Box<dyn Future<Output = ()> + Send + '_>>> = self
            .parts()
            .map(|part| Box::pin(part.hold.ended()) as Pin<Box<_>>)
            .collect();
        std::future::poll_fn(|cx| {
            match endings
                .iter_mut()
                .any(|ending| ending.as_mut().poll(cx).is_ready())
            {
                true => Poll::Ready(()),
                false => Poll::Pending,
            }
        })
        .await
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
    /// For a multi-key guard, `future` runs inside the hold of every key, so an
    /// acquire of any of them re-enters.
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
        let holds = self.parts().map(|part| {
            (
                part.hold.clone(),
                part.sections.get_or_init(Arc::default).clone(),
            )
        });
        scope::enter(holds, future).await
    }

    /// Sets the lease to `lease` from now, if this guard still holds the lock.
    /// `NotHeld` when it does not: nothing is changed then, and the guard stays lost.
    /// A re-entered guard cannot extend the hold it is a view of. For a multi-key
    /// guard, extends every key, together, and returns the first key's error, if
    /// any, once all have answered.
    pub async fn extend(&self, lease: Duration) -> Result<(), LockError> {
        if lease < MIN_LEASE || lease > MAX_LEASE {
            return Err(LockError::InvalidOptions {
                key: self.key().to_owned(),
                reason: format!(
                    "the lease must be from {} ms to 2^52 ms",
                    MIN_LEASE.as_millis()
                ),
            });
        }
        first_error(self.parts().map(|part| part.extend_one(lease))).await
    }

    async fn extend_one(&self, lease: Duration) -> Result<(), LockError> {
        if let Role::View(_) = self.role {
            return Err(LockError::InvalidOptions {
                key: self.key().to_owned(),
                reason: "this guard re-entered a lock held outside it; extend the outer guard"
                    .to_owned(),
            });
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
    /// owner was deleted then. For a multi-key guard, releases every key, together,
    /// and returns the first key's error, if any, once all have answered.
    pub async fn release(mut self) -> Result<(), LockError> {
        if self.others.is_empty() {
            return self.let_go().await;
        }
        let others = std::mem::take(&mut self.others);
        let letting_go: Vec<_> = std::iter::once(self.let_go())
            .chain(others.into_iter().map(|mut other| other.let_go()))
            .collect();
        first_error(letting_go).await
    }

    /// Releases every key of a guard taken for work that will not run: inside a
    /// `hold_at_least` window too, the locks are freed at once.
    pub(crate) async fn undo(self) -> Result<(), LockError> {
        for part in self.parts() {
            part.hold.acquisition.waive_window();
        }
        self.release().await
    }

    /// Lets go of this guard's one key at once, and returns what is left to wait for.
    fn let_go(&mut self) -> impl Future<Output = Result<(), LockError>> + Send + use<> {
        let hold = self.hold.clone();
        let letting_go = match std::mem::replace(&mut self.role, Role::Released) {
            Role::Owner => LettingGo::Ended(hold.end()),
            Role::View(turn) => {
                drop(turn);
                LettingGo::LeftSection
            }
            Role::Released => LettingGo::AlreadyGone,
        };
        async move {
            let was_held = match letting_go {
                LettingGo::Ended((was_held, Ending::HandedOn)) => was_held,
                LettingGo::Ended((was_held, Ending::Releasing(releasing))) => {
                    releasing.await? == Released::Freed && was_held
                }
                LettingGo::LeftSection => hold.is_held(),
                LettingGo::AlreadyGone => true,
            };
            match was_held {
                true => Ok(()),
                false => Err(LockError::NotHeld {
                    key: hold.name().key().to_owned(),
                }),
            }
        }
    }
}

/// How one key's guard let go.
enum LettingGo {
    /// The owner ended its hold: whether it was still held, and how it ended.
    Ended((bool, Ending)),
    /// A re-entered guard left its section.
    LeftSection,
    /// `release` had let go already.
    AlreadyGone,
}

/// Runs `steps` together, and once all are done, returns the first one's error.
async fn first_error<F>(steps: impl IntoIterator<Item = F>) -> Result<(), LockError>
where
    F: Future<Output = Result<(), LockError>>,
{
    let mut running: Vec<Option<Pin<Box<F>>>> =
        steps.into_iter().map(|step| Some(Box::pin(step))).collect();
    let mut errors: Vec<Option<LockError>> = running.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (step, error) in running.iter_mut().zip(&mut errors) {
            if let Some(future) = step
                && let Poll::Ready(result) = future.as_mut().poll(cx)
            {
                *step = None;
                *error = result.err();
            }
        }
        match running.iter().all(Option::is_none) {
            true => Poll::Ready(()),
            false => Poll::Pending,
        }
    })
    .await;
    errors.into_iter().flatten().next().map_or(Ok(()), Err)
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
        let mut f = f.debug_struct("LockGuard");
        f.field("key", &self.key());
        if !self.others.is_empty() {
            f.field("keys", &self.keys());
        }
        f.field("fencing_token", &self.fencing_token())
            .field("is_held", &self.is_held())
            .field("reentered", &matches!(self.role, Role::View(_)))
            .finish()
    }
}
