//! The local line for a key: the tasks of one client that want it wait here, first
//! come first served, so Redis sees one waiter per client however many tasks wait
//! for a lock (for a semaphore, up to its permits; for shared holders, each one).
//! A task whose turn it is listens for the holder's release, and keeps its turn
//! while it holds the lock. A holder may leave what it holds (`H`) in the line for
//! the next task instead of releasing it. A line nobody is in holds nothing (no
//! subscription, nothing handed on) and stays for the next task that wants its
//! key, until a sweep drops the idle lines: once the client has 1,024 lines, and
//! twice as many as the last sweep kept.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};
use std::mem;
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::quality::RandomState;
use tokio::sync::{Semaphore, watch};

use crate::backend::{Backend, Subscription};
use crate::key::LockName;
use crate::options::Kind;

/// The most shared holders one client keeps of a key at once; an exclusive turn
/// takes them all.
const SHARED_AT_ONCE: u32 = 1 << 20;

/// How many lines a client keeps, idle ones included, before it first sweeps out
/// the idle ones: a few hundred bytes each.
const LINES_KEPT_AT_LEAST: usize = 1024;

pub(crate) struct Queues<H> {
    backend: Arc<Backend>,
    /// The client whose lines these are.
    client: Arc<str>,
    lines: Mutex<Lines<H>>,
}

/// A client's lines by key. Looked up when a task joins a line; from then on, its
/// place goes to its line directly.
struct Lines<H> {
    /// Hashed with a seeded foldhash, cheaper than SipHash on a path every acquire
    /// takes.
    by_key: HashMap<LineKey, Arc<Line<H>>, RandomState>,
    /// How many lines there may be before the next task to join sweeps out the idle
    /// ones.
    sweep_at: usize,
}

/// A line's key, the lock's Redis name, shared with the places in it: joining a
/// line copies no name.
struct LineKey(LockName);

struct Line<H> {
    /// How the line was first joined: a lock, shared, or a semaphore's permits.
    kind: Kind,
    turns: Semaphore,
    state: Mutex<LineState<H>>,
}

struct LineState<H> {
    /// Places taken in this line: tasks waiting, and those whose turn it is.
    places: usize,
    /// Places whose turn it is.
    holding: usize,
    /// The key's release signals, from when a task of this line first had to wait
    /// until the line empties.
    releases: Option<Subscription>,
    /// What turns that ended handed on to the next, one each.
    handed: Vec<H>,
}

/// A task's place in a key's line, from joining it until its turn ends. However it
/// is dropped, the last place to go takes the line's subscription with it.
pub(crate) struct Place<H> {
    queues: Arc<Queues<H>>,
    name: LockName,
    line: Arc<Line<H>>,
    /// How many of the line's turns this place takes.
    weight: u32,
    /// Whether its turn gave it up as it ended.
    left: bool,
}

/// A task's turn in its client's line for a key: `place.weight` of the line's
/// turns, given back when it drops.
pub(crate) struct Turn<H> {
    place: Place<H>,
    /// What a turn that ended handed on, taken from the line as this turn began.
    handed: Option<H>,
}

impl<H> Queues<H> {
    pub(crate) fn new(backend: Arc<Backend>, client: Arc<str>) -> Arc<Queues<H>> {
        Arc::new(Queues {
            backend,
            client,
            lines: Mutex::new(Lines {
                by_key: HashMap::with_hasher(RandomState::default()),
                sweep_at: LINES_KEPT_AT_LEAST,
            }),
        })
    }

    /// Takes a place at the back of `name`'s line, for a hold of `kind`. When the
    /// line is for a kind that never shares the key with it (a lock and a semaphore,
    /// or semaphores of two sizes), returns the line's kind instead.
    pub(crate) fn join(self: &Arc<Self>, name: &LockName, kind: Kind) -> Result<Place<H>, Kind> {
        let (capacity, weight) = match kind {
            Kind::Exclusive => (SHARED_AT_ONCE, SHARED_AT_ONCE),
            Kind::Shared => (SHARED_AT_ONCE, 1),
            Kind::Permit(permits) => (permits, 1),
        };
        let new_line = || {
            Arc::new(Line {
                kind,
                turns: Semaphore::new(capacity as usize),
                state: Mutex::new(LineState {
                    places: 0,
                    holding: 0,
                    releases: None,
                    handed: Vec::new(),
                }),
            })
        };
        let mut lines = self.lines();
        if lines.by_key.len() >= lines.sweep_at {
            lines.sweep();
        }
        let line = match lines.by_key.entry(LineKey(name.clone())) {
            Entry::Occupied(mut taken) => {
                // An idle line of another kind is as good as gone: the key gets a new
                // one, with this kind's turns.
                if taken.get().kind != kind && taken.get().state().places == 0 {
                    taken.insert(new_line());
                }
                taken.into_mut()
            }
            Entry::Vacant(free) => free.insert(new_line()),
        };
        if !line.kind.mixes_with(kind) {
            return Err(line.kind);
        }
        // Under the map's lock, so that a sweep sees it.
        line.state().places += 1;
        Ok(Place {
            queues: self.clone(),
            name: name.clone(),
            line: line.clone(),
            weight,
            left: false,
        })
    }

    fn lines(&self) -> MutexGuard<'_, Lines<H>> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<H> Lines<H> {
    /// Drops the lines nobody is in. Under the map's lock, which a task joins under,
    /// so none can join one meanwhile; then only the place that left it last may
    /// still hold an idle line, and it is done with it.
    fn sweep(&mut self) {
        self.by_key.retain(|_, line| line.state().places > 0);
        self.sweep_at = (2 * self.by_key.len()).max(LINES_KEPT_AT_LEAST);
    }
}

impl<H> Line<H> {
    fn state(&self) -> MutexGuard<'_, LineState<H>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<H> Place<H> {
    /// Waits for this place's turn: for the tasks ahead to have theirs, and for room
    /// among the turns taken.
    pub(crate) async fn turn(self) -> Turn<H> {
        let turns = self.line.turns.acquire_many(self.weight).await;
        turns.expect("a line's turns are never closed").forget();
        self.started()
    }

    /// The turn, if it is this place's at once; else the place, still in line.
    pub(crate) fn try_turn(self) -> Result<Turn<H>, Place<H>> {
        let taken = self
            .line
            .turns
            .try_acquire_many(self.weight)
            .map(|turns| turns.forget());
        match taken {
            Ok(()) => Ok(self.started()),
            Err(_) => Err(self),
        }
    }

    fn started(self) -> Turn<H> {
        let handed = {
            let mut line = self.line.state();
            line.holding += 1;
            line.handed.pop()
        };
        Turn {
            place: self,
            handed,
        }
    }

    /// Gives up this place, and the turn it had if `had_turn`. What was handed on
    /// that no task still waits for is dropped, which gives it back to the store; the
    /// last place to go drops the key's release signals.
    fn leave(&mut self, had_turn: bool) {
        if mem::replace(&mut self.left, true) {
            return;
        }
        let mut line = self.line.state();
        line.places -= 1;
        line.holding -= usize::from(had_turn);
        let waiting = line.places - line.holding;
        let unclaimed = (waiting < line.handed.len()).then(|| line.handed.split_off(waiting));
        let releases = if line.places == 0 {
            line.releases.take()
        } else {
            None
        };
        drop(line);
        drop((unclaimed, releases));
    }
}

impl<H> Drop for Place<H> {
    /// A place that goes before its turn leaves what was handed on for it to the
    /// tasks still waiting.
    fn drop(&mut self) {
        self.leave(false);
    }
}

impl<H> Turn<H> {
    /// Leaves `handed` for the next task in line and ends this turn, if a task waits
    /// that nothing else was left for; otherwise gives both back.
    pub(crate) fn hand_on(self, handed: H) -> Result<(), (Turn<H>, H)> {
        let mut line = self.place.line.state();
        if line.places - line.holding > line.handed.len() {
            line.handed.push(handed);
            drop(line);
            Ok(())
        } else {
            drop(line);
            Err((self, handed))
        }
    }

    /// What the previous turn handed on to this one, if anything.
    pub(crate) fn handed(&mut self) -> Option<H> {
        self.handed.take()
    }

    /// The signals that concern this client's waiting for the key (a release, or the
    /// lock passed to it), subscribing when no task of the line has yet. `None` when
    /// subscribing failed: the caller polls instead.
    pub(crate) async fn releases(&self) -> Option<watch::Receiver<u64>> {
        if let Some(releases) = self.subscribed() {
            return Some(releases);
        }
        let place = &self.place;
        let queues = &place.queues;
        // Boxed: subscribing may connect, and that state would otherwise weigh on
        // every acquire's future, which is moved as a whole on its way in.
        let subscribing = Box::pin(queues.backend.subscribe(&place.name, &queues.client));
        let subscription = subscribing.await.ok()?;
        let releases = subscription.releases();
        place.line.state().releases = Some(subscription);
        Some(releases)
    }

    /// The key's release signals if the line already listens for them.
    pub(crate) fn subscribed(&self) -> Option<watch::Receiver<u64>> {
        let line = self.place.line.state();
        line.releases.as_ref().map(Subscription::releases)
    }
}

impl<H> Drop for Turn<H> {
    /// Gives this turn's share of the line's turns to the tasks behind it.
    fn drop(&mut self) {
        let place = &mut self.place;
        place.line.turns.add_permits(place.weight as usize);
        place.leave(true);
    }
}

impl Hash for LineKey {
    fn hash<S: Hasher>(&self, state: &mut S) {
        self.0.hash().hash(state)
    }
}

impl PartialEq for LineKey {
    fn eq(&self, other: &Self) -> bool {
        self.0.hash() == other.0.hash()
    }
}

impl Eq for LineKey {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{MemoryStore, Signals, Store};

    fn queues() -> Arc<Queues<()>> {
        let signals = Arc::new(Signals::default());
        let store = Store::Memory(MemoryStore::new(signals.clone()));
        Queues::new(Backend::new(store, signals), "client".into())
    }

    fn name(key: &str) -> LockName {
        LockName::new(key).unwrap()
    }

    fn turn(queues: &Arc<Queues<()>>, key: &str, kind: Kind) -> Turn<()> {
        let place = queues.join(&name(key), kind).unwrap();
        place.try_turn().ok().expect("a line nobody else is in")
    }

    #[test]
    fn idle_lines_are_swept_out_and_lines_in_use_kept() {
        let queues = queues();
        let held: Vec<_> = (0..10)
            .map(|i| turn(&queues, &format!("held-{i}"), Kind::Exclusive))
            .collect();
        for i in 0..10 * LINES_KEPT_AT_LEAST {
            drop(turn(&queues, &format!("once-{i}"), Kind::Exclusive));
            assert!(queues.lines().by_key.len() <= LINES_KEPT_AT_LEAST);
        }
        for (i, turn) in held.iter().enumerate() {
            let lines = queues.lines();
            let line = &lines.by_key[&LineKey(name(&format!("held-{i}")))];
            assert!(Arc::ptr_eq(line, &turn.place.line));
        }
        let waiting = queues.join(&name("held-0"), Kind::Exclusive).unwrap();
        let waiting = waiting.try_turn().err().expect("the key's turn is held");
        drop(held);
        assert!(waiting.try_turn().is_ok());
    }

    #[test]
    fn an_idle_line_gives_way_to_another_kind_and_one_in_use_does_not() {
        let queues = queues();
        drop(turn(&queues, "key", Kind::Exclusive));
        let permits: Vec<_> = (0..3)
            .map(|_| turn(&queues, "key", Kind::Permit(3)))
            .collect();
        let clash = queues.join(&name("key"), Kind::Exclusive).err();
        assert_eq!(clash, Some(Kind::Permit(3)));
        drop(permits);
        drop(turn(&queues, "key", Kind::Exclusive));
    }
}
