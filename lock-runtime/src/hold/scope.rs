//! Lexical re-entry. Code runs inside a hold when the future it belongs to was
//! given to [`LockGuard::scope`](super::LockGuard::scope): the scope travels with
//! that future, not with the task, so sibling futures, spawned tasks and code after
//! the guard moved away are outside it.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::Mutex;

use super::Hold;

tokio::task_local! {
    static SCOPE: Arc<Level>;
}

/// One nesting level: code inside `hold`, whose re-entering sections take turns
/// on `sections`.
pub(crate) struct Level {
    parent: Option<Arc<Level>>,
    pub(crate) hold: Arc<Hold>,
    pub(crate) sections: Arc<Mutex<()>>,
}

/// Runs `future` one level deeper for each of `holds` (a hold and the turn of the
/// sections that re-enter it), the last innermost.
pub(super) async fn enter<F: Future>(
    holds: impl IntoIterator<Item = (Arc<Hold>, Arc<Mutex<()>>)>,
    future: F,
) -> F::Output {
    let mut level = SCOPE.try_with(Arc::clone).ok();
    for (hold, sections) in holds {
        level = Some(Arc::new(Level {
            parent: level,
            hold,
            sections,
        }));
    }
    match level {
        Some(level) => SCOPE.scope(level, future).await,
        None => future.await,
    }
}

impl Level {
    /// The innermost level around the caller holding `hash` for `client`, if its
    /// hold is still valid.
    pub(crate) fn innermost(client: u64, hash: &str) -> Option<Arc<Level>> {
        let mut level = SCOPE.try_with(Arc::clone).ok();
        while let Some(current) = level {
            let hold = &current.hold;
            if hold.client() == client && hold.name().hash() == hash && hold.is_held() {
                return Some(current);
            }
            level = current.parent.clone();
        }
        None
    }

    /// The innermost level around the caller of a hold of `client`'s, held or not:
    /// code that runs inside a hold, even one since lost, still runs inside it.
    pub(crate) fn any(client: u64) -> Option<Arc<Level>> {
        let mut level = SCOPE.try_with(Arc::clone).ok();
        while let Some(current) = level {
            if current.hold.client() == client {
                return Some(current);
            }
            level = current.parent.clone();
        }
        None
    }
}
