use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::options::clock_drift;

/// How long a hold is known valid by this process's clock: until the lease Redis
/// was asked for would end, less an allowance for clock drift, counted from before
/// the request was sent. Once that instant has passed, the hold is over for good.
pub(crate) struct Lease {
    valid_until: watch::Sender<Instant>,
}

impl Lease {
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Lease {
        Lease {
            valid_until: watch::Sender::new(valid_until(sent_at, lease)),
        }
    }

    pub(crate) fn is_valid(&self) -> bool {
        Instant::now() < *self.valid_until.borrow()
    }

    /// Moves the end to `lease` after `sent_at`, when the request that renewed it
    /// was sent. Refused once the lease has run out: a late answer revives nothing.
    pub(crate) fn renewed(&self, sent_at: Instant, lease: Duration) -> bool {
        self.valid_until.send_if_modified(|until| {
            let valid = Instant::now() < *until;
            if valid {
                *until = valid_until(sent_at, lease);
            }
            valid
        })
    }

    /// Ends the lease now; true when it was still valid.
    pub(crate) fn end(&self) -> bool {
        self.valid_until.send_if_modified(|until| {
            let now = Instant::now();
            let valid = now < *until;
            if valid {
                *until = now;
            }
            valid
        })
    }

    /// Completes once the lease is over, following renewals.
    pub(crate) async fn ended(&self) {
        let mut valid_until = self.valid_until.subscribe();
        loop {
            let until = *valid_until.borrow_and_update();
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                _ = valid_until.changed() => {}
            }
        }
    }
}

fn valid_until(sent_at: Instant, lease: Duration) -> Instant {
    sent_at + lease.saturating_sub(clock_drift(lease))
}
