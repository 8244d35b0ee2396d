//! The ways to reach the Redis that holds the locks: one server, a Cluster, or the
//! primary that Sentinel names. All three run the same scripts through one
//! `ConnectionLike`, and each has a pub/sub connection of its own kind. A request
//! sent through a `Connection` is given up on after the command timeout, however it
//! waits: on a reconnect, or on a server that went silent.

use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, ResponsePolicy, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{
    AsyncConnectionConfig, Client, Cmd, ConnectionAddr, ConnectionInfo, ErrorKind, FromRedisValue,
    IntoConnectionInfo, Pipeline, ProtocolVersion, PushInfo, PushKind, RedisError, RedisFuture,
    RedisResult, Script, ServerErrorKind, ToRedisArgs, Value,
};
use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, Weak};
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};

use pin_project_lite::pin_project;
use tokio::runtime::Handle;
use tokio::sync::{Notify, watch};
use tokio::time::{MissedTickBehavior, Timeout};

use super::pipe::Pipe;
use super::signals::Signals;
use crate::ClientConfig;
use crate::key::slot;
use crate::telemetry;

/// Where the locks live, and how to connect there again.
pub(crate) enum Target {
    /// One server. `manager` is the application's own connection, used as it is;
    /// without one, the client's connection info makes ours. Either way the
    /// subscriber connection is made from `client`, since a `ConnectionManager` does
    /// not reveal what it connects to.
    Server {
        client: Box<Client>,
        manager: Option<ConnectionManager>,
    },
    Cluster(Arc<ClusterNodes>),
    Sentinel(Arc<NamedPrimary>),
}

#[derive(Clone)]
pub(crate) enum Connection {
    /// To one server, or to the primary Sentinel names: ours, which connects again
    /// when it drops, and bounds its requests itself.
    Own(Reconnecting),
    /// The application's own, or a subscriber's, which subscribes again when it
    /// reconnects. Each request is `bounded` by `limit`.
    Manager {
        manager: ConnectionManager,
        limit: Duration,
    },
    Cluster(ClusterLink),
}

/// A Cluster's nodes, and what the connections a client makes to them share: the
/// slots' primaries as the nodes last listed them, and the connections, to be made
/// anew when that changes.
pub(crate) struct ClusterNodes {
    urls: Vec<String>,
    primaries: Mutex<Option<Vec<(u16, u16, String)>>>,
    /// Set while the nodes are asked whether the primaries changed, and the
    /// connections follow.
    asking: AtomicBool,
    links: Mutex<Vec<Weak<ClusterLinkState>>>,
}

impl ClusterNodes {
    fn primaries(&self) -> MutexGuard<'_, Option<Vec<(u16, u16, String)>>> {
        self.primaries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn links(&self) -> MutexGuard<'_, Vec<Weak<ClusterLinkState>>> {
        self.links.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// When the nodes, asked over `link`, list other primaries than they did before,
    /// makes every connection that lives anew: requests' first, so that the waiters
    /// the subscriber's then wakes ask again over connections that followed. A
    /// change is recorded once all of them followed it; until then the next request
    /// to run out of time finds it again. redis-rs reads its slot map again by itself
    /// only on a `MOVED` or a dropped connection, and a primary whose host went
    /// without a word keeps its connections open and silent: once the Cluster failed
    /// over from it, its slots stayed in the map, and every request for them went
    /// unanswered until it answered again. Reading the map again in place would hold
    /// every request meanwhile, while redis-rs may wait on the silent node first; a
    /// new connection is made beside each.
    async fn follow_failovers(&self, link: &ClusterLink) {
        let Ok(now) = listed_primaries(&mut link.current(), link.limit()).await else {
            return;
        };
        let unchanged = self
            .primaries()
            .as_ref()
            .is_none_or(|before| *before == now);
        if unchanged || self.made_anew(self.reached_as_given(&now)).await {
            *self.primaries() = Some(now);
        }
    }

    /// Makes every connection that lives anew from `primaries`, requests' first;
    /// true once all are.
    async fn made_anew(&self, primaries: Vec<ConnectionInfo>) -> bool {
        let links: Vec<_> = self.links().iter().filter_map(Weak::upgrade).collect();
        let (subscribers, requests): (Vec<_>, Vec<_>) =
            (links.into_iter().map(ClusterLink)).partition(|link| link.0.signals.is_some());
        let primaries = Arc::new(primaries);
        let mut all = true;
        for links in [requests, subscribers] {
            let mut making = tokio::task::JoinSet::new();
            for link in links {
                let primaries = primaries.clone();
                making.spawn(async move { link.connect_anew(&primaries).await });
            }
            while let Some(made) = making.join_next().await {
                all &= matches!(made, Ok(Ok(())));
            }
        }
        all
    }

    /// The nodes' URLs, as the client was given them.
    fn given(&self) -> impl Iterator<Item = &str> {
        self.urls.iter().map(String::as_str)
    }

    /// The primaries of `ranges`, each reached as the first URL says: with its
    /// credentials and TLS settings.
    fn reached_as_given(&self, ranges: &[(u16, u16, String)]) -> Vec<ConnectionInfo> {
        let Some(Ok(first)) = self
            .urls
            .first()
            .map(|url| url.as_str().into_connection_info())
        else {
            return Vec::new();
        };
        let mut addresses: Vec<&str> = ranges.iter().map(|(_, _, primary)| &primary[..]).collect();
        addresses.sort_unstable();
        addresses.dedup();
        let reached = addresses.into_iter().filter_map(|address| {
            let (host, port) = address.rsplit_once(':')?;
            Some(elsewhere(&first, host.to_owned(), port.parse().ok()?))
        });
        reached.collect()
    }

    /// A client that connects first to `initial`; a subscriber's, given `signals`,
    /// speaks RESP3 and passes what is pushed to them.
    fn client<T: IntoConnectionInfo>(
        initial: impl IntoIterator<Item = T>,
        config: &ClientConfig,
        signals: Option<&Arc<Signals>>,
    ) -> RedisResult<ClusterClient> {
        let builder = ClusterClient::builder(initial)
            .connection_timeout(config.connect_timeout)
            .response_timeout(config.command_timeout);
        #[cfg(feature = "tls")]
        let builder = match &config.tls_certificates {
            Some(certificates) => builder.certs(certificates.clone()),
            None => builder,
        };
        let Some(signals) = signals.cloned() else {
            return builder.build();
        };
        let builder = builder.use_protocol(ProtocolVersion::RESP3);
        builder.push_sender(pushed_to(signals)).build()
    }
}

/// A Cluster connection. Each request is `bounded` by `limit`: the response timeout
/// redis-rs gives it bounds one try, not the retries.
#[derive(Clone)]
pub(crate) struct ClusterLink(Arc<ClusterLinkState>);

struct ClusterLinkState {
    nodes: Arc<ClusterNodes>,
    /// Replaced by a connection made anew when the slots' primaries change under it.
    current: RwLock<ClusterConnection>,
    config: ClientConfig,
    /// A subscriber's, for its pushes and the channels to subscribe to again on a
    /// new connection.
    signals: Option<Arc<Signals>>,
}

impl ClusterLink {
    /// A connection to `nodes`, from their URLs, made anew when they list other
    /// primaries for the slots; a subscriber's, given `signals`, then subscribes
    /// again to every channel they watch.
    async fn made(
        nodes: &Arc<ClusterNodes>,
        config: &ClientConfig,
        signals: Option<Arc<Signals>>,
    ) -> RedisResult<ClusterLink> {
        let client = ClusterNodes::client(nodes.given(), config, signals.as_ref())?;
        let mut current = client.get_async_connection().await?;
        let limit = config.command_timeout;
        let unlisted = nodes.primaries().is_none();
        if unlisted && let Ok(primaries) = listed_primaries(&mut current, limit).await {
            *nodes.primaries() = Some(primaries);
        }
        let link = ClusterLink(Arc::new(ClusterLinkState {
            nodes: nodes.clone(),
            current: RwLock::new(current),
            config: config.clone(),
            signals,
        }));
        let mut links = nodes.links();
        links.retain(|link| link.strong_count() > 0);
        links.push(Arc::downgrade(&link.0));
        Ok(link)
    }

    fn limit(&self) -> Duration {
        self.0.config.command_timeout
    }

    fn current(&self) -> ClusterConnection {
        self.0
            .current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What `send` sends, given up on after the limit. A request given up on has the
    /// nodes asked, in the background, whether the slots' primaries changed
    /// ([`ClusterNodes::follow_failovers`]): the one it went to may have gone silent,
    /// and the Cluster failed over from it.
    async fn request<T>(
        &self,
        send: impl AsyncFnOnce(&mut ClusterConnection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let answer = bounded(self.limit(), send(&mut self.current())).await;
        if answer.as_ref().is_err_and(RedisError::is_timeout)
            && !self.0.nodes.asking.swap(true, Ordering::AcqRel)
            && let Ok(runtime) = Handle::try_current()
        {
            let link = self.clone();
            runtime.spawn(async move {
                let nodes = &link.0.nodes;
                nodes.follow_failovers(&link).await;
                nodes.asking.store(false, Ordering::Release);
            });
        }
        answer
    }

    /// Makes the connection anew, from `primaries`, and has requests go over it
    /// from then on; a subscriber's then subscribes again to every channel watched,
    /// and wakes every waiter, since a release may have gone unheard. Made from the
    /// client's URLs instead, it would first wait out the connect timeout on the
    /// silent node they list; they serve where the primaries cannot be reached as
    /// listed.
    async fn connect_anew(&self, primaries: &[ConnectionInfo]) -> RedisResult<()> {
        let ClusterLinkState {
            nodes,
            config,
            signals,
            ..
        } = &*self.0;
        let connect = async |client: RedisResult<ClusterClient>| {
            bounded(config.connecting_bound(), client?.get_async_connection()).await
        };
        let listed = ClusterNodes::client(primaries.iter().cloned(), config, signals.as_ref());
        let mut made = match connect(listed).await {
            Ok(made) => made,
            Err(_) => {
                let given = ClusterNodes::client(nodes.given(), config, signals.as_ref());
                connect(given).await?
            }
        };
        *self.0.current.write().unwrap_or_else(|p| p.into_inner()) = made.clone();
        let Some(signals) = signals else {
            return Ok(());
        };
        let subscribed = async {
            for channel in signals.channels() {
                bounded(config.command_timeout, made.ssubscribe(&channel)).await?;
            }
            Ok(())
        };
        let subscribed = subscribed.await;
        signals.notify_all();
        subscribed
    }
}

/// Each range of slots with its primary, in slot order, as the first node to answer
/// lists them.
async fn listed_primaries(
    cluster: &mut ClusterConnection,
    limit: Duration,
) -> RedisResult<Vec<(u16, u16, String)>> {
    let ranges = listed_slots(cluster, limit).await?;
    let ranges = ranges
        .into_iter()
        .map(|range| (range.first, range.last, range.primary));
    // Each node lists the ranges in an order of its own.
    let mut primaries: Vec<_> = ranges.collect();
    primaries.sort();
    Ok(primaries)
}

/// The slot ranges as the first node to answer `CLUSTER SLOTS` lists them.
async fn listed_slots(
    cluster: &mut ClusterConnection,
    limit: Duration,
) -> RedisResult<Vec<SlotRange>> {
    let mut listing = redis::cmd("CLUSTER");
    listing.arg("SLOTS");
    slot_ranges(first_answer(cluster, limit, listing).await?)
}

fn not_a_cluster() -> RedisError {
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "a Cluster question asked of a connection that is not to a Cluster",
    ))
}

/// The first answer to `question`, asked of every node of a Cluster: one chosen at
/// random may be silent.
async fn first_answer(
    cluster: &mut ClusterConnection,
    limit: Duration,
    question: redis::Cmd,
) -> RedisResult<Value> {
    let first_to_answer = RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllNodes,
        Some(ResponsePolicy::OneSucceeded),
    ));
    let answer = bounded(limit, cluster.route_command(question, first_to_answer)).await?;
    answer.extract_error()
}

impl Target {
    pub(crate) fn server(url: &str, config: &ClientConfig) -> RedisResult<Target> {
        Ok(Self::client(open(url, config)?))
    }

    pub(crate) fn client(client: Client) -> Target {
        Target::Server {
            client: Box::new(client),
            manager: None,
        }
    }

    pub(crate) fn manager(manager: ConnectionManager, client: Client) -> Target {
        Target::Server {
            client: Box::new(client),
            manager: Some(manager),
        }
    }

    pub(crate) fn cluster(urls: Vec<String>) -> Target {
        Target::Cluster(Arc::new(ClusterNodes {
            urls,
            primaries: Mutex::new(None),
            asking: AtomicBool::new(false),
            links: Mutex::new(Vec::new()),
        }))
    }

    pub(crate) fn sentinel(
        sentinels: Vec<String>,
        primary: &str,
        config: &ClientConfig,
    ) -> RedisResult<Target> {
        let named = NamedPrimary::new(&sentinels, primary, config)?;
        Ok(Target::Sentinel(Arc::new(named)))
    }

    /// Through Sentinel, has every connection made through them follow each switch of
    /// primary they announce.
    pub(crate) fn follow_switches(&self) {
        if let Target::Sentinel(named) = self {
            named.listen_for_switches();
        }
    }

    /// Releases are published per shard on a Cluster, so that they reach only the
    /// node that serves the lock's slot.
    pub(crate) fn publish_command(&self) -> &'static str {
        match self {
            Target::Cluster(_) => "SPUBLISH",
            Target::Server { .. } | Target::Sentinel(_) => "PUBLISH",
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Target::Server { .. } => "redis",
            Target::Cluster(_) => "cluster",
            Target::Sentinel(_) => "sentinel",
        }
    }

    pub(crate) async fn connect(&self, config: &ClientConfig) -> RedisResult<Connection> {
        if let Target::Server {
            manager: Some(manager),
            ..
        } = self
        {
            return Ok(Connection::Manager {
                manager: manager.clone(),
                limit: config.command_timeout,
            });
        }
        self.connect_apart(config).await
    }

    /// A connection of its own, never the application's: for requests that may block
    /// it (`WAIT`).
    pub(crate) async fn connect_apart(&self, config: &ClientConfig) -> RedisResult<Connection> {
        let source = match self {
            Target::Server { client, .. } => Source::Server(client.clone()),
            Target::Sentinel(named) => Source::Sentinel(named.clone()),
            Target::Cluster(nodes) => {
                let link = ClusterLink::made(nodes, config, None).await?;
                return Ok(Connection::Cluster(link));
            }
        };
        let own = Reconnecting::commands(source, config);
        own.current().await?;
        Ok(Connection::Own(own))
    }

    /// How many replicas the primary has now, as the topology lists them: those the
    /// Sentinels know (down ones included), those Cluster lists for each slot's
    /// primary (failing ones included), or those connected to one server.
    pub(crate) async fn replicas(&self, connection: &mut Connection) -> RedisResult<Replicas> {
        match (self, connection) {
            (Target::Cluster(_), connection @ Connection::Cluster(_)) => {
                let mut ranges = match connection.shard_replicas().await {
                    Err(refused) if refused.code() == Some("NOPERM") => {
                        telemetry::failed_replicas_uncounted();
                        let ranges = connection.slot_ranges().await?;
                        let ranges = ranges
                            .into_iter()
                            .map(|range| (range.first, range.last, range.replicas));
                        ranges.collect()
                    }
                    ranges => ranges?,
                };
                // In slot order: nodes list shards in an order of their own, and a
                // count is told again only when it changed.
                ranges.sort_unstable();
                Ok(Replicas::PerSlot(ranges))
            }
            (Target::Sentinel(named), connection) => {
                // Asked at once, and the first answer taken: a silent Sentinel listed
                // first would hold connecting for the whole bound.
                let mut asked = tokio::task::JoinSet::new();
                for sentinel in &named.sentinels {
                    let (mut sentinel, primary) = (sentinel.clone(), named.name.clone());
                    asked.spawn(async move { sentinel_replicas(&mut sentinel, &primary).await });
                }
                while let Some(answer) = asked.join_next().await {
                    if let Ok(Ok(count)) = answer {
                        return Ok(Replicas::Everywhere(count));
                    }
                }
                // No Sentinel would say (an ACL without `sentinel|replicas`, say):
                // the primary's own count is the next best.
                Ok(Replicas::Everywhere(connected_replicas(connection).await?))
            }
            (Target::Server { .. }, connection) => {
                Ok(Replicas::Everywhere(connected_replicas(connection).await?))
            }
            (Target::Cluster(_), _) => Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "a Cluster target with another kind of connection",
            ))),
        }
    }

    /// A connection made on first use, for a Redlock node that may be down now.
    pub(crate) fn connect_lazily(&self, config: &ClientConfig) -> RedisResult<Connection> {
        match self {
            Target::Server {
                manager: Some(manager),
                ..
            } => Ok(Connection::Manager {
                manager: manager.clone(),
                limit: config.command_timeout,
            }),
            Target::Server { client, .. } => Ok(Connection::Own(Reconnecting::commands(
                Source::Server(client.clone()),
                config,
            ))),
            Target::Cluster(_) | Target::Sentinel(_) => Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "only a single server connects lazily",
            ))),
        }
    }

    /// A RESP3 connection whose pushes (release messages) go to `signals`, and that
    /// subscribes again after reconnecting.
    pub(crate) async fn subscriber(
        &self,
        config: &ClientConfig,
        signals: Arc<Signals>,
    ) -> RedisResult<Connection> {
        let pushes = pushed_to(signals.clone());
        match self {
            Target::Server { client, .. } => {
                let client = resp3(client)?;
                let manager_config = manager_config(config)
                    .set_push_sender(pushes)
                    .set_automatic_resubscription();
                Ok(Connection::Manager {
                    manager: ConnectionManager::new_with_config(client, manager_config).await?,
                    limit: config.command_timeout,
                })
            }
            Target::Cluster(nodes) => {
                let link = ClusterLink::made(nodes, config, Some(signals)).await?;
                Ok(Connection::Cluster(link))
            }
            Target::Sentinel(named) => {
                let named = named.speaking(ProtocolVersion::RESP3);
                let switches = named.switches.told();
                let (dropped, drops) = tokio::sync::mpsc::unbounded_channel();
                let pushes = move |push: PushInfo| {
                    if push.kind == PushKind::Disconnection {
                        let _ = dropped.send(());
                    }
                    pushes(push)
                };
                let connection = Reconnecting::new(
                    Source::Sentinel(Arc::new(named)),
                    connection_config(config).set_push_sender(pushes),
                    config,
                    false,
                );
                connection.current().await?;
                let following = Arc::downgrade(&connection.shared);
                tokio::spawn(resubscribe_after_drops(following, drops, switches, signals));
                Ok(Connection::Own(connection))
            }
        }
    }
}

/// A lock script, its source kept: a call that finds the server without it sends
/// the script along.
pub(crate) struct LuaScript {
    code: &'static str,
    hash: String,
}

impl LuaScript {
    pub(crate) fn new(code: &'static str) -> LuaScript {
        let hash = Script::new(code).get_hash().to_owned();
        LuaScript { code, hash }
    }

    /// Its SHA1, by which `EVALSHA` names it.
    pub(crate) fn hash(&self) -> &str {
        &self.hash
    }

    /// `SCRIPT LOAD` of it. Sent alone to a Cluster, redis-rs sends it to every
    /// primary.
    pub(crate) fn load(&self) -> Cmd {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(self.code);
        load
    }
}

/// One call of a script, sent as `EVALSHA` and built in place: redis-rs'
/// `ScriptInvocation` first copies each key and argument into an allocation of its
/// own, which on the everyday release was most of the client's allocations.
pub(crate) struct ScriptCall {
    script: &'static LuaScript,
    command: Cmd,
}

impl ScriptCall {
    /// A call of `script` on `keys`, followed by its arguments.
    pub(crate) fn new<K: ToRedisArgs>(script: &'static LuaScript, keys: &[K]) -> ScriptCall {
        let mut command = Cmd::with_capacity(12, 256);
        command
            .arg("EVALSHA")
            .arg(script.hash())
            .arg(keys.len())
            .arg(keys);
        ScriptCall { script, command }
    }

    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut ScriptCall {
        self.command.arg(arg);
        self
    }

    /// Runs it; where the server does not have the script (a restart or a failover
    /// wiped it), sends it again with the script.
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        connection: &mut Connection,
    ) -> RedisResult<T> {
        match connection.query(&self.command).await {
            Err(error) if error.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // Boxed: the rare way, kept out of every call's future.
                Box::pin(async {
                    let calls = std::slice::from_ref(self);
                    let (answers, _) = Self::pipelined(calls, connection, true, &[]).await?;
                    let answer = answers.into_iter().next().unwrap_or(Value::Nil);
                    Ok(redis::from_redis_value(answer.extract_error()?)?)
                })
                .await
            }
            answer => answer,
        }
    }

    /// Runs `calls`, all of one script, and then `after`, in one pipeline on one
    /// connection to the primary that serves the first call's first key, with the
    /// script where the server lacked it. Returns their answers, each of which may
    /// be a refusal.
    pub(crate) async fn invoke_all_then(
        calls: &[ScriptCall],
        connection: &mut Connection,
        after: &[Cmd],
    ) -> RedisResult<(Vec<Value>, Vec<Value>)> {
        let answered = Self::pipelined(calls, connection, false, after).await?;
        let lacked = answered.0.iter().any(|answer| {
            matches!(answer, Value::ServerError(refusal)
                if refusal.kind() == Some(ServerErrorKind::NoScript))
        });
        match lacked {
            true => Self::pipelined(calls, connection, true, after).await,
            false => Ok(answered),
        }
    }

    /// Sends `calls`, and `after`, in one pipeline to the primary that serves the
    /// first call's first key, led by `SCRIPT LOAD` where `loading`: on the connection
    /// the calls then go by, wherever a failover sends them. Their answers, and the
    /// others'.
    async fn pipelined(
        calls: &[ScriptCall],
        connection: &mut Connection,
        loading: bool,
        after: &[Cmd],
    ) -> RedisResult<(Vec<Value>, Vec<Value>)> {
        let Some(first) = calls.first() else {
            return Ok((Vec::new(), Vec::new()));
        };
        let mut pipeline = Pipeline::with_capacity(1 + calls.len() + after.len());
        if loading {
            pipeline.add_command(first.script.load());
        }
        for call in calls {
            pipeline.add_command(call.command.clone());
        }
        for cmd in after {
            pipeline.add_command(cmd.clone());
        }
        let answers = connection.pipeline_on_primary_of(first.first_key(), pipeline);
        let mut answers = answers.await?;
        if loading && !answers.is_empty() {
            answers.remove(0).extract_error()?;
        }
        let after_answers = answers.split_off(calls.len().min(answers.len()));
        Ok((answers, after_answers))
    }

    /// `EVALSHA sha numkeys key …`: every lock script has a key.
    fn first_key(&self) -> &[u8] {
        match self.command.args_iter().nth(3) {
            Some(redis::Arg::Simple(key)) => key,
            _ => &[],
        }
    }
}

/// Redis calls may wait on a reconnect; this caps the whole call, not just one read.
pub(crate) fn bounded<F: Future>(limit: Duration, call: F) -> Bounded<F> {
    Bounded {
        call: tokio::time::timeout(limit, call),
        limit,
    }
}

pin_project! {
    /// A call given up on after `limit`. A future of its own rather than an `async fn`,
    /// which would hold the call twice over: every request's future holds one.
    pub(crate) struct Bounded<F> {
        #[pin]
        call: Timeout<F>,
        limit: Duration,
    }
}

impl<T, F: Future<Output = RedisResult<T>>> Future for Bounded<F> {
    type Output = RedisResult<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<RedisResult<T>> {
        let this = self.project();
        Poll::Ready(match ready!(this.call.poll(cx)) {
            Ok(answer) => answer,
            Err(_) => Err(no_answer_in_time(*this.limit)),
        })
    }
}

/// An I/O error, but a timeout, not a dropped connection: a call is sent again on a
/// connection found dropped, and sent again to a server gone silent, it would only
/// double the wait.
fn no_answer_in_time(limit: Duration) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "no answer from Redis in time: gave up after {} ms",
            limit.as_millis()
        ),
    ))
}

/// What a call on a connection found silent and forgotten meanwhile gets: a dropped
/// connection, so that it is sent again, on a new one.
fn connection_gone() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "no answer from Redis on a connection found silent",
    ))
}

/// How many replicas the primary of a lock has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Replicas {
    Everywhere(usize),
    /// On Cluster: the first and last slot of each range, and its primary's replicas.
    PerSlot(Vec<(u16, u16, usize)>),
}

impl Replicas {
    /// The replicas of the primary that serves `key`; for a slot none was listed
    /// with (a node that had just joined answered), the most any primary has.
    pub(crate) fn of(&self, key: &str) -> usize {
        match self {
            Replicas::Everywhere(count) => *count,
            Replicas::PerSlot(ranges) => {
                let slot = slot(key);
                let listed = ranges
                    .iter()
                    .find(|(first, last, _)| (*first..=*last).contains(&slot));
                let most = || ranges.iter().map(|(_, _, count)| *count).max();
                listed.map_or_else(|| most().unwrap_or(0), |(_, _, count)| *count)
            }
        }
    }

    pub(crate) fn any(&self) -> bool {
        match self {
            Replicas::Everywhere(count) => *count > 0,
            Replicas::PerSlot(ranges) => ranges.iter().any(|(_, _, count)| *count > 0),
        }
    }

    /// These counts, none below what `before` counted for the same slots, and
    /// `before`'s for the slots these leave out.
    pub(crate) fn at_least(self, before: &Replicas) -> Replicas {
        match (self, before) {
            (Replicas::Everywhere(now), Replicas::Everywhere(then)) => {
                Replicas::Everywhere(now.max(*then))
            }
            (Replicas::PerSlot(now), Replicas::PerSlot(then)) => {
                let mut ranges: Vec<_> = (now.iter())
                    .map(|&(first, last, count)| {
                        let overlapping = then
                            .iter()
                            .filter(|(from, to, _)| *from <= last && first <= *to);
                        let most = overlapping.map(|(_, _, then)| *then).max();
                        (first, last, count.max(most.unwrap_or(0)))
                    })
                    .collect();
                for &(first, last, count) in then {
                    let left_out = uncovered(first, last, &now);
                    ranges.extend(left_out.into_iter().map(|(from, to)| (from, to, count)));
                }
                ranges.sort_unstable();
                Replicas::PerSlot(ranges)
            }
            (now, _) => now,
        }
    }
}

/// The parts of the slots `first..=last` that no range of `ranges` covers.
fn uncovered(first: u16, last: u16, ranges: &[(u16, u16, usize)]) -> Vec<(u16, u16)> {
    let mut covering: Vec<(u16, u16)> = (ranges.iter())
        .filter(|(from, to, _)| *from <= last && first <= *to)
        .map(|&(from, to, _)| (from, to))
        .collect();
    covering.sort_unstable();
    let (mut parts, mut next) = (Vec::new(), u32::from(first));
    for (from, to) in covering {
        if u32::from(from) > next {
            parts.push((next as u16, from - 1));
        }
        next = next.max(u32::from(to) + 1);
    }
    if next <= u32::from(last) {
        parts.push((next as u16, last));
    }
    parts
}

/// One count, or each range of slots with its count: `slots 0-5460: 1, 5461-16383: 0`.
impl std::fmt::Display for Replicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Replicas::Everywhere(count) => write!(f, "{count}"),
            Replicas::PerSlot(ranges) => {
                f.write_str("slots ")?;
                for (at, (first, last, count)) in ranges.iter().enumerate() {
                    let comma = if at == 0 { "" } else { ", " };
                    write!(f, "{comma}{first}-{last}: {count}")?;
                }
                Ok(())
            }
        }
    }
}

/// A range of slots as `CLUSTER SLOTS` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRange {
    pub(crate) first: u16,
    pub(crate) last: u16,
    /// The address of the primary that serves it.
    pub(crate) primary: String,
    /// How many replicas that primary has.
    pub(crate) replicas: usize,
}

/// Each range of slots of `CLUSTER SHARDS` with how many replicas its shard has:
/// every node listed with it but its primary, failed ones included, and so a
/// primary it failed over from, which comes back as a replica. Redis 7.0 lists that
/// primary apart, with no slots: there a shard listed with no replica counts one
/// while a node listed apart has failed. A shard lists its ranges as first and last
/// slot in turn, and its nodes, each with its health.
fn shard_replicas(shards: Value) -> RedisResult<Vec<(u16, u16, usize)>> {
    let shards: Vec<HashMap<String, Value>> = redis::from_redis_value(shards)?;
    let mut served = Vec::new();
    let mut failed_apart = false;
    for mut shard in shards {
        let slots: Vec<u16> = redis::from_redis_value(shard.remove("slots").unwrap_or(Value::Nil))?;
        let nodes: Vec<HashMap<String, Value>> =
            redis::from_redis_value(shard.remove("nodes").unwrap_or(Value::Nil))?;
        if slots.is_empty() {
            for mut node in nodes {
                let health: Option<String> =
                    redis::from_redis_value(node.remove("health").unwrap_or(Value::Nil))?;
                failed_apart |= health.is_some_and(|health| health != "online");
            }
            continue;
        }
        served.push((slots, nodes.len().saturating_sub(1)));
    }
    let mut ranges = Vec::new();
    for (slots, replicas) in served {
        let replicas = replicas.max(usize::from(failed_apart));
        ranges.extend(
            slots
                .chunks_exact(2)
                .map(|range| (range[0], range[1], replicas)),
        );
    }
    Ok(ranges)
}

/// Every entry of `CLUSTER SLOTS` is the first and last slot, the primary (its host
/// and port first), then each replica.
fn slot_ranges(slots: Value) -> RedisResult<Vec<SlotRange>> {
    let ranges: Vec<Vec<Value>> = redis::from_redis_value(slots)?;
    ranges
        .into_iter()
        .map(|range| {
            let field =
                |values: &[Value], place: usize| values.get(place).cloned().unwrap_or(Value::Nil);
            let primary: Vec<Value> = redis::from_redis_value(field(&range, 2))?;
            let host: String = redis::from_redis_value(field(&primary, 0))?;
            let port: u16 = redis::from_redis_value(field(&primary, 1))?;
            Ok(SlotRange {
                first: redis::from_redis_value(field(&range, 0))?,
                last: redis::from_redis_value(field(&range, 1))?,
                primary: format!("{host}:{port}"),
                replicas: range.len().saturating_sub(3),
            })
        })
        .collect()
}

/// A connection to the Sentinel at `url`, made on first use. A Sentinel has no
/// databases: the URL's is the primary's.
fn to_sentinel(url: &str, config: &ClientConfig) -> RedisResult<Connection> {
    let info = url.into_connection_info()?;
    let settings = info.redis_settings().clone().set_db(0);
    let sentinel = open(info.set_redis_settings(settings), config)?;
    Ok(Connection::Own(Reconnecting::commands(
        Source::Server(Box::new(sentinel)),
        config,
    )))
}

/// The replicas connected to the primary now, from `ROLE`.
async fn connected_replicas(connection: &mut Connection) -> RedisResult<usize> {
    let role: Vec<Value> = connection.query(&redis::cmd("ROLE")).await?;
    match role.get(2) {
        Some(Value::Array(replicas)) => Ok(replicas.len()),
        _ => Ok(0),
    }
}

/// How many replicas `sentinel` lists for `primary`.
async fn sentinel_replicas(sentinel: &mut Connection, primary: &str) -> RedisResult<usize> {
    let mut replicas = redis::cmd("SENTINEL");
    replicas.arg("REPLICAS").arg(primary);
    let replicas: Vec<Value> = sentinel.query(&replicas).await?;
    Ok(replicas.len())
}

impl Connection {
    /// Has the next call ask the Sentinels again which primary to reach, if this
    /// connection reached one through them at least a second ago. A primary they
    /// failed over from while it lived on answers as a primary until they demote it,
    /// seconds later, and a connection made before the failover stays with it.
    pub(crate) fn ask_sentinels_again(&self) {
        const SETTLED: Duration = Duration::from_secs(1);
        if let Connection::Own(own) = self
            && matches!(own.shared.source, Source::Sentinel(_))
        {
            let mut slot = own.write_slot();
            if slot.made_at.is_some_and(|at| at.elapsed() >= SETTLED) {
                slot.current = None;
            }
        }
    }

    /// The server this connection's requests go to now, when it is our own and
    /// connected.
    pub(crate) fn reached(&self) -> Option<ConnectionAddr> {
        let Connection::Own(own) = self else {
            return None;
        };
        let slot = own.read_slot();
        slot.current.as_ref().and(slot.reached.clone())
    }

    /// `cmd`'s answer, as `query_async` would give it. On our own connection the
    /// request is not boxed (`ConnectionLike` boxes every request): the caller's future
    /// holds it, which spares the everyday acquire and release an allocation each.
    pub(crate) async fn query<T: FromRedisValue>(&mut self, cmd: &Cmd) -> RedisResult<T> {
        let answer = match self {
            Connection::Own(own) => own.request(cmd).await,
            connection => connection.req_packed_command(cmd).await,
        };
        Ok(redis::from_redis_value(answer?.extract_error()?)?)
    }

    /// How many replicas serve each range of slots, by `CLUSTER SHARDS`, which lists
    /// a replica the other nodes flag failed, and a primary failed over from:
    /// `CLUSTER SLOTS` leaves both out, and a client that counted by it while one was
    /// down would wait for none there for its life, and grant unconfirmed.
    pub(crate) async fn shard_replicas(&mut self) -> RedisResult<Vec<(u16, u16, usize)>> {
        let mut shards = redis::cmd("CLUSTER");
        shards.arg("SHARDS");
        shard_replicas(self.asked_of_every_node(shards).await?)
    }

    /// On a Cluster, the slot ranges as the nodes list them now.
    pub(crate) async fn slot_ranges(&mut self) -> RedisResult<Vec<SlotRange>> {
        let Connection::Cluster(link) = self else {
            return Err(not_a_cluster());
        };
        listed_slots(&mut link.current(), link.limit()).await
    }

    /// The first answer to `question`, asked of every node of a Cluster.
    async fn asked_of_every_node(&mut self, question: redis::Cmd) -> RedisResult<Value> {
        let Connection::Cluster(link) = self else {
            return Err(not_a_cluster());
        };
        first_answer(&mut link.current(), link.limit(), question).await
    }

    /// Sends `pipeline` whole, over one connection, to the primary that serves `key`.
    /// On a Cluster, where a `MOVED` or `ASK` comes back among its answers, redis-rs
    /// sends it whole again to the node named; wherever it lands, its commands stay
    /// together on one connection.
    pub(crate) async fn pipeline_on_primary_of(
        &mut self,
        key: &[u8],
        pipeline: Pipeline,
    ) -> RedisResult<Vec<Value>> {
        let count = pipeline.len();
        let Connection::Cluster(link) = self else {
            return self.req_packed_commands(&pipeline, 0, count).await;
        };
        let primary = SingleNodeRoutingInfo::SpecificNode(Route::with_key(key, SlotAddr::Master));
        link.request(async move |cluster| cluster.route_pipeline(pipeline, 0, count, primary).await)
            .await
    }

    pub(crate) async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Connection::Own(own) => own.current().await?.link.subscribe(channel).await,
            Connection::Manager { manager, .. } => manager.subscribe(channel).await,
            Connection::Cluster(link) => {
                link.request(async move |cluster| cluster.ssubscribe(channel).await)
                    .await
            }
        }
    }

    pub(crate) async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Connection::Own(own) => own.current().await?.link.unsubscribe(channel).await,
            Connection::Manager { manager, .. } => manager.unsubscribe(channel).await,
            Connection::Cluster(link) => link.current().sunsubscribe(channel).await,
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Own(own) => own.req_packed_command(cmd),
            Connection::Manager { manager, limit } => {
                Box::pin(bounded(*limit, manager.req_packed_command(cmd)))
            }
            Connection::Cluster(link) => {
                Box::pin(link.request(async |cluster| cluster.req_packed_command(cmd).await))
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Own(own) => own.req_packed_commands(pipeline, offset, count),
            Connection::Manager { manager, limit } => Box::pin(bounded(
                *limit,
                manager.req_packed_commands(pipeline, offset, count),
            )),
            Connection::Cluster(link) => Box::pin(link.request(async move |cluster| {
                cluster.req_packed_commands(pipeline, offset, count).await
            })),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Own(own) => own.get_db(),
            Connection::Manager { manager, .. } => manager.get_db(),
            Connection::Cluster(link) => link.current().get_db(),
        }
    }
}

/// A connection to one server, or to the primary that Sentinel names now. When it
/// stops answering, or its server turns read-only (a demoted primary), the next call
/// connects again, asking Sentinel where. Lighter than a `ConnectionManager` on
/// every call: no shared future to clone, and the connection's own, not boxed twice;
/// for requests, our own `Pipe` unless the server is reached over TLS.
///
/// Its requests are bounded without a timer each: a connection that has answered
/// nothing for the bound while a request waited has its waiting requests given up on
/// (`watch`), which then probe it as a caller that gives up does.
#[derive(Clone)]
pub(crate) struct Reconnecting {
    shared: Arc<ReconnectingShared>,
}

struct ReconnectingShared {
    source: Source,
    /// How redis-rs' connection is made, where ours is not: over TLS, or for pushes.
    config: AsyncConnectionConfig,
    /// Whether the connections carry only requests, which ours can.
    requests_only: bool,
    connect_timeout: Duration,
    /// How long a request, or a connection's silence while one waits, may last.
    limit: Duration,
    /// Whether a probe is out to learn whether the connection still answers.
    probing: AtomicBool,
    /// Read by every call, written only to connect again: a reader is never kept
    /// waiting by another, even one whose thread is preempted while it reads.
    slot: RwLock<Slot>,
    /// Held while connecting, so that the calls that find no connection make one;
    /// it keeps the last attempt's failure.
    connecting: Arc<tokio::sync::Mutex<Option<FailedConnect>>>,
}

/// After a connect fails, the calls that find no connection fail at once, with what
/// it said, until this long has passed since: a client whose server is down, or whose
/// Sentinels name a dead one, tries to connect this often at most, not once per call
/// (each try through Sentinel asks every Sentinel, which one busy client did a
/// thousand times a second while they were failing the primary over).
pub(crate) const RECONNECT_EVERY: Duration = Duration::from_millis(100);

/// A connect that failed: when, and what it said.
struct FailedConnect {
    at: Instant,
    error: String,
}

impl FailedConnect {
    /// The error for a call that found no connection within `RECONNECT_EVERY` of
    /// this failure.
    fn again(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "not connected",
            format!(
                "the last try to connect, {} ms ago, failed ({}); it is tried again every {} ms at most",
                self.at.elapsed().as_millis(),
                self.error,
                RECONNECT_EVERY.as_millis()
            ),
        ))
    }
}

#[derive(Default)]
struct Slot {
    /// How many connections were made.
    made: u64,
    /// The one calls take now.
    current: Option<Made>,
    /// When `current` was made.
    made_at: Option<Instant>,
    /// Where `current` was made to.
    reached: Option<ConnectionAddr>,
    /// Through Sentinel, how many switches of primary they had announced when the
    /// Sentinels were asked for `current`.
    switches: u64,
}

/// A connection made, numbered so that a call that fails on it forgets it and none
/// made since: calls cut off together connect again once.
#[derive(Clone)]
struct Made {
    number: u64,
    link: Link,
    traffic: Arc<Traffic>,
}

/// A connection made: ours, or redis-rs' where ours cannot go.
#[derive(Clone)]
enum Link {
    Pipe(Pipe),
    Redis(MultiplexedConnection),
}

impl Link {
    /// `cmd`'s answer, a refusal included, but for a demoted primary's: that one is
    /// the connection's error, which has it forgotten.
    async fn send(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        let answer = match self {
            Link::Pipe(pipe) => pipe.send(cmd).await,
            Link::Redis(connection) => connection.send_packed_command(cmd).await,
        };
        let answer = answer?;
        match demoted(&answer) {
            Some(refusal) => Err(refusal),
            None => Ok(answer),
        }
    }

    /// `pipeline`'s answers, refusals included, but for a demoted primary's, as `send`.
    async fn send_many(
        &mut self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let answers = match self {
            Link::Pipe(pipe) => pipe.send_many(pipeline, offset, count).await?,
            Link::Redis(connection) => {
                connection
                    .send_packed_commands(pipeline, offset, count)
                    .await?
            }
        };
        match answers.iter().find_map(demoted) {
            Some(refusal) => Err(refusal),
            None => Ok(answers),
        }
    }

    fn db(&self) -> i64 {
        match self {
            Link::Pipe(pipe) => pipe.db(),
            Link::Redis(connection) => connection.get_db(),
        }
    }

    async fn subscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Link::Redis(connection) => connection.subscribe(channel).await,
            Link::Pipe(_) => Err(not_a_subscriber()),
        }
    }

    async fn unsubscribe(&mut self, channel: &str) -> RedisResult<()> {
        match self {
            Link::Redis(connection) => connection.unsubscribe(channel).await,
            Link::Pipe(_) => Err(not_a_subscriber()),
        }
    }
}

/// A demoted primary's refusal (`READONLY`), as the connection's error.
fn demoted(answer: &Value) -> Option<RedisError> {
    match answer {
        Value::ServerError(refusal) if refusal.kind() == Some(ServerErrorKind::ReadOnly) => {
            Some(refusal.clone().into())
        }
        _ => None,
    }
}

fn not_a_subscriber() -> RedisError {
    RedisError::from((
        ErrorKind::InvalidClientConfig,
        "a connection for requests does not subscribe",
    ))
}

/// The requests on one connection, counted so that its watcher tells a silent
/// connection from an idle one: while a request waits, a live connection answers
/// something within the bound, since answers come back in the order sent.
#[derive(Default)]
struct Traffic {
    sent: AtomicU64,
    answered: AtomicU64,
    abandoned: AtomicU64,
    /// Tells the requests waiting that the connection went silent.
    silent: Notify,
}

/// Where a `Reconnecting` connects to.
enum Source {
    Server(Box<Client>),
    Sentinel(Arc<NamedPrimary>),
}

impl Reconnecting {
    /// For the lock's commands. No response timeout of redis-rs' own: a timer per
    /// request, armed inside redis-rs, cost the everyday pair more than any other one
    /// thing, and woke a parked runtime thread for almost every request.
    fn commands(source: Source, config: &ClientConfig) -> Reconnecting {
        let connecting = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(config.connect_timeout))
            .set_response_timeout(None);
        Self::new(source, connecting, config, true)
    }

    /// Connections made with `connecting` where redis-rs' are: over TLS, or, unless
    /// they carry only requests, everywhere.
    fn new(
        source: Source,
        connecting: AsyncConnectionConfig,
        config: &ClientConfig,
        requests_only: bool,
    ) -> Reconnecting {
        Reconnecting {
            shared: Arc::new(ReconnectingShared {
                source,
                config: connecting,
                requests_only,
                connect_timeout: config.connect_timeout,
                limit: config.command_timeout,
                probing: AtomicBool::new(false),
                slot: RwLock::default(),
                connecting: Arc::default(),
            }),
        }
    }

    async fn current(&self) -> RedisResult<Made> {
        let current = self.usable();
        match current {
            Some(made) => Ok(made),
            // Boxed: connecting is rare, and its state would weigh on every call.
            None => Box::pin(bounded(self.shared.limit, self.connect())).await,
        }
    }

    /// Sends `cmd` on the current connection and waits for its answer, or until the
    /// connection is found silent.
    async fn request(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.on_current(async |link| link.send(cmd).await).await
    }

    /// What `send` sends on the current connection, or an error once the connection
    /// is found silent.
    async fn on_current<T>(
        &self,
        send: impl AsyncFnOnce(&mut Link) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let Made {
            number,
            mut link,
            traffic,
        } = self.current().await?;
        // Before the request counts as waiting: the watcher's word is then not missed.
        let silent = pin!(traffic.silent.notified());
        let mut awaiting = self.awaiting(number, &traffic);
        let answer = pin!(send(&mut link));
        let answer = match unless_silent(answer, silent, self.shared.limit).await {
            Ok(answer) => answer,
            // Found silent before, and forgotten since: sent again, a request goes
            // to a new connection, where it may well be answered.
            Err(_) if !self.is_current(number) => return Err(connection_gone()),
            Err(silent) => return Err(silent),
        };
        awaiting.answered = true;
        self.check(answer, number)
    }

    /// Connects on a task of its own, which ends within the bound: a caller that stops
    /// waiting (a `JoinSet` of questions to Sentinels dropped once one answered)
    /// would otherwise drop a connection half made, and the next call make another.
    async fn connect(&self) -> RedisResult<Made> {
        let mut failed = self.shared.connecting.clone().lock_owned().await;
        if let Some(made) = self.usable() {
            return Ok(made);
        }
        if let Some(failed) = &*failed
            && failed.at.elapsed() < RECONNECT_EVERY
        {
            return Err(failed.again());
        }
        let connecting = self.clone();
        let made = tokio::spawn(async move {
            let at = Instant::now();
            let made = bounded(connecting.shared.limit, connecting.connect_now()).await;
            *failed = made.as_ref().err().map(|error| FailedConnect {
                at,
                error: error.to_string(),
            });
            made
        });
        made.await.unwrap_or_else(|stopped| {
            Err(RedisError::from((
                ErrorKind::Io,
                "connecting stopped",
                stopped.to_string(),
            )))
        })
    }

    /// The connection calls take now, unless the Sentinels have since announced a
    /// switch to another server than the one it reached.
    fn usable(&self) -> Option<Made> {
        let Source::Sentinel(named) = &self.shared.source else {
            return self.read_slot().current.clone();
        };
        let heard = named.switches.heard();
        let slot = self.read_slot();
        let made = slot.current.clone()?;
        if heard == slot.switches {
            return Some(made);
        }
        if !named.switches.led_to(slot.reached.as_ref()) {
            return None;
        }
        drop(slot);
        // At the server announced already: not asked about again for this switch.
        let mut slot = self.write_slot();
        if slot.current.as_ref().map(|current| current.number) == Some(made.number) {
            slot.switches = heard;
        }
        Some(made)
    }

    async fn connect_now(&self) -> RedisResult<Made> {
        let shared = &self.shared;
        let (client, switches) = match &shared.source {
            Source::Server(client) => ((**client).clone(), 0),
            // Counted before asking: a switch announced meanwhile has the connection
            // made again.
            Source::Sentinel(named) => {
                let switches = named.switches.heard();
                (named.client().await?, switches)
            }
        };
        let info = client.get_connection_info();
        let link = if shared.requests_only && Pipe::reaches(info) {
            Link::Pipe(Pipe::connect(info, shared.connect_timeout).await?)
        } else {
            Link::Redis(
                client
                    .get_multiplexed_async_connection_with_config(&shared.config)
                    .await?,
            )
        };
        let traffic = Arc::new(Traffic::default());
        let made = {
            let mut slot = self.write_slot();
            slot.made += 1;
            slot.made_at = Some(Instant::now());
            slot.reached = Some(info.addr().clone());
            slot.switches = switches;
            let made = Made {
                number: slot.made,
                link,
                traffic,
            };
            slot.current = Some(made.clone());
            made
        };
        tokio::spawn(watch(Arc::downgrade(&made.traffic), shared.limit));
        Ok(made)
    }

    fn awaiting<'a>(&'a self, number: u64, traffic: &'a Traffic) -> Awaiting<'a> {
        traffic.sent.fetch_add(1, Ordering::Relaxed);
        Awaiting {
            connection: self,
            number,
            traffic,
            answered: false,
        }
    }

    fn read_slot(&self) -> RwLockReadGuard<'_, Slot> {
        self.shared.slot.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write_slot(&self) -> RwLockWriteGuard<'_, Slot> {
        self.shared.slot.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets connection `number` if `answer` says it is gone (or its server
    /// demoted).
    fn check<T>(&self, answer: RedisResult<T>, number: u64) -> RedisResult<T> {
        if let Err(error) = &answer {
            let demoted = error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly);
            if demoted || error.is_io_error() || error.is_connection_dropped() {
                self.forget(number);
            }
        }
        answer
    }

    fn is_current(&self, number: u64) -> bool {
        let slot = self.read_slot();
        slot.current
            .as_ref()
            .is_some_and(|made| made.number == number)
    }

    /// Forgets the connection calls take now: another to the same server went silent,
    /// and this one likely is too: the next call over it would fail.
    fn forget_current(&self) {
        let current = self.read_slot().current.as_ref().map(|made| made.number);
        if let Some(number) = current {
            self.forget(number);
        }
    }

    /// Forgets connection `number`, unless a newer one has taken its place.
    fn forget(&self, number: u64) {
        let mut slot = self.write_slot();
        if slot
            .current
            .as_ref()
            .is_some_and(|made| made.number == number)
        {
            slot.current = None;
        }
    }

    /// A call on connection `number` was given up on before its answer came: by its
    /// caller, or at its bound because the connection went silent (a peer gone
    /// without a word, a firewall that dropped the flow). The connection has no
    /// response timeout of its own that would tell, so a probe does, one at a time:
    /// a connection that does not answer it within the bound is forgotten. It stays
    /// open until it answers the probe, or fails: what was sent on it before may yet
    /// run, as an extend sent to a paused Redis does, and should.
    ///
    /// The probe is `TIME`, which the README's ACL line allows, where `PING` would
    /// leave denials in `ACL LOG`; any answer, even a refusal, says the connection is
    /// alive.
    fn given_up_on(&self, number: u64) {
        let Some(Made { link, .. }) = self
            .read_slot()
            .current
            .clone()
            .filter(|made| made.number == number)
        else {
            return;
        };
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        if self.shared.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = self.clone();
        runtime.spawn(async move {
            let mut link = link;
            let probe = redis::cmd("TIME");
            let mut answer = pin!(link.send(&probe));
            let answered = tokio::time::timeout(this.shared.limit, &mut answer).await;
            let alive = match &answered {
                Ok(Ok(_)) => true,
                Ok(Err(error)) => error.code().is_some(),
                Err(_unanswered) => false,
            };
            if !alive {
                this.forget(number);
            }
            this.shared.probing.store(false, Ordering::Release);
            drop(this);
            if answered.is_err() {
                let _ = answer.await;
            }
        });
    }
}

/// A call's wait for its answer on connection `number`: dropped before the answer
/// came, it has the connection checked.
struct Awaiting<'a> {
    connection: &'a Reconnecting,
    number: u64,
    traffic: &'a Traffic,
    answered: bool,
}

impl Drop for Awaiting<'_> {
    fn drop(&mut self) {
        if self.answered {
            self.traffic.answered.fetch_add(1, Ordering::Relaxed);
        } else {
            self.traffic.abandoned.fetch_add(1, Ordering::Relaxed);
            self.connection.given_up_on(self.number);
        }
    }
}

/// Gives up on the requests waiting on a connection once it has answered nothing
/// for `limit` while one waited: a paused server, a peer gone without a word, a
/// firewall that dropped the flow. A request waits at most `limit` and a quarter so,
/// and less only when the connection was silent for the whole bound before it.
/// Ends with the connection.
async fn watch(traffic: Weak<Traffic>, limit: Duration) {
    let tick = limit / 4;
    let mut quiet = Duration::ZERO;
    // How many answers had come at the last look, if a request was waiting then.
    let mut waited_at = None;
    loop {
        tokio::time::sleep(tick).await;
        let Some(traffic) = traffic.upgrade() else {
            return;
        };
        let answered = traffic.answered.load(Ordering::Relaxed);
        let finished = answered + traffic.abandoned.load(Ordering::Relaxed);
        let waiting = traffic.sent.load(Ordering::Relaxed) > finished;
        if !waiting || waited_at != Some(answered) {
            quiet = Duration::ZERO;
            waited_at = waiting.then_some(answered);
            continue;
        }
        quiet += tick;
        if quiet >= limit {
            traffic.silent.notify_waiters();
            quiet = Duration::ZERO;
            waited_at = None;
        }
    }
}

/// Once the subscriber's connection drops (its primary died, say), or the Sentinels
/// announce a switch to another primary (the old one may answer on for seconds, and
/// the releases are published on the new one), connects to the primary Sentinel names
/// now and subscribes again to every channel still watched, trying until it can,
/// then wakes the waiters to look again. Ends with the client.
async fn resubscribe_after_drops(
    subscriber: Weak<ReconnectingShared>,
    mut drops: tokio::sync::mpsc::UnboundedReceiver<()>,
    mut switches: watch::Receiver<u64>,
    signals: Arc<Signals>,
) {
    const PAUSE: Duration = Duration::from_millis(100);
    loop {
        tokio::select! {
            dropped = drops.recv() => if dropped.is_none() {
                return;
            },
            // Once the listener has gone, only drops are followed.
            Ok(()) = switches.changed() => {
                let Some(shared) = subscriber.upgrade() else {
                    return;
                };
                if (Reconnecting { shared }).usable().is_some() {
                    continue;
                }
            }
        }
        loop {
            let Some(shared) = subscriber.upgrade() else {
                return;
            };
            let connection = Reconnecting { shared };
            connection.write_slot().current = None;
            if resubscribe(&connection, &signals).await.is_ok() {
                break;
            }
            drop(connection);
            tokio::time::sleep(PAUSE).await;
        }
        signals.notify_all();
    }
}

async fn resubscribe(connection: &Reconnecting, signals: &Signals) -> RedisResult<()> {
    let mut current = connection.current().await?.link;
    for channel in signals.channels() {
        current.subscribe(&channel).await?;
    }
    Ok(())
}

impl ConnectionLike for Reconnecting {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.request(cmd))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.on_current(async move |link| link.send_many(pipeline, offset, count).await))
    }

    fn get_db(&self) -> i64 {
        self.read_slot()
            .current
            .as_ref()
            .map_or(0, |made| made.link.db())
    }
}

/// `answer`, or an error once the connection's watcher finds it silent: left
/// unanswered, the request has the connection probed. Takes both pinned where the
/// request's own future holds them, which is not moved again: moving them costs
/// the everyday request more than waiting on them.
fn unless_silent<T>(
    mut answer: Pin<&mut impl Future<Output = RedisResult<T>>>,
    mut silent: Pin<&mut impl Future<Output = ()>>,
    limit: Duration,
) -> impl Future<Output = RedisResult<RedisResult<T>>> {
    poll_fn(move |cx| match answer.as_mut().poll(cx) {
        Poll::Ready(answer) => Poll::Ready(Ok(answer)),
        Poll::Pending => silent
            .as_mut()
            .poll(cx)
            .map(|()| Err(no_answer_in_time(limit))),
    })
}

/// What a subscriber's connection does with a push: hands it to `signals`.
fn pushed_to(
    signals: Arc<Signals>,
) -> impl Fn(PushInfo) -> Result<(), redis::aio::SendError> + Send + Sync + 'static {
    move |push| {
        on_push(&signals, push);
        Ok(())
    }
}

/// A release or grant message wakes that lock's waiters (`Signals::heard` says
/// when). A dropped connection may have lost messages, so it wakes them all to look
/// again.
fn on_push(signals: &Signals, push: PushInfo) {
    match push.kind {
        PushKind::Message | PushKind::SMessage => {
            if let Some(Value::BulkString(channel)) = push.data.first()
                && let Ok(channel) = std::str::from_utf8(channel)
            {
                let message = match push.data.get(1) {
                    Some(Value::BulkString(message)) => &message[..],
                    _ => &[],
                };
                signals.heard(channel, message);
            }
        }
        PushKind::Disconnection => signals.notify_all(),
        _ => {}
    }
}

fn resp3(client: &Client) -> RedisResult<Client> {
    let info = client.get_connection_info().clone();
    let resp3 = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Client::open(info.set_redis_settings(resp3))
}

/// A client for `server`, trusting the configured certificates if any.
fn open(server: impl IntoConnectionInfo, config: &ClientConfig) -> RedisResult<Client> {
    #[cfg(feature = "tls")]
    if let Some(certificates) = &config.tls_certificates {
        return Client::build_with_tls(server, certificates.clone());
    }
    #[cfg(not(feature = "tls"))]
    let _ = config;
    Client::open(server)
}

/// `node`'s connection info for the server at `host` and `port`: the same
/// credentials, TLS and settings.
fn elsewhere(node: &ConnectionInfo, host: String, port: u16) -> ConnectionInfo {
    let addr = match node.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    node.clone().set_addr(addr)
}

/// What one Sentinel says of the primary: its address, and whether it is failing
/// it over (or a quorum agreed that it is down, which comes first).
#[derive(Clone)]
pub(crate) struct Named {
    pub(crate) ip: String,
    pub(crate) port: u16,
    pub(crate) failing_over: bool,
}

impl Named {
    /// Whether a connection made to `reached` went to the server named.
    pub(crate) fn is_at(&self, reached: Option<&ConnectionAddr>) -> bool {
        match reached {
            Some(ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. }) => {
                (host, *port) == (&self.ip, self.port)
            }
            _ => false,
        }
    }

    /// Whether two answers name the same server.
    pub(crate) fn is_same(&self, other: &Named) -> bool {
        (&self.ip, self.port) == (&other.ip, other.port)
    }
}

/// `SENTINEL MASTER`'s answer: its address is the old primary's until the failover
/// ends, but its flags say from the start that one is under way. A name the Sentinel
/// does not monitor is the caller's setup to fix (`InvalidClientConfig`).
pub(crate) async fn named_by(
    sentinel: &mut impl ConnectionLike,
    primary: &str,
) -> RedisResult<Named> {
    let mut master = redis::cmd("SENTINEL");
    master.arg("MASTER").arg(primary);
    let fields: HashMap<String, String> = match master.query_async(sentinel).await {
        Err(refused)
            if refused
                .detail()
                .is_some_and(|why| why.starts_with("No such master")) =>
        {
            return Err(RedisError::from((
                ErrorKind::InvalidClientConfig,
                "unknown primary name",
                format!(
                    "no Sentinel monitors a primary named `{primary}`; give the name of \
                     its `sentinel monitor` line"
                ),
            )));
        }
        answer => answer?,
    };
    let field = |name: &str| fields.get(name).map(String::as_str).unwrap_or_default();
    let failing_over = field("flags")
        .split(',')
        .any(|flag| flag == "failover_in_progress" || flag == "o_down");
    Ok(Named {
        ip: field("ip").to_owned(),
        port: field("port").parse().unwrap_or(0),
        failing_over,
    })
}

/// The primary the Sentinels name, found again at each connect.
#[derive(Clone)]
pub(crate) struct NamedPrimary {
    /// The name the Sentinels know it by.
    pub(crate) name: String,
    /// Kept open, and shared by every connection made through them and by the
    /// replication rounds: asking again which primary to reach, as a client does
    /// ten times a second while its primary is down, costs each Sentinel a
    /// request, not a connection.
    pub(crate) sentinels: Vec<Connection>,
    /// The first Sentinel URL, with the protocol to speak: the primary takes its
    /// user, password and database, as deployments that protect both with one
    /// password expect, and TLS when it is `rediss://`.
    node: ConnectionInfo,
    config: ClientConfig,
    /// The Sentinels' announcements of a new primary, once listened for.
    pub(crate) switches: Arc<Switches>,
}

impl NamedPrimary {
    fn new(sentinels: &[String], name: &str, config: &ClientConfig) -> RedisResult<NamedPrimary> {
        let first = sentinels
            .first()
            .ok_or_else(|| RedisError::from((ErrorKind::InvalidClientConfig, "no Sentinel URL")))?;
        let named = NamedPrimary {
            name: name.to_owned(),
            sentinels: (sentinels.iter())
                .map(|url| to_sentinel(url, config))
                .collect::<RedisResult<_>>()?,
            node: first.as_str().into_connection_info()?,
            config: config.clone(),
            switches: Arc::default(),
        };
        Ok(named.speaking(ProtocolVersion::RESP2))
    }

    /// Listens on every Sentinel for the switches of primary it announces
    /// (`+switch-master`), until the client goes. A connection that makes no
    /// request a failover would refuse (a waiter that only hears `Busy` from the old
    /// primary's copy of a lock) would otherwise stay with the old primary until
    /// the Sentinels demote it, seconds later.
    fn listen_for_switches(&self) {
        let Ok(runtime) = Handle::try_current() else {
            return;
        };
        let mut client_gone = self.switches.told();
        let mut listening = tokio::task::JoinSet::new();
        for sentinel in &self.sentinels {
            if let Connection::Own(asked) = sentinel {
                let (name, switches) = (self.name.clone(), Arc::downgrade(&self.switches));
                listening.spawn_on(hear_switches(asked.clone(), name, switches), &runtime);
            }
        }
        runtime.spawn(async move {
            // Ends once the client's last connection through the Sentinels has gone,
            // and with it the listening (a dropped `JoinSet` aborts its tasks).
            while client_gone.changed().await.is_ok() {}
            drop(listening);
        });
    }

    /// The same primary, reached speaking `protocol`, through the same Sentinel
    /// connections.
    fn speaking(&self, protocol: ProtocolVersion) -> NamedPrimary {
        let settings = self.node.redis_settings().clone().set_protocol(protocol);
        NamedPrimary {
            node: self.node.clone().set_redis_settings(settings),
            ..self.clone()
        }
    }

    /// Asks every Sentinel at once and takes the first server named that answers
    /// as a primary, or gives up once most have said no. redis-rs takes the
    /// Sentinels' answers in the order they are listed, so one silent Sentinel
    /// listed first held every reconnection after a failover.
    async fn client(self: &Arc<Self>) -> RedisResult<Client> {
        let mut asked = tokio::task::JoinSet::new();
        for index in 0..self.sentinels.len() {
            let named = self.clone();
            asked.spawn(async move { named.named_by(index).await });
        }
        let (mut refusals, mut unreached) = (Vec::new(), None);
        while let Some(answer) = asked.join_next().await {
            match answer {
                Ok(Ok(Ok(primary))) => return Ok(primary),
                Ok(Ok(Err(refused))) => refusals.push(refused),
                Ok(Err(unreachable)) => unreached = Some(unreachable),
                Err(_) => {}
            }
            // Most of them said no: the rest need not be waited for.
            if refusals.len() * 2 > self.sentinels.len() {
                break;
            }
        }
        Err(refusals.pop().or(unreached).unwrap_or_else(|| {
            RedisError::from((ErrorKind::Io, "no Sentinel answered which primary to reach"))
        }))
    }

    /// The primary the Sentinel at `index` names, within the connect and command
    /// timeouts: the outer result says whether the Sentinel answered, the inner one
    /// whether what it named is a primary to reach.
    async fn named_by(&self, index: usize) -> RedisResult<RedisResult<Client>> {
        let within = self.config.connect_timeout + self.config.command_timeout;
        let ask = async {
            let mut sentinel = self.sentinels[index].clone();
            match named_by(&mut sentinel, &self.name).await {
                Ok(named) => Ok(self.primary_at(named).await),
                Err(unreachable) if unreachable.is_io_error() => Err(unreachable),
                Err(refused) => Ok(Err(refused)),
            }
        };
        bounded(within, ask).await
    }

    /// A client for the server a Sentinel named, once it answers `ROLE` as a
    /// primary and the Sentinel is not failing it over: a primary frozen through a
    /// failover answers as one once thawed, with whatever it was sent while frozen.
    async fn primary_at(&self, named: Named) -> RedisResult<Client> {
        let not_yet = |why| Err(RedisError::from((ErrorKind::Io, why)));
        if named.failing_over {
            return not_yet("a Sentinel is failing the primary over");
        }
        let primary = open(elsewhere(&self.node, named.ip, named.port), &self.config)?;
        let mut connection = primary
            .get_multiplexed_async_connection_with_config(&connection_config(&self.config))
            .await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut connection).await?;
        match role.first() {
            Some(Value::BulkString(role)) if role == b"master" => Ok(primary),
            _ => not_yet("the server a Sentinel names is not a primary (a failover under way)"),
        }
    }
}

/// The switches of primary the Sentinels have announced, counted, and the server
/// the last one led to: a connection made through them before it, to another
/// server, asks them again which primary to reach. Each Sentinel announces a switch
/// as it learns of it, so one failover is heard once per Sentinel; a connection
/// made after the first that reached a Sentinel still naming the old primary moves
/// at the next.
#[derive(Default)]
pub(crate) struct Switches {
    heard: AtomicU64,
    to: Mutex<Option<Named>>,
    told: watch::Sender<u64>,
}

impl Switches {
    fn heard(&self) -> u64 {
        self.heard.load(Ordering::Acquire)
    }

    fn announced(&self, to: Named) {
        *self.to.lock().unwrap_or_else(|p| p.into_inner()) = Some(to);
        let heard = self.heard.fetch_add(1, Ordering::AcqRel) + 1;
        self.told.send_replace(heard);
    }

    /// Whether the last switch heard led to `reached`.
    fn led_to(&self, reached: Option<&ConnectionAddr>) -> bool {
        let to = self.to.lock().unwrap_or_else(|p| p.into_inner());
        to.as_ref().is_some_and(|to| to.is_at(reached))
    }

    /// Each switch heard, as it is heard, until these switches are no longer
    /// followed by anything.
    fn told(&self) -> watch::Receiver<u64> {
        self.told.subscribe()
    }
}

/// The longest pause between tries to listen to a Sentinel that is down: a client
/// keeps listening to every Sentinel for its whole life, and one Sentinel down for
/// hours should not be tried ten times a second by every client.
const LISTEN_AGAIN_AT_MOST: Duration = Duration::from_secs(5);

/// How often a client asks each Sentinel it listens to, over that connection, which
/// primary it names. A Sentinel whose host went without a word leaves the connection
/// open and silent: one that leaves the question unanswered for the bound is listened
/// to anew. And an answer naming another server than the Sentinel named before tells
/// of a switch it announced while the client was not listening.
const LISTENING_CHECKED_EVERY: Duration = Duration::from_secs(1);

/// Subscribes to `+switch-master` on the Sentinel `asked` reaches, and counts each
/// switch of the primary `name` it announces, or that its answers show
/// ([`LISTENING_CHECKED_EVERY`]), subscribing again once the connection drops or goes
/// silent: 100 ms later, then twice as long after each try that fails. Silent, it has
/// `asked` connect again too, for the questions it carries: the first would otherwise
/// fail the call that asked it. A Sentinel whose ACL user may not subscribe is left:
/// the connections then follow a failover when a request shows it, as they do
/// without this.
async fn hear_switches(asked: Reconnecting, name: String, switches: Weak<Switches>) {
    const CHANNEL: &str = "+switch-master";
    let Source::Server(sentinel) = &asked.shared.source else {
        return;
    };
    let limit = asked.shared.limit;
    let mut pause = RECONNECT_EVERY;
    // The primary this Sentinel last named, kept from one connection to the next.
    let mut said: Option<Named> = None;
    loop {
        let (pushed, mut pushes) = tokio::sync::mpsc::unbounded_channel();
        let forward = move |push: PushInfo| {
            let _ = pushed.send(push);
            Ok::<(), redis::aio::SendError>(())
        };
        let subscribed = async {
            let connecting = AsyncConnectionConfig::new()
                .set_connection_timeout(Some(limit))
                .set_response_timeout(Some(limit))
                .set_push_sender(forward);
            let mut connection = resp3(sentinel)?
                .get_multiplexed_async_connection_with_config(&connecting)
                .await?;
            connection.subscribe(CHANNEL).await?;
            Ok::<_, RedisError>(connection)
        };
        match bounded(limit * 2, subscribed).await {
            Ok(connection) => {
                pause = RECONNECT_EVERY;
                match listen_on(connection, &mut pushes, &name, &mut said, &switches).await {
                    Listened::Dropped => {}
                    Listened::Silent => asked.forget_current(),
                    Listened::ClientGone => return,
                }
            }
            Err(refused) if refused.code() == Some("NOPERM") => return,
            Err(_) => {}
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(LISTEN_AGAIN_AT_MOST);
    }
}

/// How listening on one connection to a Sentinel ended.
enum Listened {
    Dropped,
    /// A question got no answer: none within the bound, or the connection broke.
    Silent,
    ClientGone,
}

/// Counts the switches of the primary `name` that `connection`'s Sentinel announces
/// (`pushes`) or that its answers show, `said` being what it named last, until the
/// connection drops or goes silent, or the client goes.
async fn listen_on(
    mut connection: MultiplexedConnection,
    pushes: &mut tokio::sync::mpsc::UnboundedReceiver<PushInfo>,
    name: &str,
    said: &mut Option<Named>,
    switches: &Weak<Switches>,
) -> Listened {
    // The first check is at once: it finds a switch made while no connection listened.
    let mut checks = tokio::time::interval(LISTENING_CHECKED_EVERY);
    checks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        let switched = tokio::select! {
            push = pushes.recv() => match push {
                Some(PushInfo { kind: PushKind::Message, data }) => {
                    switch_of(&data, name).inspect(|to| *said = Some(to.clone()))
                }
                Some(PushInfo { kind: PushKind::Disconnection, .. }) | None => {
                    return Listened::Dropped;
                }
                Some(_) => None,
            },
            _ = checks.tick() => match named_by(&mut connection, name).await {
                Ok(named) if !named.failing_over => {
                    let before = said.replace(named.clone());
                    before.filter(|before| !before.is_same(&named)).map(|_| named)
                }
                Err(silent) if silent.is_io_error() => return Listened::Silent,
                _ => None,
            },
        };
        if let Some(to) = switched {
            let Some(switches) = switches.upgrade() else {
                return Listened::ClientGone;
            };
            switches.announced(to);
        }
    }
}

/// The new primary a `+switch-master` message (`<name> <old ip> <old port> <new
/// ip> <new port>`) announces, if it is about the primary `name`.
fn switch_of(message: &[Value], name: &str) -> Option<Named> {
    let Some(Value::BulkString(text)) = message.get(1) else {
        return None;
    };
    let words: Vec<&str> = std::str::from_utf8(text).ok()?.split(' ').collect();
    match words[..] {
        [about, _, _, ip, port] if about == name => Some(Named {
            ip: ip.to_owned(),
            port: port.parse().ok()?,
            failing_over: false,
        }),
        _ => None,
    }
}

/// For a single server's subscriber, which listens and never waits on an answer.
fn manager_config(config: &ClientConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(None)
        .set_number_of_retries(1)
        .set_max_delay(config.command_timeout)
}

fn connection_config(config: &ClientConfig) -> AsyncConnectionConfig {
    AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout))
        .set_response_timeout(Some(config.command_timeout))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_switch_is_read_for_its_own_primary_only() {
        let message = |text: &str| {
            let channel = Value::BulkString(b"+switch-master".to_vec());
            vec![channel, Value::BulkString(text.as_bytes().to_vec())]
        };
        let to = switch_of(&message("orders 10.0.0.1 6379 10.0.0.2 6380"), "orders");
        let to = to.expect("a switch of `orders`");
        assert_eq!((to.ip.as_str(), to.port), ("10.0.0.2", 6380));
        let reached = ConnectionAddr::Tcp("10.0.0.2".to_owned(), 6380);
        assert!(to.is_at(Some(&reached)));
        assert!(!to.is_at(Some(&ConnectionAddr::Tcp("10.0.0.1".to_owned(), 6379))));
        assert!(switch_of(&message("billing 10.0.0.1 6379 10.0.0.2 6380"), "orders").is_none());
        assert!(switch_of(&message("orders 10.0.0.1 6379"), "orders").is_none());
    }

    #[test]
    fn a_recount_never_lowers_what_was_counted_for_a_slot() {
        let everywhere = Replicas::Everywhere(0).at_least(&Replicas::Everywhere(1));
        assert_eq!(everywhere, Replicas::Everywhere(1));
        let added = Replicas::Everywhere(1).at_least(&Replicas::Everywhere(0));
        assert_eq!(added, Replicas::Everywhere(1));
        let before = Replicas::PerSlot(vec![(0, 5460, 1), (5461, 10922, 0), (10923, 16383, 0)]);
        // Slots 5000 to 5460 moved to the second shard, and the third was given a replica.
        let now = Replicas::PerSlot(vec![(0, 4999, 0), (5000, 10922, 0), (10923, 16383, 1)]);
        assert_eq!(
            now.at_least(&before),
            Replicas::PerSlot(vec![(0, 4999, 1), (5000, 10922, 1), (10923, 16383, 1)])
        );
        // A node that had just joined listed only part of the slots.
        let before = Replicas::PerSlot(vec![(0, 5460, 1), (5461, 10922, 0), (10923, 16383, 2)]);
        let partial = Replicas::PerSlot(vec![(100, 6000, 0)]);
        assert_eq!(
            partial.at_least(&before),
            Replicas::PerSlot(vec![
                (0, 99, 1),
                (100, 6000, 1),
                (6001, 10922, 0),
                (10923, 16383, 2)
            ])
        );
        let none = Replicas::PerSlot(Vec::new()).at_least(&before);
        assert_eq!(none, before);
    }

    #[test]
    fn a_slot_listed_with_no_primary_waits_for_as_many_as_any_primary_has() {
        let partial = Replicas::PerSlot(vec![(0, 5460, 0), (5461, 10922, 1)]);
        assert_eq!(partial.of("foo"), 1, "slot 12182");
        assert_eq!(partial.of("foo{hash_tag}"), 0, "slot 2515");
        assert_eq!(Replicas::PerSlot(Vec::new()).of("foo"), 0);
    }

    #[test]
    fn cluster_shards_count_every_replica_failed_or_not_and_a_primary_failed_over_from() {
        let text = |text: &str| Value::BulkString(text.as_bytes().to_vec());
        let node = |role: &str, health: &str| {
            Value::Map(vec![
                (text("port"), Value::Int(7000)),
                (text("role"), text(role)),
                (text("health"), text(health)),
            ])
        };
        let shard = |slots: &[i64], nodes: Vec<Value>| {
            Value::Map(vec![
                (
                    text("slots"),
                    Value::Array(slots.iter().map(|&slot| Value::Int(slot)).collect()),
                ),
                (text("nodes"), Value::Array(nodes)),
            ])
        };
        let shards = Value::Array(vec![
            shard(
                &[0, 5460],
                vec![node("master", "online"), node("replica", "fail")],
            ),
            shard(&[5461, 10922], vec![node("master", "online")]),
            shard(
                &[10923, 12000, 12001, 16383],
                vec![
                    node("master", "online"),
                    node("replica", "online"),
                    node("replica", "loading"),
                ],
            ),
        ]);
        let counted = vec![
            (0, 5460, 1),
            (5461, 10922, 0),
            (10923, 12000, 2),
            (12001, 16383, 2),
        ];
        assert_eq!(shard_replicas(shards).unwrap(), counted);

        // Just after a failover, before the old primary is back as a replica: Redis
        // 7.2 and newer list it in its shard, 7.0 apart, with no slots. A node with
        // no slots that has not failed (added, and not yet given any) is no replica.
        let newer = Value::Array(vec![
            shard(
                &[0, 5460],
                vec![node("master", "online"), node("master", "fail")],
            ),
            shard(
                &[5461, 16383],
                vec![node("master", "online"), node("replica", "online")],
            ),
        ]);
        assert_eq!(
            shard_replicas(newer).unwrap(),
            vec![(0, 5460, 1), (5461, 16383, 1)]
        );
        let older = |apart: &str| {
            Value::Array(vec![
                shard(&[], vec![node("master", apart)]),
                shard(&[0, 5460], vec![node("master", "online")]),
                shard(
                    &[5461, 16383],
                    vec![node("master", "online"), node("replica", "online")],
                ),
            ])
        };
        assert_eq!(
            shard_replicas(older("fail")).unwrap(),
            vec![(0, 5460, 1), (5461, 16383, 1)]
        );
        assert_eq!(
            shard_replicas(older("online")).unwrap(),
            vec![(0, 5460, 0), (5461, 16383, 1)]
        );

        // RESP2 lists each map's keys and values in turn.
        let flat = |pairs: Vec<(Value, Value)>| {
            Value::Array(
                pairs
                    .into_iter()
                    .flat_map(|(key, value)| [key, value])
                    .collect(),
            )
        };
        let shards = Value::Array(vec![flat(vec![
            (
                text("slots"),
                Value::Array(vec![Value::Int(0), Value::Int(16383)]),
            ),
            (
                text("nodes"),
                Value::Array(vec![
                    flat(vec![(text("role"), text("master"))]),
                    flat(vec![
                        (text("role"), text("replica")),
                        (text("health"), text("fail")),
                    ]),
                ]),
            ),
        ])]);
        assert_eq!(shard_replicas(shards).unwrap(), vec![(0, 16383, 1)]);
    }

    #[test]
    fn cluster_slots_give_each_ranges_primary_and_replicas() {
        let node = |port: i64| {
            Value::Array(vec![
                Value::BulkString(b"127.0.0.1".to_vec()),
                Value::Int(port),
                Value::BulkString(b"id".to_vec()),
            ])
        };
        let slots = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node(7000),
                node(7003),
            ]),
            Value::Array(vec![Value::Int(5461), Value::Int(10922), node(7001)]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                node(7002),
                node(7004),
                node(7005),
            ]),
        ]);
        let ranges = slot_ranges(slots).unwrap();
        let listed: Vec<_> = ranges
            .iter()
            .map(|range| {
                (
                    range.first,
                    range.last,
                    range.primary.as_str(),
                    range.replicas,
                )
            })
            .collect();
        assert_eq!(
            listed,
            vec![
                (0, 5460, "127.0.0.1:7000", 1),
                (5461, 10922, "127.0.0.1:7001", 0),
                (10923, 16383, "127.0.0.1:7002", 2)
            ]
        );
        let ranges = ranges
            .into_iter()
            .map(|range| (range.first, range.last, range.replicas));
        let replicas = Replicas::PerSlot(ranges.collect());
        assert_eq!(replicas.of("foo"), 2, "slot 12182");
        assert_eq!(replicas.of("foo{hash_tag}"), 1, "slot 2515");
        assert!(replicas.any());
        let told = "slots 0-5460: 1, 5461-10922: 0, 10923-16383: 2";
        assert_eq!(replicas.to_string(), told);
    }
}
