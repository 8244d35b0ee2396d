use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Acquirer, busy, clash, timeout};
use crate::LockError;
use crate::backend::{Attempt, Backend, CLAIM_WINDOW};
use crate::hold::{ClientTurn, Grant, valid_until};
use crate::key::LockName;
use crate::options::{Kind, Plan};
use crate::telemetry;

/// Asks the store for `name` during the client's `turn`, sleeping between attempts
/// until the lock is passed to this client (or, where the store keeps no queue, a
/// release is signalled) or the holder's lease would end, whichever is first, within
/// the retries and the time budget.
pub(super) async fn until_granted(
    acquirer: &Acquirer,
    name: LockName,
    turn: ClientTurn,
    plan: &Plan,
    started: Instant,
    deadline: Instant,
) -> Result<Grant, LockError> {
    let backend = &acquirer.backend;
    let mut releases = turn.subscribed();
    // Set once subscribing has been refused: from then on this waiter may queue
    // without listening, and polls, and does not ask to subscribe again (each refusal
    // is a round trip, and a line in `ACL LOG`).
    let mut polls = false;
    let mut place: Option<QueuePlace> = None;
    let mut retries_left = plan.retries;
    let mut attempts = 0;
    loop {
        if let Some(releases) = &mut releases {
            releases.mark_unchanged();
        }
        let token = match &place {
            Some(place) => place.token.clone(),
            None => acquirer.tokens.next(plan.kind),
        };
        // Only a client that hears when the lock is passed to it, or asks again
        // within the claim window, may queue for it. Where nobody is passed the lock,
        // only writers are kept, to hold off readers.
        let keeps_place = backend.queues() || plan.kind == Kind::Exclusive;
        let join = (plan.spin && keeps_place && (releases.is_some() || polls))
            .then(|| deadline.saturating_duration_since(Instant::now()) + CLAIM_WINDOW);
        let sent_at = Instant::now();
        attempts += 1;
        telemetry::attempted(attempts);
        let attempt = backend
            .acquire(&name, &token, plan.kind, plan.lease, plan.fencing, join)
            .await?;
        // The error to end with when the attempt was granted but the replicas did
        // not confirm it, and whether a grant was given back.
        let (retry_in, unreplicated, given_back) = match attempt {
            Attempt::Granted { fence } if Instant::now() < valid_until(sent_at, plan.lease) => {
                if let Some(place) = &mut place {
                    place.taken = true;
                }
                return Ok(Grant {
                    name,
                    token,
                    counter: fence,
                    sent_at,
                    turn,
                });
            }
            // Answered after the lease it asked for could have run out: nothing is
            // known held. What Redis may still keep under the token is given back
            // (dropping the place withdraws it), and the next attempt asks under a
            // new token after a pause, so that a Redis slower than the lease is asked
            // no more often than a poller asks.
            Attempt::Granted { .. } => {
                telemetry::granted_late(name.key());
                if place.take().is_none() {
                    backend.withdraw(&name, &token, plan.lease);
                }
                if !plan.spin {
                    return Err(busy(&name));
                }
                if retries_left == Some(0) || Instant::now() >= deadline {
                    return Err(timeout(&name, attempts, started));
                }
                retries_left = retries_left.map(|left| left - 1);
                let pause = plan
                    .retry_wait
                    .min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
                continue;
            }
            Attempt::Busy { retry_in, .. } => (retry_in, None, false),
            Attempt::Unreplicated(shortfall) => (None, Some(shortfall.error(name.key())), true),
            Attempt::GivenBack { retry_in } => (retry_in, None, true),
            Attempt::Clash { held_as } => return Err(clash(&name, held_as, plan.kind)),
        };
        // A grant given back is never asked for again under its token: were the
        // give-back to reach Redis late (sent again on a new connection, or given up
        // on and still queued), it would free what a later attempt was granted.
        if given_back {
            place = None;
        } else if join.is_some() && place.is_none() {
            place = Some(QueuePlace {
                backend: backend.clone(),
                name: name.clone(),
                token,
                lease: plan.lease,
                taken: false,
            });
        }
        let out_of_time = retries_left == Some(0) || Instant::now() >= deadline;
        if let Some(error) = unreplicated.filter(|_| !plan.spin || out_of_time) {
            return Err(error);
        }
        if !plan.spin {
            return Err(busy(&name));
        }
        if out_of_time {
            return Err(timeout(&name, attempts, started));
        }
        if releases.is_none() && !polls {
            releases = turn.releases().await;
            polls = releases.is_none();
            // Listening now, or polling from now on within the claim window: either
            // way no pass goes unclaimed, so ask again, joining the queue.
            if backend.queues() {
                continue;
            }
        }
        // A waiter that polls from the queue asks again within the claim window, which
        // may be more often than `retry_wait`.
        let claims_in_time = CLAIM_WINDOW / 2;
        let polls_from_queue = releases.is_none()
            && place.is_some()
            && backend.queues()
            && plan.retry_wait > claims_in_time;
        let mut pause = match polls_from_queue {
            true => claims_in_time,
            false => plan.retry_wait,
        };
        if let Some(retry_in) = retry_in {
            pause = pause.min(retry_in);
        }
        pause = pause.min(deadline.saturating_duration_since(Instant::now()));
        // Waking to a signal and finding the lock busy, or polling sooner than
        // `retry_wait` from the queue, does not use up a retry; the deadline still
        // bounds such waking.
        if !wait_for_release(releases.as_mut(), pause).await && !polls_from_queue {
            retries_left = retries_left.map(|left| left - 1);
        }
    }
}

/// A place in the store's queue for the lock, kept by one token from attempt to
/// attempt. A wait that ends without the lock, however it ends, gives it up, and
/// with it the lock if it was passed to this client meanwhile.
struct QueuePlace {
    backend: Arc<Backend>,
    name: LockName,
    token: Arc<str>,
    lease: Duration,
    taken: bool,
}

impl Drop for QueuePlace {
    fn drop(&mut self) {
        if !self.taken {
            self.backend.withdraw(&self.name, &self.token, self.lease);
        }
    }
}

/// Sleeps until a release is signalled or `pause` passes; true when signalled.
async fn wait_for_release(releases: Option<&mut watch::Receiver<u64>>, pause: Duration) -> bool {
    let until = Instant::now() + pause;
    if let Some(releases) = releases {
        match tokio::time::timeout_at(until, releases.changed()).await {
            Ok(Ok(())) => return true,
            Err(_elapsed) => return false,
            Ok(Err(_closed)) => {}
        }
    }
    tokio::time::sleep_until(until).await;
    false
}
