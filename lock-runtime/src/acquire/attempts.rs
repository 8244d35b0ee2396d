use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::{Acquirer, busy, timeout};
use crate::LockError;
use crate::backend::Attempt;
use crate::hold::{ClientTurn, Grant};
use crate::key::LockName;
use crate::options::Plan;

/// Asks Redis for `name` during the client's `turn`, sleeping between attempts
/// until a release is signalled or the holder's lease would end, whichever is
/// first, within the retries and the time budget.
pub(super) async fn until_granted(
    acquirer: &Acquirer,
    name: Arc<LockName>,
    turn: ClientTurn,
    plan: &Plan,
    started: Instant,
    deadline: Instant,
) -> Result<Grant, LockError> {
    let mut releases = turn.subscribed();
    let mut retries_left = plan.retries;
    let mut attempts = 0;
    loop {
        if let Some(releases) = &mut releases {
            releases.mark_unchanged();
        }
        let token = acquirer.tokens.next();
        let sent_at = Instant::now();
        attempts += 1;
        let attempt = acquirer
            .backend
            .acquire(&name, &token, plan.lease, plan.fencing)
            .await?;
        let retry_in = match attempt {
            Attempt::Granted { fence } => {
                return Ok(Grant {
                    name,
                    token,
                    counter: fence,
                    sent_at,
                    turn,
                });
            }
            Attempt::Busy { retry_in, .. } => retry_in,
        };
        if !plan.spin {
            return Err(busy(&name));
        }
        if retries_left == Some(0) || Instant::now() >= deadline {
            return Err(timeout(&name, attempts, started));
        }
        if releases.is_none() {
            releases = turn.releases().await;
        }
        let mut pause = plan.retry_wait;
        if let Some(retry_in) = retry_in {
            pause = pause.min(retry_in);
        }
        pause = pause.min(deadline.saturating_duration_since(Instant::now()));
        // Waking to a release and losing the race for it does not use up a retry;
        // the deadline still bounds such waking.
        if !wait_for_release(releases.as_mut(), pause).await {
            retries_left = retries_left.map(|left| left - 1);
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
