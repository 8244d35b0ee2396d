use std::collections::HashMap;
use std::fmt::{self, Write};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Attempt, Backend, MemoryStore, RedisNode, Redlock, Signals, Store, Target};
use crate::guard::{Hold, LockGuard};
use crate::keeper::Keeper;
use crate::key::LockName;
use crate::options::Plan;
use crate::waiting::{Queues, Turn, wait_for_release};
use crate::{LockError, LockOptions};

/// How a client talks to Redis: the bounds on connecting and on each call.
///
/// Every Redis call, including waiting on a reconnect, gives up after
/// `command_timeout` with `LockError::Backend`, so an unreachable Redis is an error
/// within that bound, never a hang.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    pub(crate) connect_timeout: Duration,
    pub(crate) command_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
        }
    }
}

impl ClientConfig {
    /// The defaults: 2 s to connect, 2 s for each call.
    pub fn new() -> Self {
        Self::default()
    }

    /// The longest `connect` and each reconnect may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// The longest one Redis call may take, reconnecting included.
    pub fn command_timeout(mut self, timeout: Duration) -> Self {
        self.command_timeout = timeout;
        self
    }
}

/// A handle on where locks live: one Redis, a Sentinel-watched primary, a Cluster,
/// Redlock masters, or this process's memory.
///
/// Cloning is cheap and clones share the connection, the client's identity and the
/// record of which task holds what.
#[derive(Clone)]
pub struct LockClient {
    shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) backend: Backend,
    /// Random per client; an owner is this id plus the holding task.
    id: String,
    /// The holds of this client's tasks, so a task that holds a key re-enters it
    /// without a round trip.
    holds: Mutex<HashMap<String, Vec<Weak<Hold>>>>,
    /// The tasks of this client waiting for each key, in line.
    pub(crate) queues: Queues,
    keeper: Arc<Keeper>,
}

impl LockClient {
    /// Connects to one Redis at `url` (`redis://127.0.0.1:6379`), reconnecting when the
    /// connection drops.
    pub async fn connect(url: &str) -> Result<LockClient, LockError> {
        Self::connect_with(url, ClientConfig::default()).await
    }

    /// Like [`connect`](Self::connect), with explicit time bounds.
    pub async fn connect_with(url: &str, config: ClientConfig) -> Result<LockClient, LockError> {
        let target =
            Target::server(url).map_err(|source| LockError::Backend { key: None, source })?;
        Self::connect_to(target, config).await
    }

    /// A Redis Cluster, from the URLs of some of its nodes. Each lock's keys share
    /// one hash slot; releases are published per shard (`SPUBLISH`, Redis 7 or
    /// later). Redirections during resharding are followed.
    pub async fn cluster<I>(urls: I) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::cluster_with(urls, ClientConfig::default()).await
    }

    /// Like [`cluster`](Self::cluster), with explicit time bounds.
    pub async fn cluster_with<I>(urls: I, config: ClientConfig) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::connect_to(Target::cluster(owned(urls)), config).await
    }

    /// The primary that the Sentinels at `sentinel_urls` name for `primary_name`,
    /// followed through failovers. A lock taken on a primary that fails before
    /// replicating it is lost with it: the watchdog reports the loss.
    pub async fn sentinel<I>(sentinel_urls: I, primary_name: &str) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        Self::sentinel_with(sentinel_urls, primary_name, ClientConfig::default()).await
    }

    /// Like [`sentinel`](Self::sentinel), with explicit time bounds.
    pub async fn sentinel_with<I>(
        sentinel_urls: I,
        primary_name: &str,
        config: ClientConfig,
    ) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let target = Target::sentinel(owned(sentinel_urls), primary_name)
            .map_err(|source| LockError::Backend { key: None, source })?;
        Self::connect_to(target, config).await
    }

    async fn connect_to(target: Target, config: ClientConfig) -> Result<LockClient, LockError> {
        let signals = Arc::new(Signals::default());
        let node = RedisNode::connect(target, &config, signals.clone()).await?;
        Ok(Self::with_backend(Backend::new(
            Store::Redis(node),
            signals,
        )))
    }

    /// Locks kept in this process's memory, with the same semantics as Redis. For
    /// tests and single-process demos: other processes do not see these locks.
    pub fn memory() -> LockClient {
        let signals = Arc::new(Signals::default());
        let store = MemoryStore::new(signals.clone());
        Self::with_backend(Backend::new(Store::Memory(store), signals))
    }

    /// The Redlock algorithm over independent Redis masters (use an odd number, 3 or
    /// more): a lock is held when a majority of them grant it, so it survives the
    /// loss of a minority. Each node call gives up after 200 ms; a node unreachable
    /// at start-up is retried on use, but a majority must answer now.
    pub async fn redlock<I>(urls: I) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let config = ClientConfig::new()
            .command_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(500));
        Self::redlock_with(urls, config).await
    }

    /// Like [`redlock`](Self::redlock), with explicit time bounds for each node.
    pub async fn redlock_with<I>(urls: I, config: ClientConfig) -> Result<LockClient, LockError>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let signals = Arc::new(Signals::default());
        let redlock = Redlock::connect(owned(urls), &config, signals.clone()).await?;
        Ok(Self::with_backend(Backend::new(
            Store::Redlock(redlock),
            signals,
        )))
    }

    fn with_backend(backend: Backend) -> LockClient {
        LockClient {
            shared: Arc::new(Shared {
                backend,
                id: uuid::Uuid::new_v4().simple().to_string(),
                holds: Mutex::default(),
                queues: Queues::default(),
                keeper: Arc::default(),
            }),
        }
    }

    /// Takes the lock on `key`, waiting as `options` say.
    ///
    /// Fails with `Busy` when `spin(false)` and the lock is held, `Timeout` when it
    /// stays held through every attempt, `Backend` when Redis does not answer within
    /// the client's bound.
    pub async fn acquire(&self, key: &str, options: &LockOptions) -> Result<LockGuard, LockError> {
        let plan = options.plan(key)?;
        self.acquire_planned(key, plan).await
    }

    /// Makes one attempt: `None` when another owner holds the lock. Any waiting in
    /// `options` is ignored.
    pub async fn try_acquire(
        &self,
        key: &str,
        options: &LockOptions,
    ) -> Result<Option<LockGuard>, LockError> {
        let mut plan = options.plan(key)?;
        plan.spin = false;
        match self.acquire_planned(key, plan).await {
            Ok(guard) => Ok(Some(guard)),
            Err(LockError::Busy { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Boxed: the waiting loop's future nests deep enough to exhaust the compiler's
    /// query depth in callers' crates when laid out inline.
    fn acquire_planned<'a>(
        &'a self,
        key: &'a str,
        plan: Plan,
    ) -> Pin<Box<dyn Future<Output = Result<LockGuard, LockError>> + Send + 'a>> {
        Box::pin(self.wait_and_acquire(key, plan))
    }

    async fn wait_and_acquire(&self, key: &str, plan: Plan) -> Result<LockGuard, LockError> {
        let name = Arc::new(LockName::new(key)?);
        let owner = self.owner();
        if let Some(guard) = self.reenter(&owner, &name, &plan)? {
            return Ok(guard);
        }
        let started = Instant::now();
        let turn = if plan.spin {
            let in_line = self.shared.queues.wait_turn(self, &name);
            match tokio::time::timeout(plan.patience(), in_line).await {
                Ok(turn) => turn,
                Err(_) => return Err(timeout(&name, 0, started)),
            }
        } else {
            let turn = self.shared.queues.try_turn(self, &name);
            turn.ok_or_else(|| LockError::Busy {
                key: name.key.clone(),
            })?
        };
        let deadline = plan.timeout.map(|timeout| started + timeout);
        let mut releases = turn.subscribed();
        let mut retries_left = plan.retries;
        let mut attempts = 0;
        loop {
            if let Some(releases) = &mut releases {
                releases.mark_unchanged();
            }
            let sent_at = Instant::now();
            attempts += 1;
            let attempt = self
                .shared
                .backend
                .acquire(&name, &owner, plan.lease, plan.fencing)
                .await?;
            let retry_in = match attempt {
                Attempt::Granted { fence } => {
                    return Ok(self.hold(name, owner, plan, fence, sent_at, turn));
                }
                Attempt::Busy { retry_in, .. } => retry_in,
            };
            if !plan.spin {
                return Err(LockError::Busy {
                    key: name.key.clone(),
                });
            }
            if retries_left == Some(0)
                || deadline.is_some_and(|deadline| Instant::now() >= deadline)
            {
                return Err(timeout(&name, attempts, started));
            }
            if releases.is_none() {
                releases = turn.releases().await;
            }
            let mut pause = plan.retry_wait;
            if let Some(retry_in) = retry_in {
                pause = pause.min(retry_in);
            }
            if let Some(deadline) = deadline {
                pause = pause.min(deadline.saturating_duration_since(Instant::now()));
            }
            // Waking to a release and losing the race for it does not use up a retry.
            if !wait_for_release(releases.as_mut(), pause).await {
                retries_left = retries_left.map(|left| left - 1);
            }
        }
    }

    /// A task that already holds the key takes it again without asking Redis.
    fn reenter(
        &self,
        owner: &str,
        name: &LockName,
        plan: &Plan,
    ) -> Result<Option<LockGuard>, LockError> {
        let holds = self.holds();
        let task_holds = holds.get(&name.hash).into_iter().flatten();
        let Some(hold) = task_holds
            .filter_map(Weak::upgrade)
            .find(|hold| hold.owner == owner)
        else {
            return Ok(None);
        };
        if !hold.is_held() {
            return Ok(None);
        }
        if !plan.reentrant {
            return Err(LockError::Reentered {
                key: name.key.clone(),
            });
        }
        hold.enter();
        Ok(Some(LockGuard::new(hold)))
    }

    fn hold(
        &self,
        name: Arc<LockName>,
        owner: String,
        plan: Plan,
        fence: Option<u64>,
        sent_at: Instant,
        turn: Turn,
    ) -> LockGuard {
        let hold = Hold::start(self.clone(), name, owner, &plan, fence, sent_at, turn);
        let mut holds = self.holds();
        let key_holds = holds.entry(hold.name.hash.clone()).or_default();
        // A lost hold of this task may linger; the newest comes first.
        key_holds.insert(0, Arc::downgrade(&hold));
        LockGuard::new(hold)
    }

    /// Ends one of the task's holds of `hold`: true when it was the outermost, and
    /// the lock must now be released. Leaving and re-entering never interleave.
    pub(crate) fn leave(&self, hold: &Arc<Hold>) -> bool {
        let mut holds = self.holds();
        if !hold.leave() {
            return false;
        }
        if let Some(key_holds) = holds.get_mut(&hold.name.hash) {
            key_holds.retain(|other| !std::ptr::eq(other.as_ptr(), Arc::as_ptr(hold)));
            if key_holds.is_empty() {
                holds.remove(&hold.name.hash);
            }
        }
        true
    }

    /// This client's id and the calling task: who holds what this task takes.
    fn owner(&self) -> String {
        let mut owner = String::with_capacity(self.shared.id.len() + 24);
        owner.push_str(&self.shared.id);
        owner.push(':');
        write_task_scope(&mut owner);
        owner
    }

    pub(crate) fn backend(&self) -> &Backend {
        &self.shared.backend
    }

    pub(crate) fn keeper(&self) -> &Arc<Keeper> {
        &self.shared.keeper
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    fn holds(&self) -> std::sync::MutexGuard<'_, HashMap<String, Vec<Weak<Hold>>>> {
        self.shared
            .holds
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for LockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockClient")
            .field("backend", &self.shared.backend.kind())
            .field("id", &self.shared.id)
            .finish()
    }
}

fn owned<I>(urls: I) -> Vec<String>
where
    I: IntoIterator,
    I::Item: AsRef<str>,
{
    urls.into_iter()
        .map(|url| url.as_ref().to_owned())
        .collect()
}

fn timeout(name: &LockName, attempts: u32, started: Instant) -> LockError {
    LockError::Timeout {
        key: name.key.clone(),
        attempts,
        waited: started.elapsed(),
    }
}

/// The owner scope of the calling code: the tokio task, or the thread when the code
/// runs outside any task (as in `block_on`).
fn write_task_scope(owner: &mut String) {
    let _ = match tokio::task::try_id() {
        Some(task) => write!(owner, "task-{task}"),
        None => write!(owner, "thread-{:?}", std::thread::current().id()),
    };
}
