use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, LazyLock, OnceLock};
use std::time::Duration;

use redis::{Cmd, ConnectionAddr, ErrorKind, RedisError};
use tokio::sync::OnceCell;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::connection::{Connection, LuaScript, RECONNECT_EVERY, ScriptCall, Target, bounded};
use super::replication::{Confirmed, Counted, Replication};
use super::sentinels::Verdict;
use super::signals::Signals;
use super::{Attempt, CLAIM_WINDOW, Queue, Released, Renewing, Waiters, lease_ms, renewal_answers};
use crate::key::{LockName, slot};
use crate::options::Kind;
use crate::{ClientConfig, LockError, telemetry};

/// A script that reads or changes a lock, after the functions that tell who holds it;
/// a `head` before them answers the everyday case without defining them.
macro_rules! lock_script {
    ($head:literal, $file:literal) => {
        LazyLock::new(|| {
            LuaScript::new(concat!(
                include_str!($head),
                include_str!("scripts/holders.lua"),
                include_str!($file)
            ))
        })
    };
    ($file:literal) => {
        LazyLock::new(|| {
            LuaScript::new(concat!(
                include_str!("scripts/holders.lua"),
                include_str!($file)
            ))
        })
    };
}

static ACQUIRE: LazyLock<LuaScript> = lock_script!("scripts/acquire.lua");
static RELEASE: LazyLock<LuaScript> = lock_script!("scripts/release.lua");
static RELEASE_ALONE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/release_alone.lua")));
static FORCE_UNLOCK: LazyLock<LuaScript> = lock_script!("scripts/force_unlock.lua");
static RENEW: LazyLock<LuaScript> = lock_script!("scripts/renew_alone.lua", "scripts/renew.lua");
static RENEW_MANY: LazyLock<LuaScript> = lock_script!("scripts/renew_many.lua");
static RAISE_FENCE: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new(include_str!("scripts/raise_fence.lua")));

/// The most locks one renewal call takes: each costs Redis a read and a write, and
/// the call blocks the server while it runs.
const RENEWALS_PER_CALL: usize = 256;

/// The SHA1 of each lock script, by its file name, as `EVALSHA` sends it: for tools
/// that count Redis requests per script.
pub fn script_hashes() -> [(&'static str, &'static str); 5] {
    [
        ("acquire", ACQUIRE.hash()),
        ("release_alone", RELEASE_ALONE.hash()),
        ("release", RELEASE.hash()),
        ("force_unlock", FORCE_UNLOCK.hash()),
        ("renew", RENEW.hash()),
    ]
}

/// The Redis that holds the locks (one server, a Cluster, or Sentinel's primary),
/// reconnecting on its own. Every call is one round trip (`EVALSHA`; a script is
/// loaded again after a restart wipes it).
pub(crate) struct RedisNode {
    target: Arc<Target>,
    config: ClientConfig,
    connection: Connection,
    /// Confirms grants and renewals with the replicas, once any are required: from
    /// connect, or from when a count finds the first replica.
    replication: Arc<OnceLock<Replication>>,
    /// The replicas counted, where the config leaves it to them.
    counted: Option<Arc<Counted>>,
    /// The pub/sub connection, made when a task first has to wait.
    subscriber: OnceCell<Connection>,
    signals: Arc<Signals>,
    /// Whether the server takes `SET … IFEQ`, as found at connect; cleared should a
    /// server of a Cluster turn out not to.
    has_set_ifeq: AtomicBool,
    /// The `CompareAndDelete` the server has, as found at connect; the script should
    /// a server of a Cluster turn out not to have it.
    compare_and_delete: AtomicU8,
}

/// How a lock held alone, with nobody queued for it, is deleted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum CompareAndDelete {
    /// `release_alone.lua`: every server has it.
    Script = 0,
    /// `DELIFEQ key value`: Valkey 9.
    Delifeq = 1,
    /// `DELEX key IFEQ value`: Redis 8.4.
    Delex = 2,
}

impl RedisNode {
    /// Connects now, failing within `ClientConfig::connecting_bound` when Redis is
    /// unreachable.
    pub(crate) async fn connect(
        target: Target,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Result<Self, LockError> {
        target.follow_switches();
        let apart = async {
            match Replication::connects_early(&target, config) {
                true => Some(Replication::connect_apart(&target, config).await),
                false => None,
            }
        };
        let main = bounded(config.connecting_bound(), target.connect(config));
        let (main, apart) = tokio::join!(main, apart);
        let mut connection = main.map_err(LockError::at_connect)?;
        // Loaded up front (on every primary of a Cluster) so that the first lock costs
        // one round trip, not three.
        for script in [&*ACQUIRE, &*RELEASE_ALONE, &*RELEASE, &*RENEW, &*RENEW_MANY] {
            bounded(
                config.command_timeout,
                connection.query::<String>(&script.load()),
            )
            .await
            .map_err(LockError::at_connect)?;
        }
        if telemetry::WARNS {
            warn_if_locks_may_be_evicted(&mut connection, config.command_timeout).await;
        }
        let counted = match config.replicas {
            None => Some(Counted::at_connect(&target, &mut connection, config).await?),
            Some(_) => None,
        };
        let replication = Replication::connect(&target, config, counted.clone(), apart).await?;
        // Asked side by side: on a Cluster whose primary for the probes is silent, each
        // waits out the command timeout.
        let (has_set_ifeq, compare_and_delete) = tokio::join!(
            has_set_ifeq(&connection, config.command_timeout),
            compare_and_delete(&connection, config.command_timeout)
        );
        let mut node = Self::with_connection(target, connection, config, signals);
        node.replication = Arc::new(replication.map_or_else(OnceLock::new, OnceLock::from));
        node.counted = counted;
        node.has_set_ifeq = AtomicBool::new(has_set_ifeq);
        node.compare_and_delete = AtomicU8::new(compare_and_delete as u8);
        Ok(node)
    }

    /// Connects on first use: for a Redlock node that may be down at start-up. Its
    /// replicas are the user's business: Redlock's masters are independent.
    pub(crate) fn lazy(
        url: &str,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Result<Self, LockError> {
        let unreachable = |source| LockError::Backend { key: None, source };
        let target = Target::server(url, config).map_err(unreachable)?;
        let connection = target.connect_lazily(config).map_err(unreachable)?;
        Ok(Self::with_connection(target, connection, config, signals))
    }

    fn with_connection(
        target: Target,
        connection: Connection,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> Self {
        RedisNode {
            target: Arc::new(target),
            config: config.clone(),
            connection,
            replication: Arc::default(),
            counted: None,
            subscriber: OnceCell::new(),
            signals,
            has_set_ifeq: AtomicBool::new(false),
            compare_and_delete: AtomicU8::new(CompareAndDelete::Script as u8),
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.target.kind()
    }

    /// The confirming rounds, where any replica is required. When due, first has the
    /// replicas counted again, in the background ([`Counted`]).
    fn replication(&self) -> Option<&Replication> {
        if let Some(counted) = &self.counted
            && counted.due()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let (target, config) = (self.target.clone(), self.config.clone());
            let (counted, replication) = (counted.clone(), self.replication.clone());
            let connection = self.connection.clone();
            runtime.spawn(async move {
                counted.again(&target, connection, &config).await;
                if replication.get().is_none() && counted.any() {
                    // The first replica: from now on grants wait for it.
                    let made = Replication::connect(&target, &config, Some(counted), None);
                    if let Ok(Some(made)) = made.await {
                        let _ = replication.set(made);
                    }
                }
            });
        }
        self.replication.get()
    }

    /// `token` says what kind of hold it asks for (see `scripts/holders.lua`), and
    /// `kind` is that kind.
    pub(crate) async fn acquire(
        &self,
        name: &LockName,
        token: &str,
        kind: Kind,
        lease: Duration,
        fencing: bool,
        queue: Queue,
    ) -> Result<Attempt, LockError> {
        if kind == Kind::Exclusive && !fencing && !queue.joins() {
            // A native `SET NX` does the job without a script. It also respects a lock
            // passed to a waiter; it takes a lock freed by expiry before the queue does.
            // `GET` makes it fail with `WRONGTYPE` on a key that is no string: holders
            // that share the key, or a lock left by an older version. The script tells
            // those apart. It also makes the `SET` safe to send again on a connection
            // found dropped: a first one that ran answers with this token.
            let mut set = on_lock("SET", name.hash());
            set.arg(token)
                .arg("NX")
                .arg("PX")
                .arg(lease_ms(lease))
                .arg("GET");
            let mut connection = self.connection.clone();
            let answer = match connection.query(&set).await {
                // Boxed, as the rare way: the first request's future holds no second.
                Err(error) if error.is_connection_dropped() => {
                    let mut connection = self.connection.clone();
                    Box::pin(connection.query(&set)).await
                }
                answer => answer,
            };
            match answer {
                Ok(None) => return self.replicated(name, token, None).await,
                // Taken by a first `SET` whose answer was lost with its connection.
                Ok(Some(redis::Value::BulkString(holder))) if holder == token.as_bytes() => {
                    return self.replicated(name, token, None).await;
                }
                Ok(Some(_holder)) => {
                    return Ok(Attempt::Busy {
                        retry_in: None,
                        fence: None,
                    });
                }
                Err(error) if error.code() == Some("WRONGTYPE") => {}
                Err(source) => return Err(LockError::backend(name.key(), source)),
            }
        }
        // Boxed, so that the script's state does not weigh on the `SET NX` future.
        Box::pin(self.acquire_by_script(name, token, lease, fencing, queue)).await
    }

    /// The acquire script: for the kinds, the queue and fencing. Sent again once on a
    /// connection found dropped, like the `SET NX`: a first run that granted the lock
    /// leaves it held by this token, which a second run finds and claims again, and a
    /// place taken in the queue is kept (`ZADD NX`). A fencing token is then issued
    /// twice, and the second, greater one is this acquisition's.
    async fn acquire_by_script(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
        fencing: bool,
        queue: Queue,
    ) -> Result<Attempt, LockError> {
        let (mode, stay) = match queue {
            Queue::Respect => ("respect", Duration::ZERO),
            Queue::Join(stay) => ("join", stay),
            Queue::Writers(stay) => ("writers", stay.unwrap_or_default()),
        };
        let (fence, queue) = (name.fence(), name.queue());
        let mut invocation = ScriptCall::new(&ACQUIRE, &[name.hash(), &fence, &queue]);
        invocation
            .arg(token)
            .arg(lease_ms(lease))
            .arg(if fencing { "1" } else { "0" })
            .arg(mode)
            .arg(lease_ms(stay))
            .arg(lease_ms(CLAIM_WINDOW))
            .arg(name.grants())
            .arg(self.target.publish_command());
        let invocation = &invocation;
        let reply: Vec<i64> = self
            .idempotent(name, |mut connection| async move {
                invocation.invoke(&mut connection).await
            })
            .await?;
        Ok(match reply[..] {
            [1, counter, ..] => {
                let fence = fencing.then_some(counter as u64);
                return self.replicated(name, token, fence).await;
            }
            [2, held, ..] => Attempt::Clash {
                held_as: match held {
                    0 => Kind::Exclusive,
                    -1 => Kind::Shared,
                    permits => Kind::Permit(permits.try_into().unwrap_or(u32::MAX)),
                },
            },
            [_, pttl, counter, ..] => Attempt::Busy {
                retry_in: u64::try_from(pttl).ok().map(Duration::from_millis),
                fence: fencing.then_some(counter as u64),
            },
            _ => {
                let detail = format!("{reply:?}");
                let error = RedisError::from((
                    ErrorKind::Parse,
                    "unexpected reply from the acquire script",
                    detail,
                ));
                return Err(LockError::backend(name.key(), error));
            }
        })
    }

    /// The grant to `token`, once the replicas required have it; else it is given
    /// back, and the attempt failed.
    async fn replicated(
        &self,
        name: &LockName,
        token: &str,
        fence: Option<u64>,
    ) -> Result<Attempt, LockError> {
        let Some(replication) = self.replication() else {
            return Ok(Attempt::Granted { fence });
        };
        let confirmed = replication.confirm(name, token).await;
        match confirmed.map_err(|source| LockError::backend(name.key(), source))? {
            Confirmed::Yes => Ok(Attempt::Granted { fence }),
            // The grant's lease ended already, or, on Sentinel, it was made on
            // another server than the one asked to confirm it: the two connections
            // went different ways through a failover. Whatever it may still hold
            // there goes, so that it keeps nobody out for a lease.
            Confirmed::NotHeld => {
                let _ = Box::pin(self.release(name, token, Waiters::Queue)).await;
                self.connection.ask_sentinels_again();
                Ok(Attempt::GivenBack { retry_in: None })
            }
            Confirmed::Short(shortfall) => {
                Box::pin(self.release(name, token, Waiters::Queue)).await?;
                self.connection.ask_sentinels_again();
                Ok(Attempt::Unreplicated(shortfall))
            }
        }
    }

    /// Frees the lock if `token` holds it, telling `waiters`; a token that waits in
    /// the queue leaves it. A lock held alone with nobody queued goes in one
    /// compare-and-delete; any other takes a second request, the script that tells.
    pub(crate) async fn release(
        &self,
        name: &LockName,
        token: &str,
        waiters: Waiters,
    ) -> Result<Released, LockError> {
        if waiters != Waiters::Broadcast
            && Kind::of_token(token) == Kind::Exclusive
            && self.release_alone(name, token).await?
        {
            return Ok(Released::Freed);
        }
        // Boxed, as the rarer way: its state would weigh on every release's future.
        Box::pin(self.leave(name, token, waiters)).await
    }

    /// Through Sentinel, where the next request goes now: the server whose answer to
    /// a release [`release_where_named`](Self::release_where_named) checks.
    /// Elsewhere `None`, as there is nothing to check.
    pub(crate) fn releases_at(&self) -> Option<Option<ConnectionAddr>> {
        let follows = matches!(*self.target, Target::Sentinel(_)) && self.replication().is_some();
        follows.then(|| self.connection.reached())
    }

    /// Through Sentinel, a release counts once they vouch for the server that
    /// answered it, `reached`: a primary they failed over from answers as one until
    /// they demote it, seconds later, and the lock it frees is still held on the new
    /// primary, for the rest of its lease. So once they agree on another primary, the
    /// release is sent again, and goes there. They are asked until they vouch for
    /// the server that answered, for `within` at most: the lease, past which no copy
    /// of the lock is left.
    pub(crate) async fn release_where_named(
        &self,
        name: &LockName,
        token: &str,
        mut reached: Option<ConnectionAddr>,
        within: Duration,
    ) {
        let Some(replication) = self.replication() else {
            return;
        };
        let until = Instant::now() + within;
        loop {
            let verdict = replication.verdict_on(reached.clone()).await;
            if verdict == Verdict::Vouched || Instant::now() >= until {
                return;
            }
            tokio::time::sleep(RECONNECT_EVERY).await;
            if verdict == Verdict::Replaced {
                self.connection.ask_sentinels_again();
                let resent = self.release(name, token, Waiters::Queue).await;
                reached = resent.ok().and_then(|_| self.connection.reached());
            }
        }
    }

    /// Takes `token` out of the queue, or frees the lock if `token` holds it, telling
    /// `waiters`: `release` in one request, for a token that more likely waits than
    /// holds.
    pub(crate) async fn leave(
        &self,
        name: &LockName,
        token: &str,
        waiters: Waiters,
    ) -> Result<Released, LockError> {
        let queue = name.queue();
        let mut invocation = ScriptCall::new(&RELEASE, &[name.hash(), &queue]);
        invocation.arg(token);
        self.telling(&mut invocation, name, waiters);
        let invocation = &invocation;
        let freed: u64 = self
            .idempotent(name, |mut connection| async move {
                invocation.invoke(&mut connection).await
            })
            .await?;
        Ok(match freed {
            0 => Released::NotHeld,
            _ => Released::Freed,
        })
    }

    /// Deletes the lock if its value is `token` alone; whether it did.
    async fn release_alone(&self, name: &LockName, token: &str) -> Result<bool, LockError> {
        let known = CompareAndDelete::from(self.compare_and_delete.load(Ordering::Relaxed));
        let deletion = &known.request(name.hash(), token);
        // One call for either request, so that the release's future holds one.
        let deleted = self
            .idempotent(name, |mut connection| async move {
                match deletion {
                    Deletion::Native(command) => connection.query::<i64>(command).await,
                    Deletion::Script(invocation) => invocation.invoke(&mut connection).await,
                }
            })
            .await;
        match deleted {
            Ok(deleted) => Ok(deleted == 1),
            // Holders that share the key: the script tells.
            Err(LockError::Backend { source, .. }) if is_no_string(&source) => Ok(false),
            Err(LockError::Backend { source, .. }) if is_unknown_command(&source) => {
                let script = CompareAndDelete::Script as u8;
                self.compare_and_delete.store(script, Ordering::Relaxed);
                Ok(false)
            }
            Err(error) => Err(error),
        }
    }

    /// Whether `token` holds the lock with no other client queued for it: its value
    /// is the token alone, as a waiter that joins the queue marks it.
    pub(crate) async fn holds_alone(
        &self,
        name: &LockName,
        token: &str,
    ) -> Result<bool, LockError> {
        let mut connection = self.connection.clone();
        let mut get = redis::cmd("GET");
        get.arg(name.hash());
        let value: Option<String> = self.run(name, connection.query(&get)).await?;
        Ok(value.as_deref() == Some(token))
    }

    /// How long the lock has left, whoever holds it; `None` when it is free.
    pub(crate) async fn lease_left(&self, name: &LockName) -> Result<Option<Duration>, LockError> {
        let mut connection = self.connection.clone();
        let mut pttl = redis::cmd("PTTL");
        pttl.arg(name.hash());
        let pttl: i64 = self.run(name, connection.query(&pttl)).await?;
        Ok(match pttl {
            -2 => None,
            -1 => Some(Duration::MAX),
            left => Some(Duration::from_millis(left.unsigned_abs())),
        })
    }

    /// Frees the lock whoever holds it, telling `waiters`; whether it was held. Sent
    /// once: if Redis ran it and the answer was lost, a second one would free the
    /// lock it passed to a waiter.
    pub(crate) async fn force_unlock(
        &self,
        name: &LockName,
        waiters: Waiters,
    ) -> Result<bool, LockError> {
        let queue = name.queue();
        let mut invocation = ScriptCall::new(&FORCE_UNLOCK, &[name.hash(), &queue]);
        self.telling(&mut invocation, name, waiters);
        let mut connection = self.connection.clone();
        let freed: u64 = self.run(name, invocation.invoke(&mut connection)).await?;
        Ok(freed == 1)
    }

    /// The arguments by which a script that frees a lock tells `waiters` of it.
    fn telling(&self, invocation: &mut ScriptCall, name: &LockName, waiters: Waiters) {
        let mode = match waiters {
            Waiters::Queue => "queue",
            Waiters::Broadcast => "broadcast",
            Waiters::None => "none",
        };
        invocation
            .arg(mode)
            .arg(lease_ms(CLAIM_WINDOW))
            .arg(name.grants())
            .arg(name.channel())
            .arg(self.target.publish_command());
    }

    pub(crate) async fn renew(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
    ) -> Result<bool, LockError> {
        let renewed = match self.renew_natively(name, token, lease).await? {
            Some(renewed) => renewed,
            None => {
                let mut invocation = ScriptCall::new(&RENEW, &[name.hash()]);
                invocation.arg(token).arg(lease_ms(lease));
                let invocation = &invocation;
                let renewed: i64 = self
                    .idempotent(name, |mut connection| async move {
                        invocation.invoke(&mut connection).await
                    })
                    .await?;
                renewed == 1
            }
        };
        let Some(replication) = self.replication().filter(|_| renewed) else {
            return Ok(renewed);
        };
        let confirmed = replication.confirm(name, token).await;
        let confirmed = confirmed.map_err(|source| LockError::backend(name.key(), source))?;
        if confirmed != Confirmed::Yes {
            self.connection.ask_sentinels_again();
        }
        confirmed.renewed(name.key())
    }

    /// Renews a lock held alone with one `SET … IFEQ` (Valkey 8.1, Redis 8.4), no
    /// script. `None` when the lock's value is not the token alone (its token is
    /// marked, holders share the key, another holds it: the script tells), and on a
    /// server without it.
    async fn renew_natively(
        &self,
        name: &LockName,
        token: &str,
        lease: Duration,
    ) -> Result<Option<bool>, LockError> {
        if !self.has_set_ifeq.load(Ordering::Relaxed) || Kind::of_token(token) != Kind::Exclusive {
            return Ok(None);
        }
        let mut set = on_lock("SET", name.hash());
        set.arg(token)
            .arg("IFEQ")
            .arg(token)
            .arg("PX")
            .arg(lease_ms(lease));
        let set = &set;
        let answer = self
            .idempotent(name, |mut connection| async move {
                connection.query::<Option<redis::Value>>(set).await
            })
            .await;
        match answer {
            Ok(answer) => Ok(answer.map(|_| true)),
            Err(LockError::Backend { source, .. }) if is_syntax_error(&source) => {
                self.has_set_ifeq.store(false, Ordering::Relaxed);
                Ok(None)
            }
            Err(LockError::Backend { source, .. }) if source.code() == Some("WRONGTYPE") => {
                Ok(None)
            }
            Err(error) => Err(error),
        }
    }

    /// Renews each of `renewals` whose token still holds its lock, in one call per
    /// hash slot and lease of at most `RENEWALS_PER_CALL` locks, then confirms them
    /// with the replicas together; what each found, in order.
    pub(crate) async fn renew_many(
        &self,
        renewals: &[Renewing<'_>],
    ) -> Vec<Result<bool, LockError>> {
        let mut calls_by_slot_and_lease: BTreeMap<(u16, u64), Vec<usize>> = BTreeMap::new();
        for (index, renewing) in renewals.iter().enumerate() {
            let slot = match *self.target {
                Target::Cluster(_) => slot(renewing.name.hash()),
                Target::Server { .. } | Target::Sentinel(_) => 0,
            };
            calls_by_slot_and_lease
                .entry((slot, lease_ms(renewing.lease)))
                .or_default()
                .push(index);
        }
        // Sent together: on a Cluster the locks of a few thousand slots make as many
        // calls.
        let mut calls = JoinSet::new();
        for (&(_, lease), chunk) in calls_by_slot_and_lease.iter().flat_map(|(group, locks)| {
            locks
                .chunks(RENEWALS_PER_CALL)
                .map(move |chunk| (group, chunk))
        }) {
            let locks: Vec<&str> = chunk.iter().map(|&i| renewals[i].name.hash()).collect();
            let mut call = ScriptCall::new(&RENEW_MANY, &locks);
            for &i in chunk {
                call.arg(&**renewals[i].token);
            }
            call.arg(lease);
            let (chunk, connection) = (chunk.to_vec(), self.connection.clone());
            calls.spawn(async move {
                let call = &call;
                let lost: redis::RedisResult<Vec<usize>> =
                    retried_once(&connection, |mut connection| async move {
                        call.invoke(&mut connection).await
                    })
                    .await;
                let renewed = lost.and_then(|lost| renewed_but(&lost, chunk.len()));
                (chunk, renewed)
            });
        }
        let mut answers: Vec<Option<Result<bool, LockError>>> = Vec::new();
        answers.resize_with(renewals.len(), || None);
        while let Some(Ok((chunk, renewed))) = calls.join_next().await {
            for (place, i) in chunk.into_iter().enumerate() {
                answers[i] = Some(match &renewed {
                    Ok(renewed) => Ok(renewed[place]),
                    Err(error) => Err(LockError::backend(renewals[i].name.key(), error.clone())),
                });
            }
        }
        let mut answers = renewal_answers(answers, renewals.iter().map(|renewing| renewing.name));
        let Some(replication) = self.replication() else {
            return answers;
        };
        let renewed: Vec<usize> = (0..renewals.len())
            .filter(|&i| matches!(answers[i], Ok(true)))
            .collect();
        let confirming: Vec<(&LockName, &str)> = renewed
            .iter()
            .map(|&i| (renewals[i].name, &**renewals[i].token))
            .collect();
        let confirmed = replication.confirm_all(&confirming).await;
        if confirmed
            .iter()
            .any(|confirmed| matches!(confirmed, Ok(found) if *found != Confirmed::Yes))
        {
            self.connection.ask_sentinels_again();
        }
        for (i, confirmed) in renewed.into_iter().zip(confirmed) {
            let key = renewals[i].name.key();
            answers[i] = confirmed
                .map_err(|source| LockError::backend(key, source))
                .and_then(|confirmed| confirmed.renewed(key));
        }
        answers
    }

    /// Raises the lock's fencing counter to at least `floor`; returns the counter.
    pub(crate) async fn raise_fence(&self, name: &LockName, floor: u64) -> Result<u64, LockError> {
        let fence = name.fence();
        let mut invocation = ScriptCall::new(&RAISE_FENCE, &[&fence]);
        invocation.arg(floor);
        let invocation = &invocation;
        self.idempotent(name, |mut connection| async move {
            invocation.invoke(&mut connection).await
        })
        .await
    }

    pub(crate) async fn listen(&self, name: &LockName, channel: &str) -> Result<(), LockError> {
        let subscriber = self
            .subscriber
            .get_or_try_init(|| {
                let connecting = self.target.subscriber(&self.config, self.signals.clone());
                bounded(self.config.connecting_bound(), connecting)
            })
            .await
            .map_err(|source| LockError::backend(name.key(), source))?;
        let mut subscriber = subscriber.clone();
        self.run(name, subscriber.subscribe(channel)).await
    }

    pub(crate) async fn unlisten(&self, name: &LockName, channel: &str) {
        if let Some(subscriber) = self.subscriber.get() {
            let mut subscriber = subscriber.clone();
            let _ = self.run(name, subscriber.unsubscribe(channel)).await;
        }
    }

    /// For requests that may safely run twice: a connection found dropped (Redis
    /// restarted, say) is retried once on the reconnected one.
    async fn idempotent<T, F>(
        &self,
        name: &LockName,
        call: impl Fn(Connection) -> F,
    ) -> Result<T, LockError>
    where
        F: Future<Output = redis::RedisResult<T>>,
    {
        retried_once(&self.connection, call)
            .await
            .map_err(|source| LockError::backend(name.key(), source))
    }

    async fn run<T>(
        &self,
        name: &LockName,
        call: impl Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, LockError> {
        bounded(self.config.command_timeout, call)
            .await
            .map_err(|source| LockError::backend(name.key(), source))
    }
}

/// Whether each of a renewal call's `locks` locks was renewed: all but those at the
/// `lost` positions (from 1) its script answered. Only positions among the call's
/// locks, or none is trusted.
fn renewed_but(lost: &[usize], locks: usize) -> redis::RedisResult<Vec<bool>> {
    let mut renewed = vec![true; locks];
    for &at in lost {
        match at.checked_sub(1).and_then(|place| renewed.get_mut(place)) {
            Some(this) => *this = false,
            None => {
                return Err(RedisError::from((
                    ErrorKind::Parse,
                    "unexpected reply from the renewal script",
                    format!("{lost:?} among the positions of {locks} locks"),
                )));
            }
        }
    }
    Ok(renewed)
}

/// `call` on `connection`, sent again once if the connection was found dropped
/// (Redis restarted, say): for requests that may safely run twice.
async fn retried_once<T, F>(
    connection: &Connection,
    call: impl Fn(Connection) -> F,
) -> redis::RedisResult<T>
where
    F: Future<Output = redis::RedisResult<T>>,
{
    // One await in a loop, not two in a row: the future then holds one call.
    let mut retried = false;
    loop {
        match call(connection.clone()).await {
            Err(error) if error.is_connection_dropped() && !retried => retried = true,
            answer => return answer,
        }
    }
}

/// Whether the server takes `SET … IFEQ`: asked of a key of the locks' namespace that
/// no lock has (a token never is `probe`), and written by nobody, since the value
/// compared is the value set and `KEEPTTL` keeps its expiry. A server without it
/// answers with a syntax error, which no `ACL LOG` records.
async fn has_set_ifeq(connection: &Connection, limit: Duration) -> bool {
    let mut probe = redis::cmd("SET");
    probe
        .arg("lock:{probe}")
        .arg("probe")
        .arg("IFEQ")
        .arg("probe")
        .arg("KEEPTTL");
    let mut connection = connection.clone();
    let answer = bounded(limit, connection.query::<Option<redis::Value>>(&probe)).await;
    answer.is_ok()
}

/// `command` on `lock`, with room for a token and a few words more: `redis::cmd`
/// starts its buffers empty, and growing them cost the everyday acquire more than
/// the rest of building it.
fn on_lock(command: &str, lock: &str) -> Cmd {
    let mut built = Cmd::with_capacity(8, lock.len() + 128);
    built.arg(command).arg(lock);
    built
}

/// A compare-and-delete of one lock, as the server takes it.
enum Deletion {
    Native(Cmd),
    Script(ScriptCall),
}

impl CompareAndDelete {
    /// The request that deletes `lock` if its value is `token`: the server's own
    /// command, or else the script.
    fn request(self, lock: &str, token: &str) -> Deletion {
        let mut command = match self {
            CompareAndDelete::Script => {
                let mut invocation = ScriptCall::new(&RELEASE_ALONE, &[lock]);
                invocation.arg(token);
                return Deletion::Script(invocation);
            }
            CompareAndDelete::Delifeq => on_lock("DELIFEQ", lock),
            CompareAndDelete::Delex => on_lock("DELEX", lock),
        };
        if self == CompareAndDelete::Delex {
            command.arg("IFEQ");
        }
        command.arg(token);
        Deletion::Native(command)
    }
}

impl From<u8> for CompareAndDelete {
    fn from(stored: u8) -> Self {
        match stored {
            1 => CompareAndDelete::Delifeq,
            2 => CompareAndDelete::Delex,
            _ => CompareAndDelete::Script,
        }
    }
}

/// The server's own compare-and-delete: asked to delete a key of the locks'
/// namespace that no lock has, so nothing is deleted. A server without the command
/// answers that it does not know it, which no `ACL LOG` records; a user not allowed
/// it (an ACL line without `+delifeq`) leaves one entry there, and the script serves.
/// Both commands are asked at once, since each may wait out the command timeout.
async fn compare_and_delete(connection: &Connection, limit: Duration) -> CompareAndDelete {
    let takes = |native: CompareAndDelete| {
        let mut connection = connection.clone();
        async move {
            let Deletion::Native(probe) = native.request("lock:{probe}", "probe") else {
                return false;
            };
            bounded(limit, connection.query::<i64>(&probe))
                .await
                .is_ok()
        }
    };
    match tokio::join!(
        takes(CompareAndDelete::Delifeq),
        takes(CompareAndDelete::Delex)
    ) {
        (true, _) => CompareAndDelete::Delifeq,
        (false, true) => CompareAndDelete::Delex,
        (false, false) => CompareAndDelete::Script,
    }
}

/// What a server without a command answers.
fn is_unknown_command(error: &RedisError) -> bool {
    is_err_saying(error, "unknown command")
}

/// What a compare-and-delete answers on a key that is no string: `WRONGTYPE`, but
/// Redis 8.6's `DELEX … IFEQ` answers `ERR Key should be of string type …`.
fn is_no_string(error: &RedisError) -> bool {
    error.code() == Some("WRONGTYPE") || is_err_saying(error, "should be of string type")
}

/// What a server without an optional argument answers.
fn is_syntax_error(error: &RedisError) -> bool {
    is_err_saying(error, "syntax")
}

/// Whether `error` is a plain `ERR` whose message holds `words`: what a server
/// says where it has no error code of its own for it.
fn is_err_saying(error: &RedisError, words: &str) -> bool {
    error.code() == Some("ERR") && error.detail().is_some_and(|detail| detail.contains(words))
}

/// Locks are keys with a lease, which every eviction policy but `noeviction` may
/// evict once `maxmemory` is reached. Managed and ACL-limited Redis often refuse
/// `CONFIG GET`: then nothing is said.
async fn warn_if_locks_may_be_evicted(connection: &mut Connection, limit: Duration) {
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("maxmemory*");
    let Ok(settings) = bounded(limit, connection.query::<HashMap<String, String>>(&config)).await
    else {
        return;
    };
    let bounded_memory = settings.get("maxmemory").is_some_and(|bytes| bytes != "0");
    if let Some(policy) = settings.get("maxmemory-policy")
        && bounded_memory
        && policy != "noeviction"
    {
        telemetry::eviction_possible(policy);
    }
}

#[cfg(test)]
mod tests {
    use super::renewed_but;

    #[test]
    fn a_renewal_call_loses_only_the_locks_at_the_positions_it_names() {
        assert_eq!(renewed_but(&[], 3).unwrap(), [true, true, true]);
        assert_eq!(renewed_but(&[1, 3], 3).unwrap(), [false, true, false]);
    }

    #[test]
    fn a_position_outside_the_call_makes_its_whole_answer_untrusted() {
        for lost in [&[0][..], &[2, 4], &[usize::MAX]] {
            let error = renewed_but(lost, 3).unwrap_err();
            assert!(error.to_string().contains("renewal script"), "{error}");
        }
    }
}
