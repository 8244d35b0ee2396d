//! A held lock: one acquisition's token and lease, the guards that hold it one
//! after another (hand-off within a client), the watchdog that renews it, and the
//! lexical scope in which code re-enters it.

mod acquisition;
mod guard;
mod keeper;
mod lease;
mod notice;
mod scope;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;

use self::acquisition::{Acquisition, Ending};
pub use self::guard::LockGuard;
use self::keeper::{Care, Keeper};
pub(crate) use self::lease::valid_until;
use self::notice::Notice;
pub(crate) use self::scope::Level;
use crate::backend::Backend;
use crate::key::LockName;
use crate::options::{HandOff, Kind, Plan};
use crate::queue::{Queues, Turn};
use crate::telemetry;

/// The client's turn for a key; a hold may leave its acquisition in the line for
/// the next task.
pub(crate) type ClientTurn = Turn<Arc<Acquisition>>;
/// The client's lines per key.
pub(crate) type ClientQueues = Queues<Arc<Acquisition>>;

/// What the holds of one client share: who the client is, where its locks live,
/// the keeper that looks after their leases, and how far hand-off may go.
pub(crate) struct Holds {
    client: u64,
    backend: Arc<Backend>,
    keeper: Arc<Keeper>,
    hand_off: HandOff,
}

/// What Redis granted: the lock `name` under `token`, asked for at `sent_at`.
pub(crate) struct Grant {
    pub(crate) name: LockName,
    pub(crate) token: Arc<str>,
    /// The fencing counter Redis issued, when asked for.
    pub(crate) counter: Option<u64>,
    pub(crate) sent_at: Instant,
    /// The client's turn for the key, kept while the acquisition is held.
    pub(crate) turn: ClientTurn,
}

/// One guard's hold of an acquisition, from when it was granted or handed over to
/// it until the guard lets go. Its owner guard is the only one that releases or
/// extends it; guards that re-entered it are views that end with it.
pub(crate) struct Hold {
    acquisition: Arc<Acquisition>,
    fence: Option<u64>,
    since: telemetry::Since,
    over: AtomicBool,
    let_go: Notice,
}

impl Holds {
    pub(crate) fn new(client: u64, backend: Arc<Backend>, hand_off: HandOff) -> Arc<Holds> {
        Arc::new(Holds {
            client,
            backend,
            keeper: Arc::default(),
            hand_off,
        })
    }

    /// Starts holding what `grant` gave, looked after as `plan` says.
    pub(crate) fn start(self: &Arc<Self>, grant: Grant, plan: &Plan) -> LockGuard {
        let acquisition = Arc::new(Acquisition::new(self.clone(), grant, plan));
        let acquired_at = acquisition.acquired_at;
        let due = match acquisition.watchdog_lease() {
            Some(lease) => acquired_at + lease / 3,
            None => acquired_at + plan.lease,
        };
        // Locked across scheduling, so a keeper that finds it due at once waits to
        // see it scheduled.
        let mut care = acquisition.care();
        *care = Care::Scheduled(self.keeper.watch(&acquisition, due, &acquisition.runtime));
        drop(care);
        let fence = acquisition.first_fence();
        LockGuard::owner(Hold::new(acquisition, fence))
    }

    /// Takes over what the last turn handed on, if it fits `plan`. Otherwise it is
    /// released to Redis, and `turn` comes back to ask Redis itself. Dropped
    /// meanwhile, the turn goes to the next task and the acquisition is released.
    pub(crate) async fn take_over(
        &self,
        handed: Arc<Acquisition>,
        turn: ClientTurn,
        plan: &Plan,
    ) -> Result<LockGuard, ClientTurn> {
        if handed.fits(plan) {
            let fence = handed.take_over(turn, plan);
            return Ok(LockGuard::owner(Hold::new(handed, fence)));
        }
        let _ = handed.release(None, Instant::now()).await;
        Err(turn)
    }

    /// Waits for the background releases and cleanups of this client's store.
    pub(crate) async fn settled(&self) {
        self.backend.background().idle().await
    }
}

impl Hold {
    fn new(acquisition: Arc<Acquisition>, fence: Option<u64>) -> Arc<Hold> {
        Arc::new(Hold {
            acquisition,
            fence,
            since: telemetry::Since::now(),
            over: AtomicBool::new(false),
            let_go: Notice::default(),
        })
    }

    pub(crate) fn client(&self) -> u64 {
        self.acquisition.holds.client
    }

    pub(crate) fn name(&self) -> &LockName {
        &self.acquisition.name
    }

    pub(crate) fn fence(&self) -> Option<u64> {
        self.fence
    }

    pub(crate) fn kind(&self) -> Kind {
        self.acquisition.kind
    }

    /// Whether a release keeps the lock until at least `until`.
    pub(crate) fn holds_until(&self, until: Instant) -> bool {
        self.acquisition.hold_until.is_some_and(|end| end >= until)
    }

    pub(crate) fn is_held(&self) -> bool {
        self.is_held_at(Instant::now())
    }

    fn is_held_at(&self, now: Instant) -> bool {
        !self.over.load(Ordering::Acquire) && self.acquisition.lease.is_valid_at(now)
    }

    /// Completes once the hold is over: let go, or its acquisition's lease ended.
    async fn ended(&self) {
        tokio::select! {
            () = self.acquisition.lease.ended() => {}
            () = self.let_go.until(|| self.over.load(Ordering::Acquire)) => {}
        }
    }

    /// Lets go: hands the acquisition on, or releases it. Returns whether the hold
    /// was still valid, and how it ended.
    fn end(&self) -> (bool, Ending) {
        let now = Instant::now();
        let was_held = self.is_held_at(now);
        self.over.store(true, Ordering::Release);
        self.let_go.tell();
        let ending = self.acquisition.hand_on_or_release(now);
        let handed_on = matches!(ending, Ending::HandedOn);
        telemetry::held(
            self.since,
            handed_on,
            self.acquisition.holds.backend.meters(),
        );
        (was_held, ending)
    }
}
