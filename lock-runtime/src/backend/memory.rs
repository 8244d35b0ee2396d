use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::signals::Signals;
use super::{Attempt, Release};
use crate::key::LockName;

/// Locks in this process's memory, with the same semantics as the Redis scripts:
/// leases expire, only the owner releases or renews, fencing counters only grow.
#[derive(Default)]
pub(crate) struct MemoryBackend {
    state: Mutex<State>,
    releases: Signals,
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

impl MemoryBackend {
    pub(crate) fn acquire(
        &self,
        name: &LockName,
        owner: &str,
        lease: Duration,
        fencing: bool,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let State { locks, fences } = &mut *state;
        let expires_at = now + lease;
        match locks.get_mut(&name.hash) {
            Some(hold) if hold.expires_at > now && hold.owner != owner => Attempt::Busy {
                expires_in: Some(hold.expires_at - now),
            },
            Some(hold) if hold.expires_at > now => {
                hold.count += 1;
                hold.expires_at = expires_at;
                Attempt::Granted {
                    fence: fencing.then(|| fences.get(&name.fence).copied().unwrap_or(0)),
                }
            }
            _ => {
                locks.insert(
                    name.hash.clone(),
                    Hold {
                        owner: owner.to_owned(),
                        count: 1,
                        expires_at,
                    },
                );
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
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(hold) = state.locks.get_mut(&name.hash) else {
            return Release::NotHeld;
        };
        if hold.owner != owner || hold.expires_at <= now {
            return Release::NotHeld;
        }
        hold.count -= 1;
        if hold.count > 0 {
            return Release::StillHeld;
        }
        state.locks.remove(&name.hash);
        drop(state);
        self.releases.notify(&name.channel);
        Release::Freed
    }

    pub(crate) fn renew(&self, name: &LockName, owner: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        match state.locks.get_mut(&name.hash) {
            Some(hold) if hold.owner == owner && hold.expires_at > now => {
                hold.expires_at = now + lease;
                true
            }
            _ => false,
        }
    }

    pub(crate) fn subscribe(&self, name: &LockName) -> watch::Receiver<u64> {
        self.releases.join(&name.channel).0
    }

    pub(crate) fn unsubscribe(&self, name: &LockName) {
        self.releases.leave(&name.channel);
    }
}
