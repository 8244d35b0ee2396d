use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::signals::Signals;
use super::{Attempt, Queue};
use crate::key::LockName;
use crate::options::Kind;

/// Locks in this process's memory, with the same semantics as the Redis scripts:
/// leases expire, only the acquisition's token releases or renews, fencing counters
/// only grow, holders of one kind share a key as the kind allows, and a waiting
/// exclusive holder keeps new shared holders out. There is no queue: every release
/// wakes every waiter.
pub(crate) struct MemoryStore {
    state: Mutex<State>,
    signals: Arc<Signals>,
}

#[derive(Default)]
struct State {
    locks: HashMap<String, Holders>,
    fences: HashMap<String, u64>,
    /// Per lock, the exclusive acquisitions waiting for it, until when.
    writers_waiting: HashMap<String, HashMap<String, Instant>>,
}

/// The holders of one lock, all of one kind, each until its lease ends.
struct Holders {
    kind: Kind,
    leases: HashMap<String, Instant>,
}

impl Holders {
    fn has_room_for(&self, kind: Kind) -> bool {
        match kind {
            _ if self.leases.is_empty() => true,
            Kind::Exclusive => false,
            Kind::Shared => self.kind == Kind::Shared,
            Kind::Permit(permits) => self.kind == kind && self.leases.len() < permits as usize,
        }
    }

    /// The kind the lock is held as when `kind` can never share it.
    fn clash(&self, kind: Kind) -> Option<Kind> {
        let clashes = !self.leases.is_empty() && !self.kind.mixes_with(kind);
        clashes.then_some(self.kind)
    }

    fn first_lease_end(&self) -> Option<Instant> {
        self.leases.values().min().copied()
    }
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
        kind: Kind,
        lease: Duration,
        fencing: bool,
        queue: Queue,
    ) -> Attempt {
        let now = Instant::now();
        let mut state = self.state();
        let State {
            locks,
            fences,
            writers_waiting,
        } = &mut *state;
        let waiting = writers_waiting.entry(name.hash().to_owned()).or_default();
        waiting.retain(|_, until| *until > now);
        let holders = held(locks, name, now, kind);
        if let Some(held_as) = holders.clash(kind) {
            return Attempt::Clash { held_as };
        }
        let writer_first = kind == Kind::Shared && !waiting.is_empty();
        if !holders.has_room_for(kind) || writer_first {
            if let (Kind::Exclusive, Queue::Writers(Some(stay))) = (kind, queue) {
                waiting.insert(token.to_owned(), now + stay);
            }
            let retry_in = holders.first_lease_end().map(|end| end - now);
            if holders.leases.is_empty() {
                locks.remove(name.hash());
            }
            if waiting.is_empty() {
                writers_waiting.remove(name.hash());
            }
            return Attempt::Busy {
                retry_in,
                fence: fencing.then(|| fences.get(&name.fence()).copied().unwrap_or(0)),
            };
        }
        waiting.remove(token);
        if waiting.is_empty() {
            writers_waiting.remove(name.hash());
        }
        holders.kind = kind;
        holders.leases.insert(token.to_owned(), now + lease);
        Attempt::Granted {
            fence: fencing.then(|| {
                let counter = fences.entry(name.fence()).or_insert(0);
                *counter += 1;
                *counter
            }),
        }
    }

    /// Whether `token` held the lock and let go of it. A token that was waiting
    /// stops waiting, and wakes the shared holders that waited for it.
    pub(crate) fn release(&self, name: &LockName, token: &str) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let writer_left = state
            .writers_waiting
            .get_mut(name.hash())
            .is_some_and(|waiting| waiting.remove(token).is_some());
        let mut ours = false;
        if let Some(holders) = state.locks.get_mut(name.hash()) {
            ours = holders
                .leases
                .remove(token)
                .is_some_and(|until| until > now);
            holders.leases.retain(|_, until| *until > now);
            if holders.leases.is_empty() {
                state.locks.remove(name.hash());
            }
        }
        drop(state);
        if ours || writer_left {
            self.signals.notify(&name.channel());
        }
        ours
    }

    pub(crate) fn renew(&self, name: &LockName, token: &str, lease: Duration) -> bool {
        let now = Instant::now();
        let mut state = self.state();
        let until = state
            .locks
            .get_mut(name.hash())
            .and_then(|holders| holders.leases.get_mut(token));
        match until {
            Some(until) if *until > now => {
                *until = now + lease;
                true
            }
            _ => false,
        }
    }

    /// How long until the last holder's lease ends.
    pub(crate) fn lease_left(&self, name: &LockName) -> Option<Duration> {
        let now = Instant::now();
        let state = self.state();
        let last = state
            .locks
            .get(name.hash())?
            .leases
            .values()
            .max()
            .copied()?;
        (last > now).then(|| last - now)
    }

    /// Frees the lock whoever holds it; whether it was held.
    pub(crate) fn force_unlock(&self, name: &LockName) -> bool {
        let now = Instant::now();
        let holders = self.state().locks.remove(name.hash());
        let was_held = holders.is_some_and(|holders| holders.leases.values().any(|&t| t > now));
        if was_held {
            self.signals.notify(&name.channel());
        }
        was_held
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The lock's live holders, made empty of `kind` when there are none.
fn held<'a>(
    locks: &'a mut HashMap<String, Holders>,
    name: &LockName,
    now: Instant,
    kind: Kind,
) -> &'a mut Holders {
    let holders = locks
        .entry(name.hash().to_owned())
        .or_insert_with(|| Holders {
            kind,
            leases: HashMap::new(),
        });
    holders.leases.retain(|_, until| *until > now);
    holders
}
