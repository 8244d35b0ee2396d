//! Through Sentinel, a replica's acknowledgement does not prove a grant safe. A
//! primary the Sentinels failed over from can live on (paused past their down-after,
//! then resumed) and answer as a primary until they demote it, and a replica they
//! have not moved to the new primary yet acknowledges what it writes there. So each
//! round that confirms grants also asks every Sentinel which primary it names and
//! whether it is failing that one over. The round sends its questions after the
//! grants it confirms were made: a failover under way by then shows in the answers.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use redis::{ConnectionAddr, RedisError, RedisResult};
use tokio::task::JoinSet;

use super::connection::{Connection, Named, Target, bounded, named_by};
use crate::{ClientConfig, LockError};

pub(crate) struct Sentinels {
    /// The name the Sentinels know the primary by.
    primary: String,
    sentinels: Vec<Sentinel>,
    limit: Duration,
}

struct Sentinel {
    /// Kept open.
    connection: Connection,
    /// Its last question went unanswered: rounds do not wait for it, and ask it again
    /// on the side, one question at a time, until it answers.
    silent: AtomicBool,
    asked_on_the_side: AtomicBool,
}

/// What each Sentinel said of the primary, `None` for one that did not answer.
pub(crate) struct Said(Vec<Option<Named>>);

impl Sentinels {
    /// Through Sentinel, the Sentinels to ask; elsewhere `None`. They are asked at
    /// once, so a silent one costs connecting one command timeout, and is not waited
    /// for by the first round. A Sentinel that refuses the question fails here, where
    /// it is a setup error, and not every confirmation later.
    pub(crate) async fn of(
        target: &Target,
        config: &ClientConfig,
    ) -> Result<Option<Arc<Sentinels>>, LockError> {
        let Target::Sentinel(named) = target else {
            return Ok(None);
        };
        let sentinels = Arc::new(Sentinels {
            primary: named.name.clone(),
            sentinels: named.sentinels.iter().cloned().map(Sentinel::new).collect(),
            limit: config.command_timeout,
        });
        let mut asked = sentinels.question_each(0..sentinels.sentinels.len());
        while let Some(answer) = asked.join_next().await {
            if let Ok((_, Err(refused))) = answer
                && refused.code() == Some("NOPERM")
            {
                return Err(LockError::at_connect(refused));
            }
        }
        Ok(Some(sentinels))
    }

    /// Asks every Sentinel at once, each within the command timeout, and waits for
    /// those not silent: one silent Sentinel would otherwise hold every round for
    /// the whole timeout. Counting it as not answering keeps the majority rule.
    pub(crate) async fn ask(self: &Arc<Self>) -> Said {
        let not_silent = |index: &usize| !self.sentinels[*index].silent.load(Ordering::Relaxed);
        let (heard, silent): (Vec<usize>, Vec<usize>) =
            (0..self.sentinels.len()).partition(not_silent);
        let mut asked = self.question_each(heard);
        for index in silent {
            if !self.sentinels[index]
                .asked_on_the_side
                .swap(true, Ordering::Relaxed)
            {
                let sentinels = self.clone();
                tokio::spawn(async move {
                    let _ = sentinels.question(index).await;
                    sentinels.sentinels[index]
                        .asked_on_the_side
                        .store(false, Ordering::Relaxed);
                });
            }
        }
        let mut said: Vec<Option<Named>> = self.sentinels.iter().map(|_| None).collect();
        while let Some(Ok((index, named))) = asked.join_next().await {
            said[index] = named.ok();
        }
        Said(said)
    }

    /// The Sentinels at `indices`, asked at once.
    fn question_each(
        self: &Arc<Self>,
        indices: impl IntoIterator<Item = usize>,
    ) -> JoinSet<(usize, RedisResult<Named>)> {
        let mut asked = JoinSet::new();
        for index in indices {
            let sentinels = self.clone();
            asked.spawn(async move { (index, sentinels.question(index).await) });
        }
        asked
    }

    /// `SENTINEL MASTER` to the Sentinel at `index`, which is silent from now on if
    /// it cannot be reached or does not answer in time, until it answers.
    async fn question(&self, index: usize) -> RedisResult<Named> {
        let sentinel = &self.sentinels[index];
        let mut connection = sentinel.connection.clone();
        let named = bounded(self.limit, named_by(&mut connection, &self.primary)).await;
        let silent = named.as_ref().is_err_and(RedisError::is_io_error);
        sentinel.silent.store(silent, Ordering::Relaxed);
        named
    }
}

impl Sentinel {
    fn new(connection: Connection) -> Sentinel {
        Sentinel {
            connection,
            silent: AtomicBool::new(false),
            asked_on_the_side: AtomicBool::new(false),
        }
    }
}

/// What the Sentinels' answers say of a server that answered a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// A majority answered, and each names it the primary, failing nothing over.
    Vouched,
    /// A majority answered, and each names one other server, failing nothing over.
    Replaced,
    /// Neither: a failover under way, answers that differ, or too few of them.
    Unsettled,
}

impl Said {
    /// Whether a majority of the Sentinels answered, and each that did names the
    /// primary at `reached` and is not failing it over.
    pub(crate) fn vouch_for(&self, reached: Option<&ConnectionAddr>) -> bool {
        self.verdict_on(reached) == Verdict::Vouched
    }

    pub(crate) fn verdict_on(&self, reached: Option<&ConnectionAddr>) -> Verdict {
        let answered: Vec<&Named> = self.0.iter().flatten().collect();
        let Some(first) = answered.first() else {
            return Verdict::Unsettled;
        };
        let agreed = answered.len() * 2 > self.0.len()
            && answered
                .iter()
                .all(|named| named.is_same(first) && !named.failing_over);
        match (agreed, first.is_at(reached)) {
            (true, true) => Verdict::Vouched,
            (true, false) => Verdict::Replaced,
            (false, _) => Verdict::Unsettled,
        }
    }
}
