use std::fmt;
use std::time::Duration;

use crate::LockError;

/// The lease a watchdog-renewed lock takes; renewed every third of it.
pub const WATCHDOG_LEASE: Duration = Duration::from_secs(30);
/// Further attempts after the first, unless set.
pub const DEFAULT_RETRIES: u32 = 20;
/// The longest pause between attempts, unless set.
pub const DEFAULT_RETRY_WAIT: Duration = Duration::from_millis(50);
/// The longest lease accepted: Redis rejects expiry times past `i64::MAX` ms.
pub const MAX_LEASE: Duration = Duration::from_millis(1 << 52);
/// The shortest lease accepted: a shorter one is used up whole by the allowance for
/// clock drift (1% + 2 ms), so it could never be held.
pub const MIN_LEASE: Duration = Duration::from_millis(3);

/// How far a client hands a lock from task to task without Redis: at most `most`
/// hand-offs, within `within` of the Redis acquisition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HandOff {
    pub(crate) most: u16,
    pub(crate) within: std::time::Duration,
}

/// Redis measures a lease on its own clock; allow for the two clocks running at
/// slightly different rates, as Redlock does.
pub(crate) fn clock_drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// How to take a lock: lease, waiting, re-entry and fencing.
///
/// ```
/// use std::time::Duration;
/// use lock_runtime::LockOptions;
///
/// let fail_fast = LockOptions::new().spin(false);
/// let patient = LockOptions::new().retries(100).retry_wait(Duration::from_millis(20));
/// let fixed = LockOptions::new().lease(Duration::from_secs(5));
/// # let _ = (fail_fast, patient, fixed);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockOptions {
    lease: Option<Duration>,
    watchdog: Option<bool>,
    max_hold: Option<Duration>,
    spin: bool,
    retries: Option<u32>,
    retry_wait: Option<Duration>,
    timeout: Option<Duration>,
    reentrant: bool,
    fencing: bool,
    hold_at_least: Option<Duration>,
    permits: u32,
    shared: bool,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            lease: None,
            watchdog: None,
            max_hold: None,
            spin: true,
            retries: None,
            retry_wait: None,
            timeout: None,
            reentrant: true,
            fencing: false,
            hold_at_least: None,
            permits: 1,
            shared: false,
        }
    }
}

impl LockOptions {
    /// The defaults: wait up to 20 further attempts, a 30 s lease renewed by the
    /// watchdog, re-entrant, no fencing token.
    pub fn new() -> Self {
        Self::default()
    }

    /// A fixed lease, from [`MIN_LEASE`] to [`MAX_LEASE`]. The lock frees itself this
    /// long after it was taken unless extended; the watchdog is off unless
    /// `watchdog(true)` is also set.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = Some(lease);
        self
    }

    /// Renew the lease every third of it while the guard lives.
    pub fn watchdog(mut self, on: bool) -> Self {
        self.watchdog = Some(on);
        self
    }

    /// The longest the watchdog keeps renewing; after that the lease runs out.
    pub fn max_hold(mut self, max_hold: Duration) -> Self {
        self.max_hold = Some(max_hold);
        self
    }

    /// Wait for a busy lock (`true`, the default) or fail at once with `Busy`.
    pub fn spin(mut self, spin: bool) -> Self {
        self.spin = spin;
        self
    }

    /// How many times to wait a full pause (`retry_wait`, or less when the holder's
    /// lease ends sooner) and try again before giving up with `Timeout`. Waking early
    /// to a release and losing the race for it does not use up a retry, but all the
    /// waiting together, in this client's queue and at Redis, stays within about
    /// `retries` x `retry_wait`.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = Some(retries);
        self
    }

    /// The longest pause between attempts; a release wakes waiters sooner.
    pub fn retry_wait(mut self, wait: Duration) -> Self {
        self.retry_wait = Some(wait);
        self
    }

    /// An overall deadline for acquiring. Without `retries` it is the only bound;
    /// with both, whichever comes first ends the waiting. An attempt already sent
    /// runs to its answer, so a Redis gone silent can make an acquire end up to one
    /// command timeout after its deadline: an attempt cut short could leave a grant
    /// held that its caller was told it did not get.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// Let code running inside a hold of the key (the body of `#[distributed_lock]`,
    /// or [`LockGuard::scope`](crate::LockGuard::scope)) take it again without a round
    /// trip (the default), instead of failing with `Reentered`. Re-entry is lexical:
    /// other tasks, and sibling futures of the holder, wait like any other owner.
    pub fn reentrant(mut self, reentrant: bool) -> Self {
        self.reentrant = reentrant;
        self
    }

    /// Issue a fencing token with each fresh acquisition.
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Keep the lock until at least `window` after it was taken, even when the guard
    /// lets go sooner: a release then leaves the lock in Redis, held by nobody, until
    /// the window ends. With `spin(false)`, a job scheduled on several replicas runs
    /// once per window, and the other replicas get `Busy` and skip it (the pattern
    /// ShedLock is known for). Such a lock is never handed from task to task.
    ///
    /// ```
    /// use std::time::Duration;
    /// use lock_runtime::LockOptions;
    ///
    /// let nightly = LockOptions::new()
    ///     .spin(false)
    ///     .hold_at_least(Duration::from_secs(60));
    /// # let _ = nightly;
    /// ```
    pub fn hold_at_least(mut self, window: Duration) -> Self {
        self.hold_at_least = Some(window);
        self
    }

    /// A semaphore: up to `permits` holders of the key at once, each with a lease of
    /// its own, renewed and lost as a lock's is. Every holder of one key must ask for
    /// the same number; a caller that disagrees, or takes the key as a lock, gets
    /// `InvalidOptions`. `1`, the default, is a lock. Refused on Redlock, where
    /// majorities that overlap in no master could grant more permits than there are.
    ///
    /// ```
    /// use lock_runtime::LockOptions;
    ///
    /// let five_exports = LockOptions::new().permits(5);
    /// # let _ = five_exports;
    /// ```
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = permits;
        self
    }

    /// Take the key shared, as a reader: shared holders hold it together, and an
    /// exclusive holder (any acquire without `shared`) holds it alone. A waiting
    /// exclusive holder keeps new shared holders out, so writers do not starve.
    pub fn shared(mut self, shared: bool) -> Self {
        self.shared = shared;
        self
    }

    /// Checks the options and settles every default.
    pub(crate) fn plan(&self, key: &str) -> Result<Plan, LockError> {
        let invalid = |reason: &str| LockError::InvalidOptions {
            key: key.to_owned(),
            reason: reason.to_owned(),
        };
        let lease = self.lease.unwrap_or(WATCHDOG_LEASE);
        if lease < MIN_LEASE {
            return Err(invalid(&format!(
                "the lease must be at least {} ms: the allowance for clock drift (1% + 2 ms) uses up a shorter one",
                MIN_LEASE.as_millis()
            )));
        }
        if lease > MAX_LEASE {
            return Err(invalid(
                "the lease is longer than Redis accepts; use a lease under 2^52 ms, or the watchdog",
            ));
        }
        let watchdog = self.watchdog.unwrap_or(self.lease.is_none());
        if self.max_hold.is_some() && !watchdog {
            return Err(invalid(
                "`max_hold` caps the watchdog, which is off; drop `max_hold` or set `watchdog(true)`",
            ));
        }
        if self.max_hold == Some(Duration::ZERO) {
            return Err(invalid("`max_hold` must be more than zero"));
        }
        if !self.spin
            && (self.retries.is_some() || self.retry_wait.is_some() || self.timeout.is_some())
        {
            return Err(invalid(
                "`spin(false)` fails at once, so `retries`, `retry_wait` and `timeout` would never apply; drop them or spin",
            ));
        }
        if let Some(window) = self.hold_at_least {
            if window < Duration::from_millis(1) {
                return Err(invalid("`hold_at_least` must be at least 1 ms"));
            }
            if !watchdog && window > lease {
                return Err(invalid(
                    "`hold_at_least` is longer than the fixed lease, which would free the lock first; \
                     lengthen the lease or use the watchdog",
                ));
            }
            if window > MAX_LEASE {
                return Err(invalid("`hold_at_least` is longer than Redis accepts"));
            }
        }
        let retry_wait = self.retry_wait.unwrap_or(DEFAULT_RETRY_WAIT);
        if retry_wait.is_zero() {
            return Err(invalid("`retry_wait` must be more than zero"));
        }
        let kind = match (self.permits, self.shared) {
            (0, _) => return Err(invalid("`permits` must be at least 1")),
            (1, false) => Kind::Exclusive,
            (1, true) => Kind::Shared,
            (permits, false) => Kind::Permit(permits),
            (_, true) => {
                return Err(invalid(
                    "a semaphore has no shared side; drop `shared` or `permits`",
                ));
            }
        };
        if self.fencing && kind != Kind::Exclusive {
            return Err(invalid(
                "holders that hold the key at once cannot have one increasing fencing token; \
                 drop `fencing`, or take the key exclusive",
            ));
        }
        Ok(Plan {
            lease,
            watchdog,
            max_hold: self.max_hold,
            spin: self.spin,
            retries: match (self.retries, self.timeout) {
                (Some(retries), _) => Some(retries),
                (None, Some(_)) => None,
                (None, None) => Some(DEFAULT_RETRIES),
            },
            retry_wait,
            timeout: self.timeout,
            reentrant: self.reentrant,
            fencing: self.fencing,
            hold_at_least: self.hold_at_least,
            kind,
        })
    }
}

impl fmt::Debug for LockOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("LockOptions");
        match self.lease {
            Some(lease) => s.field("lease", &lease),
            None => s.field("lease", &format_args!("{WATCHDOG_LEASE:?} (watchdog)")),
        };
        s.field("watchdog", &self.watchdog.unwrap_or(self.lease.is_none()));
        if let Some(max_hold) = self.max_hold {
            s.field("max_hold", &max_hold);
        }
        s.field("spin", &self.spin);
        if self.spin {
            match (self.retries, self.timeout) {
                (Some(retries), _) => s.field("retries", &retries),
                (None, Some(_)) => s.field("retries", &format_args!("unbounded")),
                (None, None) => s.field("retries", &DEFAULT_RETRIES),
            };
            s.field("retry_wait", &self.retry_wait.unwrap_or(DEFAULT_RETRY_WAIT));
            if let Some(timeout) = self.timeout {
                s.field("timeout", &timeout);
            }
        }
        s.field("reentrant", &self.reentrant)
            .field("fencing", &self.fencing);
        if let Some(window) = self.hold_at_least {
            s.field("hold_at_least", &window);
        }
        if self.permits != 1 {
            s.field("permits", &self.permits);
        }
        if self.shared {
            s.field("shared", &self.shared);
        }
        s.finish()
    }
}

impl Plan {
    /// The longest an acquire may wait, in its client's queue and at Redis together:
    /// the timeout, or about as long as its retries would take at full pauses
    /// (one pause to spare, so that counting attempts ends first when nothing wakes
    /// the waiter early), whichever is shorter.
    pub(crate) fn patience(&self) -> Duration {
        let by_retries = self
            .retries
            .map(|retries| self.retry_wait.saturating_mul(retries.saturating_add(2)));
        match (self.timeout, by_retries) {
            (Some(timeout), Some(by_retries)) => timeout.min(by_retries),
            (Some(timeout), None) => timeout,
            (None, Some(by_retries)) => by_retries,
            (None, None) => unreachable!("a plan without a timeout has retries"),
        }
    }
}

/// Options with every default settled and checked.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) lease: Duration,
    pub(crate) watchdog: bool,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) spin: bool,
    /// `None` when only the timeout bounds the waiting.
    pub(crate) retries: Option<u32>,
    pub(crate) retry_wait: Duration,
    pub(crate) timeout: Option<Duration>,
    pub(crate) reentrant: bool,
    pub(crate) fencing: bool,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) kind: Kind,
}

/// What a hold shares the key with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Nobody: a lock, or the exclusive side of a read-write lock.
    Exclusive,
    /// Other shared holders.
    Shared,
    /// Up to this many holders (2 or more) of a semaphore's permits.
    Permit(u32),
}

impl Kind {
    /// What a token asks for, as `backend/scripts/holders.lua` reads it: `<client>:<n>`
    /// a lock, `<client>:<n>:shared`, or `<client>:<n>:permits=<permits>`.
    pub(crate) fn of_token(token: &str) -> Kind {
        let last = token.rsplit_once(':').map_or("", |(_, last)| last);
        if last == "shared" {
            return Kind::Shared;
        }
        last.strip_prefix("permits=")
            .and_then(|permits| permits.parse().ok())
            .map_or(Kind::Exclusive, Kind::Permit)
    }

    /// Whether holds of the two kinds can be of one key: the same kind, or a lock
    /// and shared holders, which are one read-write lock. A semaphore mixes with
    /// nothing else, a semaphore of another size included.
    pub(crate) fn mixes_with(self, other: Kind) -> bool {
        let semaphore = |kind| matches!(kind, Kind::Permit(_));
        self == other || !(semaphore(self) || semaphore(other))
    }
}

impl fmt::Display for Kind {
    /// How the key is held, for messages: "held as a lock".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Exclusive => f.write_str("a lock"),
            Kind::Shared => f.write_str("a shared lock"),
            Kind::Permit(permits) => write!(f, "a semaphore of {permits} permits"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(options: LockOptions) -> String {
        match options.plan("k") {
            Err(LockError::InvalidOptions { reason, .. }) => reason,
            other => panic!("expected InvalidOptions, got {other:?}"),
        }
    }

    #[test]
    fn defaults_take_a_watchdog_lease_and_spin() {
        let plan = LockOptions::new().plan("k").unwrap();
        assert_eq!(plan.lease, WATCHDOG_LEASE);
        assert!(plan.watchdog);
        assert_eq!(plan.retries, Some(DEFAULT_RETRIES));
        let deadline_only = LockOptions::new()
            .timeout(Duration::from_secs(1))
            .plan("k")
            .unwrap();
        assert_eq!(deadline_only.retries, None);
        let fixed = LockOptions::new()
            .lease(Duration::from_secs(2))
            .plan("k")
            .unwrap();
        assert!(!fixed.watchdog);
    }

    #[test]
    fn the_shortest_lease_is_the_first_the_drift_allowance_leaves_time_in() {
        assert!(clock_drift(MIN_LEASE) < MIN_LEASE);
        let shorter = MIN_LEASE - Duration::from_millis(1);
        assert!(clock_drift(shorter) >= shorter);
    }

    #[test]
    fn contradictions_and_ranges_are_rejected() {
        assert!(reason(LockOptions::new().lease(Duration::ZERO)).contains("at least 3 ms"));
        let used_up = LockOptions::new().lease(MIN_LEASE - Duration::from_micros(1));
        assert!(reason(used_up).contains("clock drift"));
        assert!(LockOptions::new().lease(MIN_LEASE).plan("k").is_ok());
        assert!(reason(LockOptions::new().lease(Duration::MAX)).contains("longer than Redis"));
        assert!(reason(LockOptions::new().spin(false).retries(3)).contains("spin(false)"));
        assert!(
            reason(
                LockOptions::new()
                    .spin(false)
                    .timeout(Duration::from_secs(1))
            )
            .contains("spin(false)")
        );
        assert!(reason(LockOptions::new().retry_wait(Duration::ZERO)).contains("retry_wait"));
        let no_watchdog = LockOptions::new()
            .lease(Duration::from_secs(1))
            .max_hold(Duration::from_secs(9));
        assert!(reason(no_watchdog).contains("max_hold"));
        assert!(reason(LockOptions::new().hold_at_least(Duration::ZERO)).contains("at least 1 ms"));
        let window_past_the_lease = LockOptions::new()
            .lease(Duration::from_secs(1))
            .hold_at_least(Duration::from_secs(2));
        assert!(reason(window_past_the_lease).contains("longer than the fixed lease"));
        let renewed = LockOptions::new()
            .lease(Duration::from_secs(1))
            .watchdog(true)
            .hold_at_least(Duration::from_secs(2));
        assert!(renewed.plan("k").is_ok());
        assert!(reason(LockOptions::new().permits(0)).contains("at least 1"));
        assert!(reason(LockOptions::new().permits(3).shared(true)).contains("no shared side"));
        assert!(reason(LockOptions::new().permits(3).fencing(true)).contains("fencing"));
        assert!(reason(LockOptions::new().shared(true).fencing(true)).contains("fencing"));
    }

    #[test]
    fn only_a_lock_and_shared_holders_mix() {
        assert!(Kind::Exclusive.mixes_with(Kind::Shared));
        assert!(Kind::Shared.mixes_with(Kind::Exclusive));
        assert!(Kind::Permit(3).mixes_with(Kind::Permit(3)));
        assert!(!Kind::Permit(3).mixes_with(Kind::Permit(2)));
        assert!(!Kind::Permit(3).mixes_with(Kind::Exclusive));
        assert!(!Kind::Shared.mixes_with(Kind::Permit(2)));
    }

    #[test]
    fn permits_and_shared_settle_the_kind() {
        let kind = |options: LockOptions| options.plan("k").unwrap().kind;
        assert_eq!(kind(LockOptions::new()), Kind::Exclusive);
        assert_eq!(kind(LockOptions::new().permits(1)), Kind::Exclusive);
        assert_eq!(kind(LockOptions::new().shared(true)), Kind::Shared);
        assert_eq!(kind(LockOptions::new().permits(5)), Kind::Permit(5));
    }
}
