use std::fmt;
use std::time::Duration;

/// Everything that can go wrong while taking, holding or releasing a lock.
///
/// Each variant that concerns one lock carries its key, as the caller gave it, so
/// that a log line or an HTTP error body says which lock was at fault.
#[derive(Debug)]
#[non_exhaustive]
#[allow(missing_docs, reason = "the fields' names say what they hold")]
pub enum LockError {
    /// The lock is held by another owner and the caller asked not to wait.
    #[non_exhaustive]
    Busy { key: String },
    /// The lock stayed busy through every allowed attempt or past the deadline.
    #[non_exhaustive]
    Timeout {
        key: String,
        attempts: u32,
        waited: Duration,
    },
    /// The lease ran out or was taken over while the lock was held.
    #[non_exhaustive]
    Lost { key: String },
    /// The caller tried to release or extend a lock it no longer owns.
    #[non_exhaustive]
    NotHeld { key: String },
    /// The key is already held here and `reentrant(false)` forbids taking it again.
    #[non_exhaustive]
    Reentered { key: String },
    /// No client was given and no default client was set.
    #[non_exhaustive]
    NoDefaultClient,
    /// The key cannot name a lock (empty, or too long).
    #[non_exhaustive]
    InvalidKey { key: String, reason: &'static str },
    /// The options contradict each other or are out of range (the key is empty
    /// when the options are a client's, not a lock's).
    #[non_exhaustive]
    InvalidOptions { key: String, reason: String },
    /// Redis could not be reached or answered with an error.
    #[non_exhaustive]
    Backend {
        key: Option<String>,
        source: redis::RedisError,
    },
    /// Fewer Redlock masters than a quorum granted or confirmed the lock.
    #[non_exhaustive]
    Quorum {
        key: String,
        granted: usize,
        needed: usize,
    },
    /// A grant or renewal was not confirmed in time: fewer replicas than the client
    /// requires had it, so a failover could grant the lock again, or, with
    /// `ClientConfig::fsync`, the primary's append-only file did not (`on_disk`), or,
    /// through Sentinel, the Sentinels did not vouch for the primary that made it
    /// (`named_by_sentinels`: a majority of them must answer, each naming that
    /// primary and failing nothing over). A grant is then given back; a renewal
    /// extends nothing the holder counts on.
    #[non_exhaustive]
    Replication {
        key: String,
        acknowledged: usize,
        required: usize,
        on_disk: Option<bool>,
        named_by_sentinels: Option<bool>,
    },
}

impl LockError {
    /// The key of the lock concerned, when there is one.
    pub fn key(&self) -> Option<&str> {
        match self {
            LockError::Busy { key }
            | LockError::Timeout { key, .. }
            | LockError::Lost { key }
            | LockError::NotHeld { key }
            | LockError::Reentered { key }
            | LockError::InvalidKey { key, .. }
            | LockError::InvalidOptions { key, .. }
            | LockError::Quorum { key, .. }
            | LockError::Replication { key, .. } => Some(key),
            LockError::Backend { key, .. } => key.as_deref(),
            LockError::NoDefaultClient => None,
        }
    }

    /// True when another owner holds the lock, so trying again later may succeed.
    pub fn is_contention(&self) -> bool {
        matches!(self, LockError::Busy { .. } | LockError::Timeout { .. })
    }

    pub(crate) fn backend(key: &str, source: redis::RedisError) -> Self {
        LockError::Backend {
            key: Some(key.to_owned()),
            source,
        }
    }

    /// A failure while connecting. A command the ACL user may not run, or a primary
    /// name no Sentinel knows, is the caller's setup to fix, not an outage: it says
    /// what to change.
    pub(crate) fn at_connect(source: redis::RedisError) -> Self {
        let reason = if source.code() == Some("NOPERM") {
            let command = (source.detail())
                .and_then(|detail| detail.split('\'').nth(1))
                .unwrap_or("it");
            format!(
                "the ACL user may not run a command the client needs: {source}; allow \
                 `{command}` to it, as the README's ACL lines do"
            )
        } else if source.kind() == redis::ErrorKind::InvalidClientConfig {
            source.detail().unwrap_or(source.category()).to_owned()
        } else {
            return LockError::Backend { key: None, source };
        };
        LockError::InvalidOptions {
            key: String::new(),
            reason,
        }
    }
}

/// Keys can be up to 64 KiB; messages show the start of long ones.
struct Shown<'a>(&'a str);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const MAX: usize = 120;
        match self.0.char_indices().nth(MAX) {
            None => write!(f, "`{}`", self.0),
            Some((cut, _)) => write!(f, "`{}…` ({} bytes)", &self.0[..cut], self.0.len()),
        }
    }
}

impl fmt::Display for LockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LockError::Busy { key } => write!(f, "lock {} is held by another owner", Shown(key)),
            LockError::Timeout {
                key,
                attempts,
                waited,
            } => write!(
                f,
                "lock {} stayed busy through {attempts} attempts over {} ms",
                Shown(key),
                waited.as_millis()
            ),
            LockError::Lost { key } => write!(
                f,
                "lock {} was lost while held: its lease ran out or was taken over",
                Shown(key)
            ),
            LockError::NotHeld { key } => write!(
                f,
                "lock {} is no longer held by this guard; nothing was changed",
                Shown(key)
            ),
            LockError::Reentered { key } => write!(
                f,
                "lock {} is already held here and `reentrant(false)` forbids taking it again",
                Shown(key)
            ),
            LockError::NoDefaultClient => f.write_str(
                "no lock client: call `lock_runtime::set_default_client` at start-up, or pass `client = \"...\"` to `#[distributed_lock]`",
            ),
            LockError::InvalidKey { key, reason } => {
                write!(f, "invalid lock key {}: {reason}", Shown(key))
            }
            LockError::InvalidOptions { key, reason } if key.is_empty() => {
                write!(f, "invalid options: {reason}")
            }
            LockError::InvalidOptions { key, reason } => {
                write!(f, "invalid options for lock {}: {reason}", Shown(key))
            }
            LockError::Backend { key: Some(key), .. } => write!(
                f,
                "redis request for lock {} failed; check that Redis is up and reachable",
                Shown(key)
            ),
            LockError::Backend { key: None, .. } => {
                f.write_str("redis request failed; check the URL and that Redis is up and reachable")
            }
            LockError::Quorum {
                key,
                granted,
                needed,
            } => write!(
                f,
                "lock {} was granted by {granted} Redis masters of the {needed} it needs; check that a majority is reachable",
                Shown(key)
            ),
            LockError::Replication {
                key,
                acknowledged,
                required,
                on_disk,
                named_by_sentinels,
            } => {
                let mut missing = Vec::new();
                if acknowledged < required {
                    missing.push(format!(
                        "only {acknowledged} of the {required} required replicas had it (check \
                         the replicas' links, or lower `ClientConfig::replicas`: 0 chooses \
                         availability over failover safety)"
                    ));
                }
                if *on_disk == Some(false) {
                    missing.push(
                        "the primary had not written it to its append-only file (run the \
                         primary with `appendfsync always`: under `everysec` a write waits up to \
                         a second for its fsync, under `no` for ever; or raise \
                         `ClientConfig::replica_timeout`)"
                            .to_owned(),
                    );
                }
                if *named_by_sentinels == Some(false) {
                    missing.push(
                        "the Sentinels did not vouch for the primary that made it: one named \
                         another primary or was failing it over, or fewer than a majority \
                         answered (the client asks them for the primary again; try again, and \
                         check that most Sentinels are reachable)"
                            .to_owned(),
                    );
                }
                write!(
                    f,
                    "lock {} was not confirmed in time, so its grant was given back or its \
                     renewal extended nothing: {}",
                    Shown(key),
                    missing.join("; and ")
                )
            }
        }
    }
}

impl std::error::Error for LockError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LockError::Backend { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A Redis error that concerns no one lock, as when connecting.
impl From<redis::RedisError> for LockError {
    fn from(source: redis::RedisError) -> Self {
        LockError::Backend { key: None, source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error;

    #[test]
    fn the_source_is_chained_not_repeated() {
        let source = redis::RedisError::from((redis::ErrorKind::Io, "connection refused"));
        let error = LockError::backend("order:1", source);
        let message = error.to_string();
        assert!(message.contains("`order:1`"), "{message}");
        assert!(!message.contains("refused"), "{message}");
        let chained = error.source().expect("the Redis error is the source");
        assert!(chained.to_string().contains("connection refused"));
    }

    #[test]
    fn messages_are_lowercase_without_a_final_period() {
        let errors = [
            LockError::Busy { key: "k".into() },
            LockError::NoDefaultClient,
            LockError::from(redis::RedisError::from((redis::ErrorKind::Io, "x"))),
        ];
        for error in errors {
            let message = error.to_string();
            assert!(message.starts_with(char::is_lowercase), "{message}");
            assert!(!message.ends_with('.'), "{message}");
        }
    }
}
