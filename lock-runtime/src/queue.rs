//! The local line for a key: the tasks of one client that want it wait here, first
//! come first served, so Redis sees one waiter per client however many tasks wait
//! for a lock (for a semaphore, up to its permits; for shared holders, each one).
//! A task whose turn it is listens for the holder's release, and keeps its turn
//! while it holds the lock. A holder may leave what it holds (`H`) in the line for
//! the next task instead of releasing it. A key nobody waits for or holds leaves
//! nothing behind.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

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
    lines: Mutex<HashMap<LineKey, Line<H>>>,
}

/// A line's key, the lock's Redis name, shared with the places in it: joining a
/// line copies no name.
struct LineKey(Arc<LockName>);

struct Line<H> {
    /// How the line was first joined: a lock, shared, or a semaphore's permits.
    kind: Kind,
    turns: Arc<Semaphore>,
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
    turns: Arc<Semaphore>,
    /// How many of the line's turns this place takes.
    weight: u32,
}

/// A task's turn in its client's line for a key.
pub(crate) struct Turn<H> {
    // Declared first so that it drops first: the next in line goes when this does,
    // and finds the line still there.
    _permit: OwnedSemaphorePermit,
    place: Place<H>,
    /// What a turn that ended handed on, taken from the line as this turn began.
    handed: Option<H>,
}

impl<H> Queues<H> {
    pub(crate) fn new(backend: Arc<Backend>, client: Arc<str>) -> Arc<Queues<H>> {
        Arc::new(Queues {
            backend,
            client,
            lines: Mutex::default(),
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
        let line = lines.entry(LineKey(name.clone())).or_insert_with(|| Line {
            kind,
            turns: Arc::new(Semaphore::new(capacity as usize)),
            places: 0,
            holding: 0,
            releases: None,
            handed: Vec::new(),
        });
        if !line.kind.mixes_with(kind) {
            return Err(line.kind);
        }
        line.places += 1;
        Ok(Place {
            queues: self.clone(),
            name: name.clone(),
            turns: line.turns.clone(),
            weight,
        })
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, HashMap<LineKey, Line<H>>> {
        self.lines
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl<H> Place<H> {
    /// Waits for this place's turn: for the tasks ahead to have theirs, and for room
    /// among the turns taken.
    pub(crate) async fn turn(self) -> Turn<H> {
        let turns = self.turns.clone().acquire_many_owned(self.weight).await;
        self.started(turns.expect("a line's turns are never closed"))
    }

    /// The turn, if it is this place's at once; else the place, still in line.
    pub(crate) fn try_turn(self) -> Result<Turn<H>, Place<H>> {
        match self.turns.clone().try_acquire_many_owned(self.weight) {
            Ok(turns) => Ok(self.started(turns)),
            Err(_) => Err(self),
        }
    }

    fn started(self, permit: OwnedSemaphorePermit) -> Turn<H> {
        let handed = self
            .queues
            .lines()
            .get_mut(self.name.hash())
            .and_then(|line| {
                line.holding += 1;
                line.handed.pop()
            });
        Turn {
            _permit: permit,
            place: self,
            handed,
        }
    }
}

impl<H> Drop for Place<H> {
    /// A place that goes before its turn leaves what was handed on for it to the
    /// tasks still waiting, and drops the rest, which gives it back to the store.
    fn drop(&mut self) {
        let mut lines = self.queues.lines();
        let Some(line) = lines.get_mut(self.name.hash()) else {
            return;
        };
        line.places -= 1;
        let waiting = line.places - line.holding;
        let unclaimed = line.handed.split_off(waiting.min(line.handed.len()));
        let emptied = match line.places {
            0 => lines.remove(self.name.hash()),
            _ => None,
        };
        drop(lines);
        drop(unclaimed);
        drop(emptied);
    }
}

impl<H> Turn<H> {
    /// Leaves `handed` for the next task in line and ends this turn, if a task waits
    /// that nothing else was left for; otherwise gives both back.
    pub(crate) fn hand_on(self, handed: H) -> Result<(), (Turn<H>, H)> {
        let place = &self.place;
        let mut lines = place.queues.lines();
        match lines.get_mut(place.name.hash()) {
            Some(line) if line.places - line.holding > line.handed.len() => {
                line.handed.push(handed);
                drop(lines);
                Ok(())
            }
            _ => {
                drop(lines);
                Err((self, handed))
            }
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
        let subscription = queues
            .backend
            .subscribe(&place.name, &queues.client)
            .await
            .ok()?;
        let releases = subscription.releases();
        if let Some(line) = place.queues.lines().get_mut(place.name.hash()) {
            line.releases = Some(subscription);
        }
        Some(releases)
    }

    /// The key's release signals if the line already listens for them.
    pub(crate) fn subscribed(&self) -> Option<watch::Receiver<u64>> {
        let place = &self.place;
        let lines = place.queues.lines();
        let line = lines.get(place.name.hash())?;
        line.releases.as_ref().map(Subscription::releases)
    }
}

impl<H> Drop for Turn<H> {
    fn drop(&mut self) {
        let place = &self.place;
        if let Some(line) = place.queues.lines().get_mut(place.name.hash()) {
            line.holding -= 1;
        }
    }
}

impl Borrow<str> for LineKey {
    fn borrow(&self) -> &str {
        self.0.hash()
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
