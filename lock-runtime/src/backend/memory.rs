use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::signals::Signals;
use super::{Attempt, Release};
use crate::key::LockName;

/// Locks in this process's memory, with the same semantics as the Redis scripts:
/// leases expire, only the owner releases or renews, fencing counters only grow.
pub(crate) struct MemoryStore {
    state: Mutex<State>,
    signals: Arc<Signals>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Hold>,
    fences: HashMap<String, u64>,
}

struct Hold {
    owner: String,
    count: u64,
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
        owner: &str,
        lease: Duration,
        fencing: bool,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        let State { locks, fences } = &mut *state;
        match locks.get_mut(&name.hash) {
            Some(hold) if hold.expires_at > now && hold.owner != owner => Attempt::Busy {
                retry_in: Some(hold.expires_at - now),
                fence: fencing.then(|| fences.get(&name.fence).copied().unwrap_or(0)),
            },
            Some(hold) if hold.expires_at > now => {
                hold.count += 1;
                hold.expires_at = now + lease;
                Attempt::Granted {
                    fence: fencing.then(|| fences.get(&name.fence).copied().unwrap_or(0)),
                }
            }
            _ => {
                let hold = Hold {
                    owner: owner.to_owned(),
                    count: 1,
                    expires_at: now + lease,
                };
                locks.insert(name.hash.clone(), hold);
                Attempt::Granted {
                    fence: fencing.then(|| {
                        let counter = fences.entry(name.fence.clone()).or_insert(0);
                        *counter += 1;
                        *counter
                    }),
                }
            }
        }
    }

    pub(crate) fn release(&self, name: &LockName, owner: &str) -> Release {
        let now = Instant::now();
        let mut state = self.state();
        let Some(hold) = state.locks.get_mut(&name.hash) else {
            return Release::NotHeld;
        };
        if hold.expires_at <= now {
            state.locks.remove(&name.hash);
            return Release::NotHeld;
        }
        if hold.owner != owner {
            return Release::NotHeld;
        }
        hold.count -= 1;
        if hold.count > 0 {
            return Release::StillHeld;
        }
        state.locks.remove(&name.hash);
        drop(state);
        self.signals.notify(&name.channel);
        Release::Freed
    }

    pub(crate) fn renew(&self, name: &LockName, owner: &str, lease: Duration) -> bool {
        let now = Instant::now();
        match self.state().locks.get_mut(&name.hash) {
            Some(hold) if hold.owner == owner && hold.expires_at > now => {
                hold.expires_at = now + lease;
                true
            }
            _ => false,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
