//! The local line for a key: the tasks of one client that want it wait here, first
//! come first served, so Redis sees one waiter per client however many tasks wait
//! for a lock (for a semaphore, up to its permits; for shared holders, each one).
//! A task whose turn it is listens for the holder's release, and keeps its turn
//! while it holds the lock. A holder may leave what it holds (`H`) in the line for
//! the next task instead of releasing it. A key nobody waits for or holds leaves
//! nothing behind.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::quality::RandomState;
use tokio::sync::{Semaphore, watch};

use crate::backend::{Backend, Subscription};
use crate::key::LockName;
use crate::options::Kind;

/// The most shared holders one client keeps of a key at once; an exclusive turn
/// takes them all.
const SHARED_AT_ONCE: u32 = 1 << 20;

pub(crate) struct Queues<H> {
    backend: Arc<Backend>,
    /// The client whose lines these are.
    client: Arc<str>,
    /// Looked up when a task joins a line and when the last place leaves it; in
    /// between, a place goes to its line directly. Hashed with a seeded foldhash,
    /// cheaper than SipHash on a path every acquire takes.
    lines: Mutex<HashMap<LineKey, Arc<Line<H>>, RandomState>>,
}

/// A line's key, the lock's Redis name, shared with the places in it: joining a
/// line copies no name.
struct LineKey(Arc<LockName>);

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
/// is dropped, the last place to go takes the line and its subscription with it.
pub(crate) struct Place<H> {
    queues: Arc<Queues<H>>,
    name: Arc<LockName>,
    line: Arc<Line<H>>,
    /// How many of the line's turns this place takes.
    weight: u32,
    /// Whether its turn, the last in the line, took the line away as it ended.
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
            lines: Mutex::new(HashMap::with_hasher(RandomState::default())),
        })
    }

    /// Takes a place at the back of `name`'s line, for a hold of `kind`. When the
    /// line is for a kind that never shares the key with it (a lock and a semaphore,
    /// or semaphores of two sizes), returns the line's kind instead.
    pub(crate) fn join(
        self: &Arc<Self>,
        name: &Arc<LockName>,
        kind: Kind,
    ) -> Result<Place<H>, Kind> {
        let (capacity, weight) = match kind {
            Kind::Exclusive => (SHARED_AT_ONCE, SHARED_AT_ONCE),
            Kind::Shared => (SHARED_AT_ONCE, 1),
            Kind::Permit(permits) => (permits, 1),
        };
        let mut lines = self.lines();
        let line = lines.entry(LineKey(name.clone())).or_insert_with(|| {
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
        });
        if !line.kind.mixes_with(kind) {
            return Err(line.kind);
        }
        // Under the map's lock, so that the last place leaving sees it.
        line.state().places += 1;
        Ok(Place {
            queues: self.clone(),
            name: name.clone(),
            line: line.clone(),
            weight,
            left: false,
        })
    }

    fn lines(&self) -> MutexGuard<'_, HashMap<LineKey, Arc<Line<H>>, RandomState>> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// Takes the line out of its client's map if `empties` finds it empty. Under the
    /// map's lock, which a task joins under, so none can join meanwhile.
    fn take_line_away_if(&self, empties: impl FnOnce(&mut LineState<H>) -> bool) -> bool {
        let mut lines = self.queues.lines();
        // One look-up for both the check and the removal.
        let Entry::Occupied(entry) = lines.entry(LineKey(self.name.clone())) else {
            return false;
        };
        if !Arc::ptr_eq(entry.get(), &self.line) || !empties(&mut self.line.state()) {
            return false;
        }
        // Not the line's last reference, which this place holds: nothing of it is
        // dropped under the map's lock.
        entry.remove();
        true
    }
}

impl<H> Drop for Place<H> {
    /// A place that goes before its turn leaves what was handed on for it to the
    /// tasks still waiting, and drops the rest, which gives it back to the store.
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let mut line = self.line.state();
        line.places -= 1;
        let waiting = line.places - line.holding;
        let kept = waiting.min(line.handed.len());
        let unclaimed = line.handed.split_off(kept);
        let last = line.places == 0;
        drop(line);
        drop(unclaimed);
        // The last place takes the line away, unless a task joined meanwhile or the
        // key has a new line already.
        if last {
            self.take_line_away_if(|line| line.places == 0);
        }
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
    /// The last turn in a line takes the line away, with no turns to give back to
    /// anyone; any other gives its turns to the tasks behind it.
    fn drop(&mut self) {
        let place = &mut self.place;
        let alone = |line: &mut LineState<H>| {
            let alone = line.places == 1;
            if alone {
                (line.places, line.holding) = (0, 0);
            }
            alone
        };
        if place.line.state().places == 1 && place.take_line_away_if(alone) {
            place.left = true;
            return;
        }
        place.line.turns.add_permits(place.weight as usize);
        place.line.state().holding -= 1;
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
