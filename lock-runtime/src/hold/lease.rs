use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::notice::Notice;
use crate::options::clock_drift;

/// How long a hold is known valid by this process's clock: until the lease Redis
/// was asked for would end, less an allowance for clock drift, counted from before
/// the request was sent. Once that instant has passed, the hold is over for good.
///
/// Redis applies one client's renewals in the order they were sent, but one that got
/// no answer may still be applied after any later one; so may one whose answer
/// comes after a later one's. Either way the lease is counted as the shorter it
/// could make it.
pub(crate) struct Lease {
    validity: Mutex<Validity>,
    /// Told when the end moves sooner.
    sooner: Notice,
}

#[derive(Clone, Copy)]
struct Validity {
    until: Instant,
    /// When the grant or the latest renewal counted here was sent.
    sent_at: Instant,
    /// The shortest lease asked for by a renewal that got no answer.
    unanswered: Option<Duration>,
}

/// A renewal on its way to Redis. Dropped before its answer (an error, or the
/// caller went), it counts as unanswered: Redis may have applied it, or still may.
pub(crate) struct Renewal<'a> {
    lease: &'a Lease,
    sent_at: Instant,
    asked: Duration,
    answered: bool,
}

impl Lease {
    pub(crate) fn new(sent_at: Instant, lease: Duration) -> Lease {
        Lease {
            validity: Mutex::new(Validity {
                until: valid_until(sent_at, lease),
                sent_at,
                unanswered: None,
            }),
            sooner: Notice::default(),
        }
    }

    pub(crate) fn is_valid(&self) -> bool {
        self.is_valid_at(Instant::now())
    }

    pub(crate) fn is_valid_at(&self, now: Instant) -> bool {
        now < self.valid_until()
    }

    /// When the hold stops being known valid, as things stand.
    pub(crate) fn valid_until(&self) -> Instant {
        self.validity().until
    }

    fn validity(&self) -> MutexGuard<'_, Validity> {
        self.validity.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies `change`, which returns whether it moved the end sooner, and tells
    /// those watching for the end if it did.
    fn change(&self, change: impl FnOnce(&mut Validity) -> bool) -> bool {
        let sooner = change(&mut self.validity());
        if sooner {
            self.sooner.tell();
        }
        sooner
    }

    /// A renewal for `lease`, sent now or at `sent_at`, just before the request.
    pub(crate) fn renewal(&self, sent_at: Instant, lease: Duration) -> Renewal<'_> {
        Renewal {
            lease: self,
            sent_at,
            asked: lease,
            answered: false,
        }
    }

    /// Moves the end to `lease` after `sent_at`, when the renewal that Redis applied
    /// was sent; no further than an unanswered renewal could leave it. Refused once
    /// the lease has run out: a late answer revives nothing.
    ///
    /// Those watching for the end are told only of an earlier end: one that sleeps
    /// until the end it knew finds a later one when it wakes.
    fn renewed(&self, sent_at: Instant, lease: Duration) -> bool {
        let mut valid = false;
        self.change(|validity| {
            let was_until = validity.until;
            valid = Instant::now() < was_until;
            if valid {
                let lease = validity
                    .unanswered
                    .map_or(lease, |shortest| shortest.min(lease));
                if sent_at >= validity.sent_at {
                    validity.until = valid_until(sent_at, lease);
                    validity.sent_at = sent_at;
                } else {
                    // Applied before the latest renewal counted, or after it, and then
                    // for `lease` from no earlier than that one was sent.
                    let until = valid_until(validity.sent_at, lease);
                    validity.until = validity.until.min(until);
                }
            }
            validity.until < was_until
        });
        valid
    }

    /// A renewal for `lease` sent at `sent_at` got no answer: the lease lasts no
    /// longer than that renewal would leave it, now or after a later renewal.
    fn unanswered(&self, sent_at: Instant, lease: Duration) {
        self.change(|validity| {
            let shortest = validity
                .unanswered
                .map_or(lease, |shortest| shortest.min(lease));
            validity.unanswered = Some(shortest);
            let until = valid_until(sent_at.max(validity.sent_at), lease);
            let shorter = until < validity.until;
            if shorter {
                validity.until = until;
            }
            shorter
        });
    }

    /// Ends the lease at `now`; true when it was still valid.
    pub(crate) fn end(&self, now: Instant) -> bool {
        self.change(|validity| {
            let valid = now < validity.until;
            if valid {
                validity.until = now;
            }
            valid
        })
    }

    /// Completes once the lease is over, following renewals.
    pub(crate) async fn ended(&self) {
        loop {
            let until = self.valid_until();
            if Instant::now() >= until {
                return;
            }
            tokio::select! {
                () = tokio::time::sleep_until(until) => {}
                () = self.sooner.until(|| self.valid_until() < until) => {}
            }
        }
    }
}

impl Renewal<'_> {
    /// Redis answered: `renewed` when the token still held the lock and its lease
    /// was reset. Returns whether the lease is valid with it.
    pub(crate) fn answered(mut self, renewed: bool) -> bool {
        self.answered = true;
        renewed && self.lease.renewed(self.sent_at, self.asked)
    }
}

impl Drop for Renewal<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.lease.unanswered(self.sent_at, self.asked);
        }
    }
}

/// The end of a lease asked for at `sent_at`, by this process's clock.
pub(crate) fn valid_until(sent_at: Instant, lease: Duration) -> Instant {
    sent_at + lease.saturating_sub(clock_drift(lease))
}
