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

/// Runs `future` one level deeper, inside `hold`.
pub(super) async fn enter<F: Future>(
    hold: Arc<Hold>,
    sections: Arc<Mutex<()>>,
    future: F,
) -> F::Output {
    let parent = SCOPE.try_with(Arc::clone).ok();
    let level = Level {
        parent,
        hold,
        sections,
    };
    SCOPE.scope(Arc::new(level), future).await
}

impl Level {
    /// The innermost level around the caller holding `hash` for `client`, if its
    /// hold is still valid.
    pub(crate) fn innermost(client: u64, hash: &str) -> Option<Arc<Level>> {
        let mut level = SCOPE.try_with(Arc::clone).ok();
        while let Some(current) = level {
            let hold = &current.hold;
            if hold.client() == client && hold.name().hash == hash && hold.is_held() {
                return Some(current);
            }
            level = current.parent.clone();
        }
        None
    }
}
