//! A checker for lock histories: record when each holder held a lock, then check
//! that no two holders of one key overlapped and that fencing tokens follow the
//! order of acquisition. Use it in your own tests, on your own services.
//!
//! ```
//! use std::time::SystemTime;
//! use lock_runtime::history::{History, Holding};
//!
//! let history = History::new();
//! let t = |ms| SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ms);
//! history.record(Holding { holder: "a".into(), key: "k".into(), from: t(0), until: t(10), fence: Some(1) });
//! history.record(Holding { holder: "b".into(), key: "k".into(), from: t(10), until: t(20), fence: Some(2) });
//! assert_eq!(history.check(), Ok(2));
//! history.record(Holding { holder: "c".into(), key: "k".into(), from: t(15), until: t(30), fence: Some(3) });
//! assert!(history.check().is_err());
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::LockGuard;

/// One holder's tenure of one lock, as it saw it: from when acquiring returned
/// until it began releasing (or learned the lock was lost).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holding {
    /// Who held it: a client, process or task name, for the report.
    pub holder: String,
    /// The lock's key.
    pub key: String,
    /// When acquiring returned.
    pub from: SystemTime,
    /// When the holder stopped relying on the lock.
    pub until: SystemTime,
    /// The acquisition's fencing token, if it had one.
    pub fence: Option<u64>,
}

/// What a history shows went wrong. The holdings are boxed to keep `Result`s small.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Two holders of one key held it at once.
    Overlap {
        /// The one that took the lock first.
        first: Box<Holding>,
        /// The one that took it before the first had let go.
        second: Box<Holding>,
    },
    /// A later acquisition of a key carried a token no larger than an earlier one.
    TokenOrder {
        /// The earlier holding.
        earlier: Box<Holding>,
        /// The later holding, whose token should have been larger.
        later: Box<Holding>,
    },
}

/// Holdings recorded from any number of tasks, checked at the end. Times from one
/// clock: across machines, only as good as their clock sync.
#[derive(Debug, Default)]
pub struct History {
    holdings: Mutex<Vec<Holding>>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    /// Records one holding.
    pub fn record(&self, holding: Holding) {
        self.holdings
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(holding);
    }

    /// Records `guard`'s holding from `from` until now, under the name `holder`.
    /// Call it just before releasing the guard.
    pub fn record_guard(&self, holder: impl Into<String>, guard: &LockGuard, from: SystemTime) {
        self.record(Holding {
            holder: holder.into(),
            key: guard.key().to_owned(),
            from,
            until: SystemTime::now(),
            fence: guard.fencing_token(),
        });
    }

    /// The number of holdings when the history is sound: per key, each holding ends
    /// before the next begins, and tokens (where present) strictly increase in
    /// the order of acquisition.
    pub fn check(&self) -> Result<usize, Violation> {
        let holdings = self.holdings.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_key: BTreeMap<&str, Vec<&Holding>> = BTreeMap::new();
        for holding in holdings.iter() {
            by_key.entry(&holding.key).or_default().push(holding);
        }
        for tenures in by_key.values_mut() {
            tenures.sort_by_key(|holding| holding.from);
            for pair in tenures.windows(2) {
                let (earlier, later) = (pair[0], pair[1]);
                if later.from < earlier.until {
                    return Err(Violation::Overlap {
                        first: Box::new(earlier.clone()),
                        second: Box::new(later.clone()),
                    });
                }
                if let (Some(before), Some(after)) = (earlier.fence, later.fence)
                    && after <= before
                {
                    return Err(Violation::TokenOrder {
                        earlier: Box::new(earlier.clone()),
                        later: Box::new(later.clone()),
                    });
                }
            }
        }
        Ok(holdings.len())
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Overlap { first, second } => write!(
                f,
                "`{}` was held by {} and {} at once ({:?} and {:?})",
                first.key, first.holder, second.holder, first, second
            ),
            Violation::TokenOrder { earlier, later } => write!(
                f,
                "`{}`: {} took it after {} but with token {:?}, not above {:?}",
                earlier.key, later.holder, earlier.holder, later.fence, earlier.fence
            ),
        }
    }
}

impl std::error::Error for Violation {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn holding(
        holder: &str,
        key: &str,
        from_ms: u64,
        until_ms: u64,
        fence: Option<u64>,
    ) -> Holding {
        let at = |ms| SystemTime::UNIX_EPOCH + Duration::from_millis(ms);
        Holding {
            holder: holder.to_owned(),
            key: key.to_owned(),
            from: at(from_ms),
            until: at(until_ms),
            fence,
        }
    }

    #[test]
    fn keys_are_checked_apart_and_back_to_back_holdings_are_sound() {
        let history = History::new();
        history.record(holding("b", "k", 10, 20, Some(2)));
        history.record(holding("a", "k", 0, 10, Some(1)));
        history.record(holding("c", "other", 5, 15, Some(1)));
        assert_eq!(history.check(), Ok(3));
    }

    #[test]
    fn an_overlap_is_found_even_between_distant_holdings() {
        let history = History::new();
        history.record(holding("a", "k", 0, 100, None));
        history.record(holding("b", "k", 10, 20, None));
        history.record(holding("c", "k", 120, 130, None));
        let Err(Violation::Overlap { first, second }) = history.check() else {
            panic!("expected an overlap");
        };
        assert_eq!((first.holder.as_str(), second.holder.as_str()), ("a", "b"));
    }

    #[test]
    fn a_token_that_does_not_grow_is_found() {
        let history = History::new();
        history.record(holding("a", "k", 0, 10, Some(7)));
        history.record(holding("b", "k", 20, 30, Some(7)));
        let violation = history.check().unwrap_err();
        assert!(matches!(violation, Violation::TokenOrder { .. }));
        assert!(
            violation.to_string().contains("token Some(7)"),
            "{violation}"
        );
    }
}
