use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::Instant;

use super::signals::Signals;
use super::{Attempt, Queue, RedisNode, Released, Target, Waiters};
use crate::key::LockName;
use crate::options::{Kind, clock_drift};
use crate::{ClientConfig, LockError};

/// The Redlock algorithm over independent Redis masters: the same scripts run on
/// every node at once, and a lock is held when a majority grants it.
///
/// The client counts the lease's validity from before the first request, less the
/// clock-drift allowance, so the time spent asking the nodes is already taken off.
pub(crate) struct Redlock {
    nodes: Vec<Arc<RedisNode>>,
}

/// How one node answered.
type Answer<T> = Result<T, LockError>;

impl Redlock {
    /// Connects to every node; those unreachable now are retried on use. Fails unless
    /// a majority answers.
    pub(crate) async fn connect(
        urls: Vec<String>,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Result<Redlock, LockError> {
        if urls.is_empty() {
            return Err(LockError::InvalidOptions {
                key: String::new(),
                reason: "Redlock needs at least one Redis URL, and an odd number of 3 or more to survive failures".to_owned(),
            });
        }
        let mut connecting = JoinSet::new();
        for (index, url) in urls.iter().enumerate() {
            let (url, config, signals) = (url.clone(), config.clone(), signals.clone());
            connecting.spawn(async move {
                let connected = match Target::server(&url, &config) {
                    Ok(target) => RedisNode::connect(target, &config, signals).await,
                    Err(source) => Err(LockError::Backend { key: None, source }),
                };
                (index, connected)
            });
        }
        let mut nodes: Vec<Option<Arc<RedisNode>>> = urls.iter().map(|_| None).collect();
        let mut last_error = None;
        while let Some(joined) = connecting.join_next().await {
            let (index, connected) = joined.expect("connecting never panics");
            match connected {
                Ok(node) => nodes[index] = Some(Arc::new(node)),
                Err(error) => last_error = Some(error),
            }
        }
        let reachable = nodes.iter().flatten().count();
        if reachable < quorum(urls.len()) {
            return Err(last_error.expect("some node failed"));
        }
        let mut all = Vec::with_capacity(urls.len());
        for (node, url) in nodes.into_iter().zip(&urls) {
            all.push(match node {
                Some(node) => node,
                None => Arc::new(RedisNode::lazy(url, config, signals.clone())?),
            });
        }
        Ok(Redlock { nodes: all })
    }

    fn quorum(&self) -> usize {
        quorum(self.nodes.len())
    }

    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        token: &str,
        kind: Kind,
        lease: Duration,
        fencing: bool,
        queue: Queue,
    ) -> Result<Attempt, LockError> {
        let started = Instant::now();
        let answers = self
            .on_every_node(name, token, move |node, name, token| async move {
                node.acquire(&name, &token, kind, lease, fencing, queue)
                    .await
            })
            .await;
        let clash = answers.iter().find_map(|answer| match answer {
            Ok(Attempt::Clash { held_as }) => Some(*held_as),
            _ => None,
        });
        let granted = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(Attempt::Granted { .. })))
            .count();
        let busy_for: Vec<Option<Duration>> = answers
            .iter()
            .filter_map(|answer| match answer {
                Ok(Attempt::Busy { retry_in, .. }) => Some(*retry_in),
                _ => None,
            })
            .collect();
        // A majority that took longer to gather than the lease lasts grants nothing.
        let still_valid = started.elapsed() + clock_drift(lease) < lease;
        if granted >= self.quorum() && still_valid && clash.is_none() {
            if !fencing {
                return Ok(Attempt::Granted { fence: None });
            }
            if let Some(fence) = self.settle_fence(name, &answers).await {
                return Ok(Attempt::Granted { fence: Some(fence) });
            }
        }
        let given_back = granted > 0;
        if given_back {
            self.undo(name, token).await;
        }
        if let Some(held_as) = clash {
            return Ok(Attempt::Clash { held_as });
        }
        if granted + busy_for.len() < self.quorum() {
            return Err(LockError::Quorum {
                key: name.key().to_owned(),
                granted,
                needed: self.quorum(),
            });
        }
        // Held by another acquisition: look again when the soonest of its leases ends,
        // where the nodes said. A split vote: after a random pause, so the contenders
        // stop colliding.
        let retry_in = match busy_for.len() >= self.quorum() {
            true => busy_for.iter().flatten().min().copied(),
            false => Some(random_pause()),
        };
        Ok(match given_back {
            true => Attempt::GivenBack { retry_in },
            false => Attempt::Busy {
                retry_in,
                fence: None,
            },
        })
    }

    /// The token is one more than the largest counter any node reported, granting
    /// or not (a granting node's counter is already its new token). It is issued only
    /// once a majority of nodes hold a counter at or above it, the nodes behind
    /// raised first: any later majority then shares a node that makes the next token
    /// larger. `None` when too few nodes could be raised.
    async fn settle_fence(&self, name: &LockName, answers: &[Answer<Attempt>]) -> Option<u64> {
        let counters: Vec<Option<u64>> = answers
            .iter()
            .map(|answer| match answer {
                Ok(Attempt::Granted { fence }) | Ok(Attempt::Busy { fence, .. }) => *fence,
                _ => None,
            })
            .collect();
        let token = answers
            .iter()
            .filter_map(|answer| match answer {
                Ok(Attempt::Granted { fence }) => *fence,
                Ok(Attempt::Busy { fence, .. }) => fence.map(|counter| counter + 1),
                _ => None,
            })
            .max()?;
        let mut at_or_above = counters.iter().flatten().filter(|&&c| c >= token).count();
        let mut raising = JoinSet::new();
        for (node, counter) in self.nodes.iter().zip(counters) {
            if counter.is_some_and(|counter| counter < token) {
                let (node, name) = (node.clone(), name.clone());
                raising.spawn(async move { node.raise_fence(&name, token).await });
            }
        }
        while let Some(raised) = raising.join_next().await {
            if matches!(raised, Ok(Ok(counter)) if counter >= token) {
                at_or_above += 1;
            }
        }
        (at_or_above >= self.quorum()).then_some(token)
    }

    /// Releases whatever part of a failed acquisition was granted, quietly: no waiter
    /// should rush in for a lock that was never held.
    async fn undo(&self, name: &LockName, token: &str) {
        let _ = self
            .on_every_node(name, token, |node, name, token| async move {
                node.release(&name, &token, Waiters::None).await
            })
            .await;
    }

    /// Frees the lock on every node that `token` holds it on; every waiter hears
    /// of it. No queue passes it on: each master would pass it to another client.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        token: &str,
    ) -> Result<Released, LockError> {
        let answers = self
            .on_every_node(name, token, move |node, name, token| async move {
                node.release(&name, &token, Waiters::Broadcast).await
            })
            .await;
        if answers
            .iter()
            .any(|answer| matches!(answer, Ok(Released::Freed)))
        {
            return Ok(Released::Freed);
        }
        match answers.into_iter().find_map(Result::err) {
            Some(error) => Err(error),
            None => Ok(Released::NotHeld),
        }
    }

    /// The lease a majority of nodes still holds the lock for; `None` when fewer
    /// than a majority hold it.
    pub(crate) async fn lease_left(&self, name: &LockName) -> Result<Option<Duration>, LockError> {
        let answers = self
            .on_every_node(name, "", |node, name, _| async move {
                node.lease_left(&name).await
            })
            .await;
        let answered = answers.iter().filter(|answer| answer.is_ok()).count();
        if answered < self.quorum() {
            let error = answers.into_iter().find_map(Result::err);
            return Err(error.expect("a node failed"));
        }
        let mut held: Vec<Duration> = answers.into_iter().flatten().flatten().collect();
        held.sort_unstable_by(|a, b| b.cmp(a));
        Ok(held.get(self.quorum() - 1).copied())
    }

    /// Frees the lock on every node whoever holds it; whether any node held it.
    pub(crate) async fn force_unlock(&self, name: &LockName) -> Result<bool, LockError> {
        let answers = self
            .on_every_node(name, "", |node, name, _| async move {
                node.force_unlock(&name, Waiters::Broadcast).await
            })
            .await;
        if answers.iter().any(|answer| matches!(answer, Ok(true))) {
            return Ok(true);
        }
        match answers.into_iter().find_map(Result::err) {
            Some(error) => Err(error),
            None => Ok(false),
        }
    }

    /// Renewed when a majority renews. Lost when so many refuse that no majority can
    /// renew; otherwise the failures are errors, retried while the lease lasts.
    pub(crate) async fn renew(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
    ) -> Result<bool, LockError> {
        let answers = self
            .on_every_node(name, token, move |node, name, token| async move {
                node.renew(&name, &token, lease).await
            })
            .await;
        let renewed = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(true)))
            .count();
        let refused = answers
            .iter()
            .filter(|answer| matches!(answer, Ok(false)))
            .count();
        if renewed >= self.quorum() {
            Ok(true)
        } else if refused > self.nodes.len() - self.quorum() {
            Ok(false)
        } else {
            Err(LockError::Quorum {
                key: name.key().to_owned(),
                granted: renewed,
                needed: self.quorum(),
            })
        }
    }

    /// Listens on every node that answers; releases are published on each.
    pub(crate) async fn listen(&self, name: &LockName) -> Result<(), LockError> {
        let answers = self
            .on_every_node(name, "", |node, name, _| async move {
                node.listen(&name, &name.channel()).await
            })
            .await;
        let mut errors = answers.into_iter().filter_map(Result::err);
        match errors.next() {
            Some(error) if errors.count() + 1 == self.nodes.len() => Err(error),
            _ => Ok(()),
        }
    }

    pub(crate) async fn unlisten(&self, name: &LockName) {
        let _ = self
            .on_every_node(name, "", |node, name, _| async move {
                node.unlisten(&name, &name.channel()).await;
                Ok(())
            })
            .await;
    }

    /// Runs `call` on every node at once; the answers come in node order. Each node
    /// call is bounded by the client's command timeout.
    async fn on_every_node<T, F>(
        &self,
        name: &LockName,
        token: &str,
        call: impl Fn(Arc<RedisNode>, LockName, String) -> F,
    ) -> Vec<Answer<T>>
    where
        F: Future<Output = Answer<T>> + Send + 'static,
        T: Send + 'static,
    {
        let mut calls = JoinSet::new();
        for (index, node) in self.nodes.iter().enumerate() {
            let call = call(node.clone(), name.clone(), token.to_owned());
            calls.spawn(async move { (index, call.await) });
        }
        let mut answers: Vec<Option<Answer<T>>> = self.nodes.iter().map(|_| None).collect();
        while let Some(joined) = calls.join_next().await {
            let (index, answer) = joined.expect("node calls never panic");
            answers[index] = Some(answer);
        }
        answers
            .into_iter()
            .map(|answer| answer.expect("every node answered"))
            .collect()
    }
}

fn quorum(nodes: usize) -> usize {
    nodes / 2 + 1
}

/// Up to 50 ms, from the standard library's per-process random hash keys.
fn random_pause() -> Duration {
    Duration::from_millis(RandomState::new().hash_one(std::time::Instant::now()) % 50)
}
