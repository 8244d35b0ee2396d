use std::collections::HashMap;
use std::sync::Mutex;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::CLAIM_WINDOW;

/// Said on a waiting client's grant channel when the acquisitions let in ahead of it
/// have the claim window to claim the lock: nothing runs in Redis should they not,
/// so the client looks again once the window has passed (`scripts/holders.lua`).
const LOOK_AGAIN: &[u8] = b"look-again";
/// Said when one of them claimed it: the client need not look again.
const CLAIMED: &[u8] = b"claimed";

/// Release signals by channel: a counter per channel that goes up on each release,
/// watched by the tasks waiting for that lock. Counted references say when a
/// channel is first wanted and when it is no longer wanted.
#[derive(Default)]
pub(crate) struct Signals {
    channels: Mutex<HashMap<String, Signal>>,
}

struct Signal {
    releases: watch::Sender<u64>,
    watchers: usize,
    /// Signals the channel once the claim window of a waiter ahead has passed.
    looking_again: Option<JoinHandle<()>>,
}

impl Signals {
    /// Watches `channel`; true as well when this is its first watcher.
    pub(crate) fn join(&self, channel: &str) -> (watch::Receiver<u64>, bool) {
        let mut channels = self.by_channel();
        let signal = channels
            .entry(channel.to_owned())
            .or_insert_with(|| Signal {
                releases: watch::Sender::new(0),
                watchers: 0,
                looking_again: None,
            });
        signal.watchers += 1;
        (signal.releases.subscribe(), signal.watchers == 1)
    }

    /// Stops one watcher of `channel`; true when it was the last.
    pub(crate) fn leave(&self, channel: &str) -> bool {
        let mut channels = self.by_channel();
        let Some(signal) = channels.get_mut(channel) else {
            return false;
        };
        signal.watchers -= 1;
        if signal.watchers > 0 {
            return false;
        }
        if let Some(signal) = channels.remove(channel) {
            signal.stop_looking_again();
        }
        true
    }

    /// What a message said on `channel`: a release or a grant signals it now, a
    /// waiter ahead let in signals it once its claim window has passed, unless a
    /// claim comes first.
    pub(crate) fn heard(&self, channel: &str, message: &[u8]) {
        let mut channels = self.by_channel();
        let Some(signal) = channels.get_mut(channel) else {
            return;
        };
        signal.stop_looking_again();
        match message {
            LOOK_AGAIN => match Handle::try_current() {
                Ok(runtime) => {
                    let releases = signal.releases.clone();
                    signal.looking_again = Some(runtime.spawn(async move {
                        tokio::time::sleep(CLAIM_WINDOW).await;
                        releases.send_modify(|count| *count += 1);
                    }));
                }
                Err(_) => signal.releases.send_modify(|count| *count += 1),
            },
            CLAIMED => {}
            _ => signal.releases.send_modify(|count| *count += 1),
        }
    }

    pub(crate) fn notify(&self, channel: &str) {
        if let Some(signal) = self.by_channel().get(channel) {
            signal.releases.send_modify(|count| *count += 1);
        }
    }

    /// The channels watched now.
    pub(crate) fn channels(&self) -> Vec<String> {
        self.by_channel().keys().cloned().collect()
    }

    /// Wakes every waiter, as when notifications may have been missed.
    pub(crate) fn notify_all(&self) {
        for signal in self.by_channel().values() {
            signal.releases.send_modify(|count| *count += 1);
        }
    }

    fn by_channel(&self) -> std::sync::MutexGuard<'_, HashMap<String, Signal>> {
        self.channels
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Signal {
    fn stop_looking_again(&self) {
        if let Some(looking_again) = &self.looking_again {
            looking_again.abort();
        }
    }
}
