use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::watch;

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
        channels.remove(channel);
        true
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
