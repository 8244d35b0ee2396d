use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::Attempt;
use super::signals::Signals;
use crate::key::LockName;

/// Locks in this process's memory, with the same semantics as the Redis scripts:
/// leases expire, only the acquisition's token releases or renews, fencing counters
/// only grow.
pub(crate) struct MemoryStore {
    state: Mutex<State>,
    signals: Arc<Signals>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Held>,
    fences: HashMap<String, u64>,
}

struct Held {
    token: String,
    expires_at: Instant,
}

impl MemoryStore {
    pub(crate) fn new(signals: Arc<Signals>) -> MemoryStore {
        MemoryStore {
            state: Mutex::default(),
            signals,
        }
    }

    pub(crate) fn acquire(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
        fencing: bool,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        let State { locks, fences } = &mut *state;
        if let Some(held) = locks.get(&name.hash).filter(|held| held.expires_at > now) {
            return Attempt::Busy {
                retry_in: Some(held.expires_at - now),
                fence: fencing.then(|| fences.get(&name.fence).copied().unwrap_or(0)),
            };
        }
        let held = Held {
            token: token.to_owned(),
            expires_at: now + lease,
        };
        locks.insert(name.hash.clone(), held);
        Attempt::Granted {
            fence: fencing.then(|| {
                let counter = fences.entry(name.fence.clone()).or_insert(0);
                *counter += 1;
                *counter
            }),
        }
    }

    /// Whether `token` held the lock and freed it.
    pub(crate) fn release(&self, name: &LockName, token: &str) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let Some(held) = state.locks.get(&name.hash) else {
            return false;
        };
        let ours = held.token == token && held.expires_at > now;
        if ours || held.expires_at <= now {
            state.locks.remove(&name.hash);
        }
        drop(state);
        if ours {
            self.signals.notify(&name.channel);
        }
        ours
    }

    pub(crate) fn renew(&self, name: &LockName, token: &str, lease: Duration) -> bool {
        let now = Instant::now();
        match self.state().locks.get_mut(&name.hash) {
            Some(held) if held.token == token && held.expires_at > now => {
                held.expires_at = now + lease;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn lease_left(&self, name: &LockName) -> Option<Duration> {
        let now = Instant::now();
        let state = self.state();
        let held = state.locks.get(&name.hash)?;
        (held.expires_at > now).then(|| held.expires_at - now)
    }

    /// Frees the lock whoever holds it; whether it was held.
    pub(crate) fn force_unlock(&self, name: &LockName) -> bool {
        let now = Instant::now();
        let held = self.state().locks.remove(&name.hash);
        let was_held = held.is_some_and(|held| held.expires_at > now);
        if was_held {
            self.signals.notify(&name.channel);
        }
        was_held
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
