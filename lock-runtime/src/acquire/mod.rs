//! The way to a hold. An acquire inside a hold of the same key re-enters it;
//! otherwise it queues behind the client's other tasks for the key, takes over what
//! the task before it handed on, or else asks Redis until it is granted or its time
//! budget runs out.

mod all;
mod attempts;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use crate::LockError;
use crate::backend::Backend;
use crate::hold::{ClientQueues, Holds, Level, LockGuard};
use crate::key::LockName;
use crate::options::{HandOff, Kind, Plan};
use crate::telemetry;

/// One client's way of taking locks: its identity, its local lines, its holds.
pub(crate) struct Acquirer {
    id: u64,
    tokens: Tokens,
    backend: Arc<Backend>,
    queues: Arc<ClientQueues>,
    holds: Arc<Holds>,
    hand_off: HandOff,
}

/// Acquisition tokens, `<client>:<number>`: random per client, numbered per
/// acquisition, so that no two acquisitions anywhere share one.
struct Tokens {
    client: Arc<str>,
    issued: AtomicU64,
}

impl Acquirer {
    pub(crate) fn new(backend: Arc<Backend>, hand_off: HandOff) -> Acquirer {
        static CLIENTS: AtomicU64 = AtomicU64::new(0);
        let id = CLIENTS.fetch_add(1, Ordering::Relaxed);
        let client: Arc<str> = uuid::Uuid::new_v4().simple().to_string().into();
        Acquirer {
            id,
            queues: ClientQueues::new(backend.clone(), client.clone()),
            tokens: Tokens {
                client,
                issued: AtomicU64::new(0),
            },
            holds: Holds::new(id, backend.clone(), hand_off),
            hand_off,
            backend,
        }
    }

    /// Another client's way on the same store.
    pub(crate) fn peer(&self) -> Acquirer {
        Acquirer::new(self.backend.clone(), self.hand_off)
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.backend
    }

    pub(crate) async fn acquire(&self, key: &str, plan: &Plan) -> Result<LockGuard, LockError> {
        let started = Instant::now();
        self.acquire_by(key, plan, started, started + plan.patience())
            .await
    }

    /// Takes `key` as `plan` says, waiting from `started` until `deadline` at the latest.
    async fn acquire_by(
        &self,
        key: &str,
        plan: &Plan,
        started: Instant,
        deadline: Instant,
    ) -> Result<LockGuard, LockError> {
        let acquiring = async {
            let acquired = self.take(key, plan, started, deadline).await;
            telemetry::acquired(&acquired, started, self.backend.meters());
            acquired
        };
        telemetry::acquire_span(key, acquiring).await
    }

    async fn take(
        &self,
        key: &str,
        plan: &Plan,
        started: Instant,
        deadline: Instant,
    ) -> Result<LockGuard, LockError> {
        let name = LockName::new(key)?;
        // The rarer ways in are boxed, so that their state does not weigh on every
        // acquire's future, which is moved as a whole on its way in.
        if let Some(level) = Level::innermost(self.id, name.hash()) {
            return Box::pin(reenter(&level, &name, plan, started, deadline)).await;
        }
        if matches!(plan.kind, Kind::Permit(_)) && !self.backend.counts_permits() {
            return Err(invalid(
                &name,
                "a semaphore cannot be sound on Redlock: with 2 permits and masters A, B and C, \
                 holders granted by {A,B}, {A,C} and {B,C} make three; keep semaphores on one \
                 Redis, Sentinel or Cluster",
            ));
        }
        let place = self
            .queues
            .join(&name, plan.kind)
            .map_err(|held_as| clash(&name, held_as, plan.kind))?;
        // A timer only for a task that has to wait for its turn, boxed as the rarer
        // way: a lone task's acquire then arms one timer, its request's bound.
        let mut turn = match place.try_turn() {
            Ok(turn) => turn,
            Err(_) if !plan.spin => return Err(busy(&name)),
            Err(place) => Box::pin(tokio::time::timeout_at(deadline, place.turn()))
                .await
                .map_err(|_| timeout(&name, 0, started))?,
        };
        let turn = match turn.handed() {
            Some(handed) => match Box::pin(self.holds.take_over(handed, turn, plan)).await {
                Ok(guard) => return Ok(guard),
                Err(turn) => turn,
            },
            None => turn,
        };
        // Boxed too, as the waiting loop's state is most of what is left; and not
        // generic, as its type nests deep enough to exhaust the compiler's query depth
        // in callers' crates, whose futures hold this one inline.
        let asking: Pin<Box<dyn Future<Output = _> + Send + '_>> = Box::pin(
            attempts::until_granted(self, name, turn, plan, started, deadline),
        );
        let grant = asking.await?;
        Ok(self.holds.start(grant, plan))
    }

    /// Waits for the background releases and cleanups of this client's store.
    pub(crate) async fn settled(&self) {
        self.holds.settled().await
    }
}

impl Tokens {
    /// A new token, which says what kind of hold it asks for, so that the store can
    /// tell what its holders and waiters want (see `backend/scripts/holders.lua`).
    fn next(&self, kind: Kind) -> Arc<str> {
        let number = self.issued.fetch_add(1, Ordering::Relaxed);
        let (mut digits, mut permit_digits) = (itoa::Buffer::new(), itoa::Buffer::new());
        let number = digits.format(number);
        let parts = match kind {
            Kind::Exclusive => [&*self.client, ":", number, "", ""],
            Kind::Shared => [&*self.client, ":", number, ":shared", ""],
            Kind::Permit(permits) => [
                &*self.client,
                ":",
                number,
                ":permits=",
                permit_digits.format(permits),
            ],
        };
        // Put together on the stack and copied once into the token's one allocation.
        let mut text = [0u8; 96];
        let mut length = 0;
        for part in parts {
            text[length..length + part.len()].copy_from_slice(part.as_bytes());
            length += part.len();
        }
        std::str::from_utf8(&text[..length])
            .expect("a token is ASCII")
            .into()
    }
}

/// Takes the turn among the sections that re-enter `level`'s hold. The guard is a
/// view of that hold: its lease, watchdog and fencing token are the hold's.
async fn reenter(
    level: &Level,
    name: &LockName,
    plan: &Plan,
    started: Instant,
    deadline: Instant,
) -> Result<LockGuard, LockError> {
    if !plan.reentrant {
        return Err(LockError::Reentered {
            key: name.key().to_owned(),
        });
    }
    let held_as = level.hold.kind();
    match (held_as, plan.kind) {
        (held, asked) if held == asked => {}
        (Kind::Exclusive, Kind::Shared) => {}
        (Kind::Shared, Kind::Exclusive) => {
            return Err(invalid(
                name,
                "the key is already held shared here, and taking it exclusive inside would wait \
                 for itself; take it exclusive where it is first taken",
            ));
        }
        (held, asked) => return Err(clash(name, held, asked)),
    }
    if plan.fencing && level.hold.fence().is_none() {
        return Err(invalid(
            name,
            "the lock is already held here without a fencing token, so re-entering it cannot \
             issue one; ask for fencing where the lock is first taken",
        ));
    }
    if let Some(window) = plan.hold_at_least
        && !level.hold.holds_until(Instant::now() + window)
    {
        return Err(invalid(
            name,
            "the lock is already held here without a `hold_at_least` window that long, so \
             re-entering it cannot keep one; ask for it where the lock is first taken",
        ));
    }
    let sections = level.sections.clone();
    let turn = if plan.spin {
        tokio::time::timeout_at(deadline, sections.lock_owned())
            .await
            .map_err(|_| timeout(name, 0, started))?
    } else {
        sections.try_lock_owned().map_err(|_| busy(name))?
    };
    if !level.hold.is_held() {
        return Err(LockError::Lost {
            key: name.key().to_owned(),
        });
    }
    Ok(LockGuard::view(level.hold.clone(), turn))
}

fn invalid(name: &LockName, reason: &str) -> LockError {
    LockError::InvalidOptions {
        key: name.key().to_owned(),
        reason: reason.to_owned(),
    }
}

/// The key is held as `held_as`, which never shares it with the `asked` kind.
fn clash(name: &LockName, held_as: Kind, asked: Kind) -> LockError {
    invalid(
        name,
        &format!(
            "the key is held as {held_as}, and cannot be taken as {asked} too; \
             every holder of one key must take it as the same kind (a lock and shared \
             holders are one read-write lock)"
        ),
    )
}

fn busy(name: &LockName) -> LockError {
    LockError::Busy {
        key: name.key().to_owned(),
    }
}

fn timeout(name: &LockName, attempts: u32, started: Instant) -> LockError {
    LockError::Timeout {
        key: name.key().to_owned(),
        attempts,
        waited: started.elapsed(),
    }
}
