//! The one watch primitive of the ZooKeeper backend: read a node's data with a watch, decide,
//! and wait for the watch, again after each change; and what dropping such a wait costs.

use fencelock::backend::Entry;
use fencelock::{Error, Result};
use zookeeper_client as zk;

use crate::error::{self, state_error};
use crate::lifecycle::ZkSession;

// A one-shot watch is awaited as `OneshotWatcher::changed()`; dropping that future before it
// fired removes the watch (zookeeper-client sends RemoveWatches once no other watcher of the
// client is left on the path). Every wait here relies on that: a dropped `lost()` or
// `revoke_requested()` must cost neither a task nor a server watch, even while its node stays.

/// A watch fired by a session event (a terminal state) ends the wait with the session's error.
pub(crate) fn check_session_event(op: &'static str, ev: &zk::WatchedEvent) -> Result<()> {
    if ev.event_type == zk::EventType::Session {
        if let Some(e) = state_error(op, ev.session_state) {
            return Err(e);
        }
    }
    Ok(())
}

/// What a [`ZkSession::watch_data`] does with the node it read.
pub(crate) struct DataWatch<'a, G> {
    /// The operation, for errors.
    pub op: &'static str,
    /// The node read and watched (a data watch, as Curator's recipes use: unlike an exists
    /// watch it leaves nothing behind when the node is gone already).
    pub path: &'a str,
    /// Our own entry, checked in the same round trip as each read but the first: gone (or
    /// re-created), the wait fails with [`Error::EntryVanished`]. Not at the first: the wait
    /// follows a listing that showed it (the enqueue's, or `still_ahead`'s, as the core calls
    /// them), and a contended acquisition would pay one request in six for it; a deletion
    /// since is found by the wait's periodic check, or by the listing at its turn.
    pub own: Option<&'a Entry>,
    /// The outcome once the node is gone.
    pub gone: G,
}

impl ZkSession {
    /// Reads `w.path` with a data watch; `decide` sees its data and stat and ends the wait
    /// (`Some`) or keeps watching (`None`); a change reads it again. Ends with `w.gone` when the
    /// node is gone, or with the error of a session event, a disconnect or a move to another
    /// server (temporary: the caller's retry watches afresh through the new client).
    pub(crate) async fn watch_data<T, G: FnOnce() -> Result<T>>(
        &self,
        w: DataWatch<'_, G>,
        mut decide: impl FnMut(&[u8], &zk::Stat) -> Option<Result<T>>,
    ) -> Result<T> {
        let op = w.op;
        let mut own: Option<&Entry> = None;
        loop {
            let broken = self.broken(op);
            let client = self.client()?;
            // One round trip: our own entry checked (from the second read on), the node read
            // and watched.
            let mine = async {
                match own {
                    Some(own) => Some(client.check_stat(&own.key).await),
                    None => None,
                }
            };
            let (mine, read) = futures::join!(mine, client.get_and_watch_data(w.path));
            drop(client);
            if let (Some(own), Some(mine)) = (own, mine) {
                match mine {
                    Ok(Some(stat)) if stat.czxid as u64 == own.token.get() => {}
                    Ok(_) => {
                        return Err(Error::EntryVanished {
                            key: own.key.clone(),
                        })
                    }
                    Err(e) => return Err(error::map(op, e)),
                }
            }
            let watcher = match read {
                Err(zk::Error::NoNode) => return (w.gone)(),
                Err(e) => return Err(error::map(op, e)),
                Ok((data, stat, watcher)) => match decide(&data, &stat) {
                    Some(outcome) => return outcome,
                    None => watcher,
                },
            };
            // Dropped unfired (the wait given up or broken), the watch is removed: the retry
            // watches afresh.
            tokio::select! {
                ev = watcher.changed() => match ev.event_type {
                    zk::EventType::NodeDeleted => return (w.gone)(),
                    zk::EventType::Session => {
                        check_session_event(op, &ev)?;
                        return Err(error::disconnected(op));
                    }
                    _ => {
                        // Its data changed: read it again, with our own entry this time.
                        own = w.own;
                        continue;
                    }
                },
                err = broken => return Err(err),
            }
        }
    }
}
