//! A grant counts once the replicas that may be promoted have it. After a script
//! grants or renews a lock, a round on a connection of its own confirms it: a script
//! checks that each token still holds its lock and writes that lock's expiry again
//! as it stands, and a `WAIT`, in the same pipeline, then returns once the replicas
//! have everything the node had written up to that write, grants included. (`WAIT`
//! counts only the writes of its own connection, hence the write, and the pipeline,
//! which keeps the two on one connection.) Grants that arrive while a round runs share
//! the next one, a group commit: one `WAIT` covers them all, and the connection that
//! takes and frees locks never blocks on one. On a Cluster, one `WAIT` covers each
//! primary's: those sent in turn on one connection would each wait out the replica
//! timeout behind the one before. Through Sentinel, a round also says what they say
//! of the server that answered a release; that question waits up to 100 ms to share
//! a grant's round, so that the Sentinels are asked once for both.

use std::collections::{BTreeMap, HashMap};
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use redis::{ConnectionAddr, ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::{OnceCell, mpsc, oneshot};
use tokio::task::JoinSet;

use super::connection::{Connection, LuaScript, Replicas, ScriptCall, SlotRange, Target, bounded};
use super::sentinels::{Said, Sentinels, Verdict};
use crate::key::{LockName, slot};
use crate::{ClientConfig, LockError, telemetry};

static CONFIRM: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(concat!(
        include_str!("scripts/holders.lua"),
        include_str!("scripts/confirm.lua")
    ))
});

/// What confirming a grant or renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Confirmed {
    /// The replicas required have it (and the primary's disk, with `fsync`).
    Yes,
    /// The token no longer holds the lock.
    NotHeld,
    /// Fewer replicas than required acknowledged it in time, or it was not written
    /// to disk in time.
    Short(Shortfall),
}

impl Confirmed {
    /// What a renewal of `key` comes to, once confirming it found this: whether the
    /// lock is still held, or an error that says what the replicas lacked.
    pub(crate) fn renewed(self, key: &str) -> Result<bool, LockError> {
        match self {
            Confirmed::Yes => Ok(true),
            Confirmed::NotHeld => Ok(false),
            Confirmed::Short(shortfall) => Err(shortfall.error(key)),
        }
    }
}

/// What a grant or renewal that was not confirmed lacked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shortfall {
    acknowledged: usize,
    required: usize,
    /// Whether the primary's append-only file had it, where `fsync` asks.
    on_disk: Option<bool>,
    /// Through Sentinel, whether they vouched for the primary that had it.
    named_by_sentinels: Option<bool>,
}

impl Shortfall {
    pub(crate) fn error(self, key: &str) -> LockError {
        LockError::Replication {
            key: key.to_owned(),
            acknowledged: self.acknowledged,
            required: self.required,
            on_disk: self.on_disk,
            named_by_sentinels: self.named_by_sentinels,
        }
    }
}

/// How long a round's first wait lasts: replicas that keep up acknowledge within it.
const FIRST_WAIT_MS: u64 = 10;

/// The longest a question for a verdict waits to share a round with a grant or
/// renewal.
const VERDICT_WITHIN: Duration = Duration::from_millis(100);

pub(crate) struct Replication {
    required: Required,
    rounds: Arc<Rounds>,
    /// Where requests for the next round go; a task runs the rounds, started again
    /// on the caller's runtime when the one it ran on has gone.
    requests: Mutex<Option<mpsc::UnboundedSender<Asked>>>,
}

/// How many replicas must acknowledge a grant.
enum Required {
    Configured(usize),
    /// One wherever the primary has replicas, as last counted.
    Listed(Arc<Counted>),
}

/// How often the replicas are counted again, while the client is used.
const RECOUNT_EVERY: Duration = Duration::from_secs(10);

/// The replicas of each primary, counted at connect and again every `RECOUNT_EVERY`
/// while the client is used: a primary given its first replica after the client
/// connected (a replica added to scale out, or started after the service) has its
/// grants wait for it from then on, before a failover can promote it. A count never
/// drops: a replica that went may be the one promoted when it comes back, and a
/// single server lists only the replicas connected to it.
pub(crate) struct Counted {
    replicas: RwLock<Replicas>,
    since: Instant,
    /// When to count again, in milliseconds since `since`.
    next_ms: AtomicU64,
}

impl Counted {
    /// Counts the replicas of `target`'s primaries on `main`.
    pub(crate) async fn at_connect(
        target: &Target,
        main: &mut Connection,
        config: &ClientConfig,
    ) -> Result<Arc<Counted>, LockError> {
        let counting = bounded(config.command_timeout, target.replicas(main));
        let replicas = counting.await.map_err(|source| {
            if source.code() != Some("NOPERM") {
                return LockError::Backend { key: None, source };
            }
            LockError::InvalidOptions {
                key: String::new(),
                reason: format!(
                    "the client could not ask how many replicas the primary has \
                     (`ROLE`, or `CLUSTER SLOTS` on a Cluster): {source}; allow that \
                     command to the user, or set `ClientConfig::replicas`"
                ),
            }
        })?;
        telemetry::replicas_counted(&replicas);
        Ok(Arc::new(Counted {
            replicas: RwLock::new(replicas),
            since: Instant::now(),
            next_ms: AtomicU64::new(RECOUNT_EVERY.as_millis() as u64),
        }))
    }

    /// Whether to count again now: true for one caller each `RECOUNT_EVERY`.
    pub(crate) fn due(&self) -> bool {
        let now = self.since.elapsed().as_millis() as u64;
        let next = self.next_ms.load(Ordering::Relaxed);
        now >= next
            && (self.next_ms)
                .compare_exchange(
                    next,
                    now + RECOUNT_EVERY.as_millis() as u64,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
    }

    /// Counts again on `connection`; a count that cannot be had leaves the last.
    pub(crate) async fn again(
        &self,
        target: &Target,
        mut connection: Connection,
        config: &ClientConfig,
    ) {
        let counting = bounded(config.command_timeout, target.replicas(&mut connection));
        if let Ok(now) = counting.await {
            let mut replicas = self.replicas.write().unwrap_or_else(|p| p.into_inner());
            let now = now.at_least(&replicas);
            if now != *replicas {
                telemetry::replicas_counted(&now);
                *replicas = now;
            }
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, Replicas> {
        self.replicas.read().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn any(&self) -> bool {
        self.read().any()
    }
}

struct Rounds {
    connection: Connection,
    /// Through Sentinel, asked in each round whether `connection` reached their
    /// primary.
    sentinels: Option<Arc<Sentinels>>,
    fsync: bool,
    cluster: bool,
    wait_ms: u64,
    /// The longest a round's request may take, waiting included.
    limit: Duration,
    /// On a Cluster, the primaries as last listed; forgotten when a slot has moved.
    primaries: Mutex<Option<Arc<Primaries>>>,
}

/// Which primary serves each range of slots: its first and last slot and the
/// primary's number.
struct Primaries(Vec<(u16, u16, usize)>);

/// What confirming the requests of one primary found: for each slot's, whether each
/// token holds its lock, or why the check was refused; how many replicas then
/// acknowledged the writes, and whether the primary wrote them to disk, where that
/// is asked for.
struct Found {
    held: Vec<RedisResult<Vec<bool>>>,
    acknowledged: usize,
    on_disk: Option<bool>,
}

/// What a round is asked: to confirm a grant or renewal, or through Sentinel, only
/// what they say of a server.
enum Asked {
    Confirm(Request),
    Verdict {
        reached: Option<ConnectionAddr>,
        answer: oneshot::Sender<Verdict>,
    },
}

struct Request {
    lock: String,
    token: String,
    required: usize,
    answer: oneshot::Sender<RedisResult<Confirmed>>,
}

impl Required {
    fn of(&self, lock: &str) -> usize {
        match self {
            Required::Configured(count) => *count,
            Required::Listed(counted) => counted.read().of(lock).min(1),
        }
    }

    fn any(&self) -> bool {
        match self {
            Required::Configured(count) => *count > 0,
            Required::Listed(counted) => counted.any(),
        }
    }
}

impl Replication {
    /// Whether the connection grants are confirmed over is made before it is known to
    /// be needed, beside the main one: on a Cluster, where each of the two would
    /// otherwise wait on a silent node in turn.
    pub(crate) fn connects_early(target: &Target, config: &ClientConfig) -> bool {
        matches!(target, Target::Cluster(_)) && (config.fsync || config.replicas != Some(0))
    }

    /// The connection grants are confirmed over: one apart from the locks', since
    /// `WAIT` blocks the connection it is sent on.
    pub(crate) async fn connect_apart(
        target: &Target,
        config: &ClientConfig,
    ) -> Result<Connection, LockError> {
        let apart = config.clone().command_timeout(Self::limit(config));
        bounded(config.connecting_bound(), target.connect_apart(&apart))
            .await
            .map_err(|source| LockError::Backend { key: None, source })
    }

    fn limit(config: &ClientConfig) -> Duration {
        config.command_timeout + config.replica_timeout
    }

    /// What confirming grants takes on `target`: `None` when nothing is required,
    /// which costs nothing. `counted` are the replicas counted, where the config
    /// leaves it to them; `apart` is the connection `connect_apart` made early, if
    /// it did.
    pub(crate) async fn connect(
        target: &Target,
        config: &ClientConfig,
        counted: Option<Arc<Counted>>,
        apart: Option<Result<Connection, LockError>>,
    ) -> Result<Option<Replication>, LockError> {
        let required = match counted {
            Some(counted) => Required::Listed(counted),
            None => Required::Configured(config.replicas.unwrap_or(0)),
        };
        if !required.any() && !config.fsync {
            return Ok(None);
        }
        let limit = Self::limit(config);
        let mut connection = match apart {
            Some(made) => made?,
            None => Self::connect_apart(target, config).await?,
        };
        let wait_ms = config.replica_timeout.as_millis().clamp(1, u64::MAX.into()) as u64;
        if config.fsync {
            let mut waitaof = redis::cmd("WAITAOF");
            waitaof.arg(1).arg(0).arg(wait_ms);
            let checked = bounded(limit, connection.query::<redis::Value>(&waitaof));
            if let Err(error) = checked.await {
                return Err(LockError::InvalidOptions {
                    key: String::new(),
                    reason: format!(
                        "`fsync(true)` needs Redis or Valkey 7.2 or newer with `appendonly yes`, \
                         and the server refused `WAITAOF 1 0`: {error}"
                    ),
                });
            }
        }
        let sentinels = Sentinels::of(target, config).await?;
        Ok(Some(Replication {
            required,
            rounds: Arc::new(Rounds {
                connection,
                sentinels,
                fsync: config.fsync,
                cluster: matches!(target, Target::Cluster(_)),
                wait_ms,
                limit,
                primaries: Mutex::default(),
            }),
            requests: Mutex::default(),
        }))
    }

    /// Whether the replicas required have what `token` was granted or renewed on
    /// `name`, once the answer that said so has arrived.
    pub(crate) async fn confirm(&self, name: &LockName, token: &str) -> RedisResult<Confirmed> {
        match self.ask(name, token) {
            Ok(answered) => answered.await.unwrap_or_else(|_| Err(no_rounds())),
            Err(confirmed) => confirmed,
        }
    }

    /// [`confirm`](Self::confirm) for each of `grants`, all asked in one round.
    pub(crate) async fn confirm_all(
        &self,
        grants: &[(&LockName, &str)],
    ) -> Vec<RedisResult<Confirmed>> {
        let asked: Vec<_> = grants
            .iter()
            .map(|(name, token)| self.ask(name, token))
            .collect();
        let mut confirmed = Vec::with_capacity(asked.len());
        for asked in asked {
            confirmed.push(match asked {
                Ok(answered) => answered.await.unwrap_or_else(|_| Err(no_rounds())),
                Err(confirmed) => confirmed,
            });
        }
        confirmed
    }

    /// Sends the request for the next round; its answer comes on what this returns,
    /// or at once when nothing need be asked or nobody can be.
    fn ask(
        &self,
        name: &LockName,
        token: &str,
    ) -> Result<oneshot::Receiver<RedisResult<Confirmed>>, RedisResult<Confirmed>> {
        let required = self.required.of(name.hash());
        if required == 0 && !self.rounds.fsync {
            return Err(Ok(Confirmed::Yes));
        }
        let (answer, answered) = oneshot::channel();
        let request = Request {
            lock: name.hash().to_owned(),
            token: token.to_owned(),
            required,
            answer,
        };
        match self.send(Asked::Confirm(request)) {
            true => Ok(answered),
            false => Err(Err(no_rounds())),
        }
    }

    /// Through Sentinel, what they say of the server at `reached`, asked in the next
    /// round. Elsewhere, that it is the primary.
    pub(crate) async fn verdict_on(&self, reached: Option<ConnectionAddr>) -> Verdict {
        if self.rounds.sentinels.is_none() {
            return Verdict::Vouched;
        }
        let (answer, answered) = oneshot::channel();
        match self.send(Asked::Verdict { reached, answer }) {
            true => answered.await.unwrap_or(Verdict::Unsettled),
            false => Verdict::Unsettled,
        }
    }

    /// Whether `asked` reached the task that runs the rounds.
    fn send(&self, asked: Asked) -> bool {
        if let Err(unsent) = self.sender().send(asked) {
            // The task went with its runtime between our look and the send.
            lock(&self.requests).take();
            return self.sender().send(unsent.0).is_ok();
        }
        true
    }

    fn sender(&self) -> mpsc::UnboundedSender<Asked> {
        let mut requests = lock(&self.requests);
        match &*requests {
            Some(sender) if !sender.is_closed() => sender.clone(),
            _ => {
                let (sender, receiver) = mpsc::unbounded_channel();
                tokio::spawn(run_rounds(self.rounds.clone(), receiver));
                *requests = Some(sender.clone());
                sender
            }
        }
    }
}

/// Runs a round for every request waiting when the last one ended. Questions for a
/// verdict alone wait for a grant or renewal to confirm, for `VERDICT_WITHIN` at
/// most: a client that takes and frees locks asks the Sentinels once for both.
async fn run_rounds(rounds: Arc<Rounds>, mut requests: mpsc::UnboundedReceiver<Asked>) {
    while let Some(first) = requests.recv().await {
        let mut batch = vec![first];
        while let Ok(more) = requests.try_recv() {
            batch.push(more);
        }
        if batch
            .iter()
            .all(|asked| matches!(asked, Asked::Verdict { .. }))
        {
            let mut pause = pin!(tokio::time::sleep(VERDICT_WITHIN));
            while let Some(more) = tokio::select! {
                () = &mut pause => None,
                more = requests.recv() => more,
            } {
                let confirms = matches!(more, Asked::Confirm(_));
                batch.push(more);
                if confirms {
                    break;
                }
            }
        }
        rounds.run(batch).await;
    }
}

impl Rounds {
    /// Confirms `batch`, one pipeline per primary, and through Sentinel, asks them
    /// alongside.
    async fn run(self: &Arc<Self>, batch: Vec<Asked>) {
        let said = Arc::new(OnceCell::new());
        if let Some(sentinels) = self.sentinels.clone() {
            let said = said.clone();
            tokio::spawn(async move {
                said.get_or_init(|| sentinels.ask()).await;
            });
        }
        let mut verdicts = Vec::new();
        let batch: Vec<Request> = (batch.into_iter())
            .filter_map(|asked| match asked {
                Asked::Confirm(request) => Some(request),
                Asked::Verdict { reached, answer } => {
                    verdicts.push((reached, answer));
                    None
                }
            })
            .collect();
        let mut confirming = JoinSet::new();
        if let Some(sentinels) = self.sentinels.clone().filter(|_| !verdicts.is_empty()) {
            let said = said.clone();
            confirming.spawn(async move {
                let said = said.get_or_init(|| sentinels.ask()).await;
                for (reached, answer) in verdicts {
                    let _ = answer.send(said.verdict_on(reached.as_ref()));
                }
                false
            });
        }
        let primaries = match self.cluster {
            true => self.primaries().await,
            false => None,
        };
        // Each primary's requests, by slot: a script runs on the keys of one slot.
        // Slots of a primary not listed go alone.
        let mut nodes: BTreeMap<(Option<usize>, u16), BTreeMap<u16, Vec<Request>>> =
            BTreeMap::new();
        for request in batch {
            let slot = if self.cluster { slot(&request.lock) } else { 0 };
            let node = match primaries.as_ref().and_then(|primaries| primaries.of(slot)) {
                Some(primary) => (Some(primary), 0),
                None => (None, slot),
            };
            let slots = nodes.entry(node).or_default();
            slots.entry(slot).or_default().push(request);
        }
        for slots in nodes.into_values() {
            let node: Vec<Vec<Request>> = slots.into_values().collect();
            let rounds = self.clone();
            let said = said.clone();
            confirming.spawn(async move {
                let found = rounds.confirm(&node, &said).await;
                if node.len() > 1
                    && found
                        .as_ref()
                        .is_err_and(|error| error.redirect_node().is_some())
                {
                    return rounds.confirm_apart(node).await;
                }
                let named_by_sentinels = match (&rounds.sentinels, &found) {
                    (Some(sentinels), Ok(found)) if found.any_held() => {
                        let reached = rounds.connection.reached();
                        let said: &Said = said.get_or_init(|| sentinels.ask()).await;
                        Some(said.vouch_for(reached.as_ref()))
                    }
                    _ => None,
                };
                answer_each(node, found, named_by_sentinels)
            });
        }
        let mut unconfirmed = false;
        while let Some(joined) = confirming.join_next().await {
            unconfirmed |= joined.unwrap_or(false);
        }
        if unconfirmed {
            self.connection.ask_sentinels_again();
        }
    }

    /// Confirms each slot of `node` apart, and forgets the primaries listed: a slot
    /// that moved off the one listed for it sends the pipeline to where it went,
    /// where the checks of the slots that stayed send it back, until redis-rs gives
    /// up. Whether any was not confirmed.
    async fn confirm_apart(&self, node: Vec<Vec<Request>>) -> bool {
        lock(&self.primaries).take();
        let mut unconfirmed = false;
        for slot in node {
            let found = self
                .confirm(std::slice::from_ref(&slot), &OnceCell::new())
                .await;
            unconfirmed |= answer_each(vec![slot], found, None);
        }
        unconfirmed
    }

    /// On a Cluster, the primaries as last listed, or as the nodes list them now;
    /// `None` when none would say.
    async fn primaries(&self) -> Option<Arc<Primaries>> {
        if let Some(listed) = lock(&self.primaries).clone() {
            return Some(listed);
        }
        let mut connection = self.connection.clone();
        let listed = Arc::new(Primaries::listed(connection.slot_ranges().await.ok()?));
        *lock(&self.primaries) = Some(listed.clone());
        Some(listed)
    }

    /// What confirming the requests of one primary, `node`, finds. The checks and
    /// the waits go in one pipeline: `WAIT` counts only the writes of its own
    /// connection, and sent apart, after a reconnect or to another Cluster node, it
    /// would find none to wait for and return at once. A first short wait, then,
    /// where some lock is held and the replicas have not all acknowledged it yet,
    /// the rest: a check that finds nothing held (two connections that went
    /// different ways through a failover) is not kept for the whole wait, nor one
    /// on a primary the Sentinels, once `said` holds their answers, disown.
    async fn confirm(&self, node: &[Vec<Request>], said: &OnceCell<Said>) -> RedisResult<Found> {
        let checks: Vec<ScriptCall> = node
            .iter()
            .map(|requests| {
                let locks: Vec<&str> = requests
                    .iter()
                    .map(|request| request.lock.as_str())
                    .collect();
                let mut check = ScriptCall::new(&CONFIRM, &locks);
                for request in requests {
                    check.arg(&request.token);
                }
                check
            })
            .collect();
        let required = node.iter().flatten().map(|request| request.required).max();
        let required = required.filter(|&required| required > 0);
        let first = FIRST_WAIT_MS.min(self.wait_ms);
        let found = self.check_then_wait(&checks, required, first).await?;
        let enough = found.acknowledged >= required.unwrap_or(0) && found.on_disk != Some(false);
        if enough || first == self.wait_ms || !found.any_held() || self.disowned(said) {
            return Ok(found);
        }
        // The checks write again, and the wait covers that write wherever it goes.
        self.check_then_wait(&checks, required, self.wait_ms - first)
            .await
    }

    /// Whether the Sentinels have answered already, and name another primary than
    /// the one confirming, or are failing it over: no wait would make its grants
    /// count.
    fn disowned(&self, said: &OnceCell<Said>) -> bool {
        (said.get()).is_some_and(|said| !said.vouch_for(self.connection.reached().as_ref()))
    }

    async fn check_then_wait(
        &self,
        checks: &[ScriptCall],
        required: Option<usize>,
        wait_ms: u64,
    ) -> RedisResult<Found> {
        let mut waits = Vec::with_capacity(2);
        if let Some(required) = required {
            waits.push(redis::cmd("WAIT").arg(required).arg(wait_ms).clone());
        }
        if self.fsync {
            waits.push(redis::cmd("WAITAOF").arg(1).arg(0).arg(wait_ms).clone());
        }
        let mut connection = self.connection.clone();
        let confirming = ScriptCall::invoke_all_then(checks, &mut connection, &waits);
        let (held, waited) = bounded(self.limit, confirming).await?;
        let held = held.into_iter().map(|answer| {
            let held: Vec<i64> = redis::from_redis_value(answer.extract_error()?)?;
            Ok(held.into_iter().map(|held| held == 1).collect())
        });
        let mut waited = waited.into_iter().map(Value::extract_error);
        let acknowledged = match required {
            Some(_) => redis::from_redis_value(waited.next().unwrap_or(Ok(Value::Nil))?)?,
            None => 0,
        };
        let on_disk = match self.fsync {
            true => {
                let written = waited.next().unwrap_or(Ok(Value::Nil))?;
                let (local, _replicas): (usize, usize) = redis::from_redis_value(written)?;
                Some(local >= 1)
            }
            false => None,
        };
        Ok(Found {
            held: held.collect(),
            acknowledged,
            on_disk,
        })
    }
}

impl Primaries {
    /// Numbers each primary of `ranges`.
    fn listed(ranges: Vec<SlotRange>) -> Primaries {
        let mut numbers: HashMap<String, usize> = HashMap::new();
        let ranges = ranges.into_iter().map(|range| {
            let next = numbers.len();
            (
                range.first,
                range.last,
                *numbers.entry(range.primary).or_insert(next),
            )
        });
        Primaries(ranges.collect())
    }

    fn of(&self, slot: u16) -> Option<usize> {
        let range = self
            .0
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot));
        range.map(|(_, _, primary)| *primary)
    }
}

impl Found {
    fn any_held(&self) -> bool {
        self.held.iter().flatten().any(|held| held.contains(&true))
    }

    /// What it comes to for a request that needs `required` replicas, whose token
    /// holds its lock.
    fn for_holder(&self, required: usize, named_by_sentinels: Option<bool>) -> Confirmed {
        if self.acknowledged >= required
            && self.on_disk != Some(false)
            && named_by_sentinels != Some(false)
        {
            return Confirmed::Yes;
        }
        Confirmed::Short(Shortfall {
            acknowledged: self.acknowledged,
            required,
            on_disk: self.on_disk,
            named_by_sentinels,
        })
    }
}

/// Answers each request of `node` with what confirming it found; whether any was
/// not confirmed.
fn answer_each(
    node: Vec<Vec<Request>>,
    found: RedisResult<Found>,
    named_by_sentinels: Option<bool>,
) -> bool {
    let mut unconfirmed = false;
    for (group, requests) in node.into_iter().enumerate() {
        for (place, request) in requests.into_iter().enumerate() {
            let answer = match &found {
                Err(error) => Err(copy(error)),
                Ok(found) => match found.held.get(group) {
                    Some(Err(refusal)) => Err(copy(refusal)),
                    Some(Ok(held)) if held.get(place) == Some(&true) => {
                        Ok(found.for_holder(request.required, named_by_sentinels))
                    }
                    _ => Ok(Confirmed::NotHeld),
                },
            };
            unconfirmed |= matches!(answer, Ok(Confirmed::NotHeld | Confirmed::Short(_)));
            let _ = request.answer.send(answer);
        }
    }
    unconfirmed
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

/// The same error for another waiter: a `RedisError` does not clone.
fn copy(error: &RedisError) -> RedisError {
    RedisError::from((
        error.kind(),
        "confirming a grant with the replicas failed",
        error.to_string(),
    ))
}

fn no_rounds() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "the replica check stopped: its runtime shut down",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_served_by_one_primary_share_its_number() {
        let range = |first, last, primary: &str| SlotRange {
            first,
            last,
            primary: primary.to_owned(),
            replicas: 1,
        };
        let primaries = Primaries::listed(vec![
            range(0, 99, "127.0.0.1:7000"),
            range(100, 199, "127.0.0.1:7001"),
            range(200, 16383, "127.0.0.1:7000"),
        ]);
        assert_eq!(primaries.of(5), primaries.of(9000));
        assert_ne!(primaries.of(5), primaries.of(150));
        assert!(primaries.of(150).is_some());
        let partial = Primaries::listed(vec![range(0, 99, "127.0.0.1:7000")]);
        assert_eq!(partial.of(100), None, "a slot no range lists goes alone");
    }
}
